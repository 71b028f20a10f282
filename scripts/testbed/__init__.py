"""The emulated LAN test bed behind ``scripts/lan_testbed`` (Linux, root only).

``topology`` names the hosts and addresses, ``system`` runs ``ip``/``tc`` and
finds what exists, ``state`` remembers what the test bed made, ``commands``
implements up, down, status, exec and the bench preset, ``cli`` parses the
command line.
"""
