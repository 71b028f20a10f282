"""What travels between coordinator and worker, besides the generated gRPC code (``specwire.v1``).

``protocol`` converts between protocol messages and the library's types and
names the services; ``timing`` holds the timing records both ends and the
bench read; ``auth`` the shared token and its proofs; ``bonjour`` the
service's TXT record; ``echo_frames`` the raw TCP echo the LAN probe times.
"""
