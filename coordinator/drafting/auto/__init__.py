"""``--draft auto``: the drafting policy, which decodes with the set-up predicted fastest and re-decides
as rounds are measured.

``policy`` is the draft source the engine drives (``AutoDraftSource``): what it
chooses, learns and moves to, and why. ``moves`` owns the sessions it moves
between in one generation (opened ahead, kept on this machine, lost);
``tries`` judges its tries against the set-up they left, measured on both
sides of them; ``window`` holds the rounds it measures the current set-up
over; ``expected`` turns what was measured into each set-up's tok/s now;
``report`` is what a generation reports (its moves, and the rounds each
set-up served). The planner it chooses by is ``coordinator.planning``.
"""
