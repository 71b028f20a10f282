"""Predicting whether a worker pays: the performance model and the paper's machines as a profile.

``model`` holds every formula once, over named inputs; ``profile`` turns a
hardware profile into its inputs, and ``measured`` measures this set-up into
one; ``setups`` predicts every set-up a coordinator can decode with (what
``--draft auto`` ranks) and ``planner`` chooses by it; ``pair`` measures how
well a pair agrees. ``ahead`` models what workers draft ahead and trees
verified in one pass; ``validation`` holds the model against runs (the
paper's Table 11, a paced bench, any bench).
"""
