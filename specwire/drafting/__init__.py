"""A draft model against its KV cache, and drafting ahead.

``drafter`` runs a draft model for one session (``Drafter``, a block of
drafts being made, ``Drafting``, and a finished one, ``draft_block``);
``sampling`` holds the target's and the draft's distributions and how a
token is chosen; ``choices`` ranks a pass's likeliest tokens; ``rollback``
keeps states to roll a cache with recurrent layers back; ``speculation``
(the next round's branches), ``branch_batch`` (branches side by side in one
pass) and ``draft_tree`` (one tree of continuations across rounds) draft
ahead; ``warmup`` runs each pass's shapes once before anything is timed.
"""
