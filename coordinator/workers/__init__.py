"""Reaching workers: finding them, connecting, choosing, and the errors of talking to them.

``discovery`` browses Bonjour; ``connection`` opens a channel and says
Hello; ``selection`` decides which workers can draft for a target and picks
among them; ``credentials`` holds the shared token and TLS; ``stream_call``
is the bidirectional stream both remote backends run on; ``errors`` turns
gRPC failures into clear errors; ``netprobe`` measures the link.
"""
