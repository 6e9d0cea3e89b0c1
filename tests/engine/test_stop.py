"""StopChecker: never emit a stop string, nor a tail that may still become one."""

from __future__ import annotations

from calculet.engine.stop import StopChecker


def feed(checker: StopChecker, deltas: list[str]) -> tuple[str, bool]:
    out, stopped = "", False
    for d in deltas:
        text, stopped = checker.push(d)
        out += text
        if stopped:
            return out, True
    return out + checker.flush(), False


def test_stop_split_across_deltas_is_never_emitted():
    assert feed(StopChecker(("END",)), ["Hello E", "N", "D and more"]) == ("Hello ", True)


def test_held_tail_is_released_when_it_does_not_complete():
    checker = StopChecker(("END",))
    assert checker.push("Hello EN") == ("Hello ", False)
    assert checker.push("Xtra") == ("ENXtra", False)


def test_tail_held_until_flush_at_the_end():
    assert feed(StopChecker(("\n\n",)), ["a line\n"]) == ("a line\n", False)


def test_earliest_of_several_stops_wins():
    assert feed(StopChecker(("world", "lo w")), ["hello world"]) == ("hel", True)


def test_stop_at_the_very_start():
    assert feed(StopChecker(("ab",)), ["a", "b", "c"]) == ("", True)


def test_no_stops_passes_through():
    checker = StopChecker(())
    assert checker.push("abc") == ("abc", False)


def test_overlapping_prefix_keeps_longest_possible_start():
    """'aab' must be found in 'aaab' even though the held tail 'aa' first looked like a start."""
    assert feed(StopChecker(("aab",)), ["a", "a", "a", "b"]) == ("a", True)


def test_multibyte_text():
    assert feed(StopChecker(("。",)), ["東京は", "日本の首都です", "。 😀"]) == ("東京は日本の首都です", True)
