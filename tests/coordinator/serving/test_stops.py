"""Stop sequences over text that arrives in pieces."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from coordinator.serving.stops import StopMatcher

ALPHABET = "ab\n "


def feed_all(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out = "".join(matcher.feed(p) for p in pieces)
    return (out if matcher.stopped else out + matcher.flush()), matcher.stopped


@given(
    pieces=st.lists(st.text(ALPHABET, max_size=5), max_size=12),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=4),
)
@example(pieces=["ba", "b"], stops=["a", "bab"])  # a short stop seen while a longer, earlier one may grow
def test_output_is_the_text_up_to_the_first_stop(pieces: list[str], stops: list[str]) -> None:
    text = "".join(pieces)
    starts = [i for i in (text.find(s) for s in stops) if i >= 0]
    out, stopped = feed_all(tuple(stops), pieces)
    assert stopped == bool(starts)
    assert out == (text[: min(starts)] if starts else text)


def test_a_stop_split_over_pieces_is_found_and_nothing_after_it_is_sent() -> None:
    matcher = StopMatcher(("END",))
    assert matcher.feed("one E") == "one "  # "E" might begin "END": held back
    assert matcher.feed("N") == ""
    assert matcher.feed("D and more") == "" and matcher.stopped
    assert matcher.feed("later") == ""


def test_held_text_that_does_not_become_a_stop_is_released() -> None:
    matcher = StopMatcher(("END",))
    assert matcher.feed("an E") == "an "
    assert matcher.feed("gg") == "Egg" and not matcher.stopped
    assert matcher.feed("EN") == "" and matcher.flush() == "EN"


def test_without_stops_everything_passes() -> None:
    matcher = StopMatcher(())
    assert matcher.feed("abc") == "abc" and matcher.flush() == ""
