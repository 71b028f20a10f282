"""Speculative decoding on the target: the engine, acceptance, and the choice of k.

``engine`` runs rounds (draft, verify, accept) against any draft source;
``acceptance`` holds the greedy and exact rejection-sampling rules;
``results`` the records of a generation; ``fallback`` and ``adaptive_k``
choose k from what the rounds measured. Nothing here knows about workers
or command lines.
"""
