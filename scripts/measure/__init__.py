"""Measurements whose figures are in docs/: each module's docstring names the section its figure feeds.

The tools a user runs (the demo, the test bed, the link probe, the delay relay, the soak, the serve
sessions) stay in ``scripts/``; these are run to reproduce a figure. Each runs as
``python scripts/measure/NAME.py``.
"""
