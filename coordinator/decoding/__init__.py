"""Speculative decoding on the target: the engine, acceptance, and rolling back.

``engine`` runs rounds (draft, verify, accept) against any draft source (a
steering one, the drafting policy, also chooses each round's k);
``acceptance`` holds the greedy and exact rejection-sampling rules;
``results`` the records of a generation; ``rollback`` drops rejected drafts
from the target's caches. Nothing here knows about workers or command lines.
"""
