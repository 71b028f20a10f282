"""Drafting ahead (pre-speculation): a worker drafts for the target's likely verdicts while it verifies.

``speculation`` drafts the next round's branches, by the settings and bounds of
``prespec_config`` (kept apart so that a worker's flags read them without loading
mlx-lm); ``branch_batch`` drafts branches side by side in one pass; ``draft_tree``
keeps one tree of continuations across rounds (T = 0), its nodes as arrays
(``tree_table``) and their KV and recurrent states in one arena (``tree_arena``).
"""
