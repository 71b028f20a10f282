"""The per-op baseline, worker side: ``TensorWorker.Execute``, a GGML_RPC-style tensor executor.

``op_walk`` finds the operations of one forward pass in the model's own
modules; ``tensor_session`` is one session's cache and the pass it is walking,
every operation checked before it runs; ``tensor_service`` serves the Execute
stream (``docs/per-op-baseline.md``).
"""
