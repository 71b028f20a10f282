"""The coordinator: everything that runs on the target machine.

It runs the target model, takes drafts from a draft source (local, or
remote workers), verifies them, and measures the whole thing. Packages:
``decoding`` (the engine), ``drafting`` (draft sources and the one factory
that builds them), ``workers`` (finding and reaching workers), ``bench``
(the bench's machinery), ``planning`` (the performance model),
``serving`` (the OpenAI-compatible HTTP API) and ``commands`` (the command
line). Loose
modules: ``cli``, ``runtime`` (threads and event loop), ``prompts`` and
``attribution``.
"""
