"""The GGML_RPC-style per-op baseline, coordinator side.

The coordinator holds the draft model's compute graph (``graph``, the walk
the worker announces), sends its
operations to the worker's tensor executor one request/response at a time
(``client``), stands in for the draft model so the shared drafter can drive
it (``model``), and offers it to the engine as a draft source (``source``).
"""
