"""Predicting whether a worker pays: the performance model and the paper's machines as a profile.

``model`` holds every formula once, over named inputs; ``profile`` turns a
hardware profile into its inputs, ``measured`` measures this set-up into
one, and ``from_bench`` reads one from a bench run; ``setups`` predicts
every set-up a coordinator can decode with (what ``--draft auto`` ranks);
``prespec`` and ``ceiling`` model what a worker drafts ahead, ``pair`` how
well a pair agrees; ``paper`` reproduces the paper's Table 11 and
``against_profile`` checks a paced bench against its profile.
"""
