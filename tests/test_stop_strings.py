import random

import pytest

from pyengine.stop_strings import StopStringMatcher


def run(matcher, deltas):
    emitted, matched = "", None
    for delta in deltas:
        text, matched = matcher.feed(delta)
        emitted += text
        if matched is not None:
            return emitted, matched
    return emitted + matcher.flush(), None


def test_no_stop_strings_passes_text_through():
    matcher = StopStringMatcher([])
    assert matcher.feed("abc") == ("abc", None)


def test_match_inside_one_delta_truncates():
    assert StopStringMatcher(["STOP"]).feed("abcSTOPdef") == ("abc", "STOP")


def test_include_stop_string():
    assert StopStringMatcher(["STOP"], include_stop_str_in_output=True).feed("abcSTOPdef") == (
        "abcSTOP",
        "STOP",
    )


def test_possible_prefix_is_held_back_then_released():
    matcher = StopStringMatcher(["<|end|>"])
    assert matcher.feed("hello <") == ("hello ", None)
    assert matcher.feed("|en") == ("", None)
    assert matcher.feed("d> no") == ("<|end> no", None)  # "<|end>" is not "<|end|>"
    assert matcher.flush() == ""


def test_match_across_deltas():
    matcher = StopStringMatcher(["<|end|>"])
    assert matcher.feed("hi <|") == ("hi ", None)
    assert matcher.feed("end|> trailing") == ("", "<|end|>")
    assert matcher.feed("more") == ("", None)  # over after a match


def test_flush_releases_held_text_at_the_end():
    matcher = StopStringMatcher(["END"])
    assert matcher.feed("the EN") == ("the ", None)
    assert matcher.flush() == "EN"


def test_first_completed_stop_wins():
    # "cd" completes before "bcde" would, though "bcde" starts earlier.
    assert StopStringMatcher(["bcde", "cd"]).feed("abcdef") == ("ab", "cd")
    # Ending at the same place: the one starting first is the one a reader sees.
    assert StopStringMatcher(["c", "abc"], include_stop_str_in_output=True).feed("xabcz") == (
        "xabc",
        "abc",
    )


def test_hold_back_uses_the_longest_partial_suffix():
    matcher = StopStringMatcher(["aab"])
    assert matcher.feed("xaa") == ("x", None)
    assert matcher.feed("a") == ("a", None)  # "aaa": only "aa" can still start "aab"
    assert matcher.feed("b") == ("", "aab")


def test_invalid_stop():
    with pytest.raises(ValueError):
        StopStringMatcher(["ok", ""])


@pytest.mark.parametrize("seed", range(30))
def test_random_splits_equal_whole_text_search(seed):
    rng = random.Random(seed)
    alphabet = "ab<|>é🙂"
    stops = [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        for _ in range(rng.randint(1, 3))
    ]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    include = rng.random() < 0.5
    # Reference: scan one character at a time for the first completed stop string.
    expected, expected_stop = text, None
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            expected_stop = max(done, key=len)
            start = end - len(expected_stop)
            expected = text[:end] if include else text[:start]
            break
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 8))))
    deltas = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)], strict=True)]
    assert run(StopStringMatcher(stops, include), deltas) == (expected, expected_stop)
