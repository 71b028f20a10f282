"""The running worker (``worker serve``) and what its services share.

``serve`` holds the command's flags and ``server`` the worker itself (loaded only
when serve runs): the model, warmed and timed (``speed``), the gRPC server with
both backends, announced over Bonjour (``advertise``). ``hosting`` is what both
backends share (admission, the read loop, shutdown), ``peer`` the check both
make when a session opens (the coordinator's protocol version and vocabulary
fingerprint), and ``status`` the one mapping of domain errors to gRPC status
codes; ``auth`` checks the shared token on every call; ``echo`` is the raw TCP
echo the link probe times; ``log_file`` is the rotated log ``--log-file`` writes.
"""
