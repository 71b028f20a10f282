"""``settle_heap`` keeps the collector off the timed path without keeping garbage alive."""

from __future__ import annotations

import gc
import weakref

from specwire.process.memory import settle_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """Two nodes that refer to each other, reachable from nothing once this returns: a weak reference
    to one of them."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_what_was_alive_is_frozen_and_a_cycle_frozen_then_dropped_is_collected_by_the_next_call() -> None:
    try:
        kept = _Node()
        kept.other = kept
        dropped = _Node()
        dropped.other = dropped  # alive at the first call, so frozen with the rest
        watched = weakref.ref(dropped)
        settle_heap()
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert watched() is not None  # frozen: no collection reaches it
        del dropped
        gc.collect()
        assert watched() is not None  # a frozen cycle outlives its last reference
        settle_heap()
        assert watched() is None  # the next call collects it before freezing again
        garbage = _cycle()
        gc.collect()
        assert garbage() is None  # what is made after a call is collected as usual
        assert kept.other is kept
    finally:
        gc.unfreeze()
