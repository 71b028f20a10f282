"""Predicting whether a worker pays: the performance model and the paper's machines as a profile.

``model`` holds every formula once, over named inputs; ``paper`` holds the
paper's hardware figures and the model's reproduction of its Table 11.
"""
