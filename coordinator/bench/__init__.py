"""The bench's machinery: AR, local SD and remote SD over each backend and worker, in one run.

``plan`` decides the rows and what each drafts with, ``runner`` measures
them (interleaved, so every row sees the same machine state), ``summary``
turns the raw runs into the figures of a row, ``report`` prints them,
``record`` writes the JSON, ``plot`` draws them, ``progress`` shows how far
it got. The command itself is ``coordinator.commands.bench``.
"""
