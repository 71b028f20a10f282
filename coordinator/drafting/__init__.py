"""Draft sources: where the engine gets its drafts, and the one place they are built.

``base`` defines the interface the engine speaks; ``local`` drafts on this
machine; ``stream`` on a worker over the stream protocol, ``ggml_rpc`` over
the per-op baseline; ``fill`` finishes a worker's short tree answer with
the local draft model; ``auto`` chooses among set-ups as it measures them;
``failover`` survives the loss of a worker. ``factory`` turns a description of what to
draft with (``DraftSpec``) into a source: every command builds its sources
there.
"""
