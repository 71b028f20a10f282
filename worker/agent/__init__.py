"""The agent that keeps ``worker serve`` running: a launchd agent (macOS) or a systemd user unit (Linux).

``agent`` writes its file and ``agent_control`` asks the service manager to
load, start and stop it; ``serve_flags`` checks the serve flags it runs with and
reads them back; ``port_holder`` finds who holds a port it needs. One module per
command: ``install``, ``uninstall``, ``start``, ``stop`` and ``agent_status``
(``worker status``).
"""
