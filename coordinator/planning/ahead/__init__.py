"""Drafting ahead, predicted: what workers draft before the verdict comes back, and trees verified.

``prespec`` models one round ahead (which branches a worker drafts before the
verdict, and fill mode as a chain over the drafts served); ``ceiling`` is the
Monte Carlo of workers drafting a tree ahead, the most drafting off the critical
path can give; ``tree_verify`` predicts trees verified in one target pass (local
tree SD in closed form, a worker's tree on the ceiling's tree).
"""
