"""The performance model held against runs: the paper's Table 11, a paced bench, any bench.

``paper`` reproduces Table 11 from the built-in profile; ``against_profile``
checks every row of a bench that emulated a profile against that profile's
prediction (``plan --check-bench``); ``from_bench`` takes the model's inputs from
one bench run and predicts its every row (``plan --from-bench``).
"""
