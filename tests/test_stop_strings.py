import os
import random

import pytest

from pyengine import LLM, SamplingParams
from pyengine.stop_strings import StopStringMatcher

CKPT = os.path.join(os.path.dirname(__file__), "data", "ckpt_text_bf16")


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


def char_by_char(text, stops, include):
    """Reference: read one character at a time; the first stop string to complete wins (the
    longest of those completing at the same character)."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            stop = max(done, key=len)
            return (text[:end] if include else text[: end - len(stop)]), stop
    return text, None


@pytest.mark.parametrize("seed", range(200))
def test_random_splits_equal_whole_text_search(seed):
    # A small alphabet and a stop string planted in most texts, so that stops (and near misses:
    # a stop's prefix at a cut, or at the very end) really occur and cross cuts.
    rng = random.Random(seed)
    alphabet = "ab<é🙂"
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
    planted = rng.choice(stops)
    if rng.random() < 0.7:
        at = rng.randint(0, len(text))
        text = text[:at] + planted + text[at:]
    elif rng.random() < 0.5:
        text += planted[: rng.randint(1, len(planted))]  # ends on a prefix: flushed at the end
    include = rng.random() < 0.5
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 12))))
    deltas = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)], strict=True)]
    assert run(StopStringMatcher(stops, include), deltas) == char_by_char(text, stops, include)


def test_one_character_per_delta_holds_exactly_the_longest_prefix():
    """Fed a character at a time, the matcher emits a character as soon as it can no longer
    start any stop string: never later, never earlier."""
    stops = ["abcab", "bca"]
    matcher = StopStringMatcher(stops)
    text, emitted = "xabxabcabz", ""
    for i, ch in enumerate(text):
        out, matched = matcher.feed(ch)
        emitted += out
        if matched is not None:
            break
        prefix = text[: i + 1]
        held = max((n for n in range(len(prefix) + 1) if any(s.startswith(prefix[len(prefix) - n :]) for s in stops)))
        assert emitted == prefix[: len(prefix) - held], (i, emitted)
    assert (emitted, matched) == ("xabxa", "bca")  # "bca" completes before "abcab"


def test_text_held_for_a_stop_string_comes_out_when_generation_ends_by_length():
    """A stop string that starts with the output's last characters (and never completes) holds
    them back until the end; generation ending by length must still deliver them, streamed and
    not."""
    prompt = [random.Random(3).randrange(500) for _ in range(12)]
    with LLM(CKPT, max_model_len=128) as llm:
        sp = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        text = llm.generate(prompt_token_ids=[prompt], sampling_params=sp)[0].text
        assert len(text) >= 4 and "\u2603" not in text
        sp_stop = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[text[-3:] + "\u2603"])
        out = llm.generate(prompt_token_ids=[prompt], sampling_params=sp_stop)[0]
        assert (out.text, out.finish_reason) == (text, "length")
        events = list(llm.submit(prompt_token_ids=prompt, sampling_params=sp_stop))
        assert "".join(ev.text for ev in events) == text
        assert events[-1].finish_reason == "length" and events[-1].text.endswith(text[-3:])
