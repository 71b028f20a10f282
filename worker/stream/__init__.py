"""The stream protocol, worker side: ``DraftWorker.Hello`` and ``DraftWorker.Draft``.

``stream_service`` parses each message of a Draft stream and encodes its reply;
``session`` is the one ``DraftSession`` per stream (its drafter, KV cache,
sampler, tree and counters); ``checks`` holds what a session checks before it
touches the model (the peer, the Open, each Round, the pre-speculation it asks
for); ``computed`` what a session's compute hands the stream; ``window`` the
clock a tree session times its passes by.
"""
