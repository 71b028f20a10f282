"""A draft model against its KV cache, and drafting ahead.

``drafter`` runs a draft model for one session (``Drafter``, a block of
drafts being made, ``Drafting``, and a finished one, ``draft_block``);
``sampling`` holds the target's and the draft's distributions and how a
token is chosen; ``choices`` ranks a pass's likeliest tokens; ``rollback``
keeps states to roll a cache with recurrent layers back; ``token_tree`` is a
tree of drafts one verification pass checks; ``prefix_cache`` keeps a prompt
cache across requests (its flags in ``prompt_cache_flags``); ``warmup`` runs
each pass's shapes once before anything is timed. ``ahead`` drafts ahead: the
next round's branches, branches side by side in one pass, and one tree of
continuations across rounds.
"""
