"""The ``coordinator`` commands: each module has ``NAME``, ``HELP``, ``add_arguments`` and ``run``.

``coordinator.cli`` only wires them. ``options`` holds the flags several
commands share and turns them into the objects the rest of the coordinator
takes.
"""
