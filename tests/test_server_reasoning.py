"""pyengine.reasoning: <think>…</think> split, one-shot and streamed in every chunking."""
import random

import pytest

from pyengine.reasoning import ReasoningParser, prompt_opens_reasoning, split_reasoning


def stream_split(text: str, cuts: list[int], starts_in_reasoning: bool):
    parser = ReasoningParser(starts_in_reasoning)
    reasoning, content, prev = [], [], 0
    for cut in cuts + [len(text)]:
        r, c = parser.feed(text[prev:cut])
        reasoning.append(r)
        content.append(c)
        prev = cut
    r, c = parser.finish()
    reasoning.append(r)
    content.append(c)
    return ("".join(reasoning) if parser.saw_reasoning else None), "".join(content)


@pytest.mark.parametrize("text, starts, expected", [
    ("plain answer", False, (None, "plain answer")),
    ("<think>plan</think>answer", False, ("plan", "answer")),
    ("<think>\nplan\n</think>\n\nanswer", False, ("plan", "answer")),
    ("  <think>plan</think>answer", False, ("plan", "answer")),
    ("plan a\nplan b\n</think>\n\nthe answer", True, ("plan a\nplan b", "the answer")),
    ("still thinking when cut off", True, ("still thinking when cut off", "")),
    ("still thinking  \n", True, ("still thinking", "")),
    ("</think>\n\nno thoughts", True, ("", "no thoughts")),
    ("a <think> later is content", False, (None, "a <think> later is content")),
    ("answer with </think> inside", False, (None, "answer with </think> inside")),
    ("<thin", False, (None, "<thin")),
    ("", True, ("", "")),
    ("x </thin", True, ("x </thin", "")),
])
def test_one_shot(text, starts, expected):
    assert split_reasoning(text, starts) == expected


@pytest.mark.parametrize("starts", [False, True])
def test_streaming_equals_one_shot_for_every_split(starts):
    text = ("" if starts else "<think>") + "\nI think x=2 </thi and y\n\n</think>\n\nx is 2."
    expected = split_reasoning(text, starts)
    assert expected == ("I think x=2 </thi and y", "x is 2.")
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 3):
            assert stream_split(text, [i, j], starts) == expected, (i, j)


def test_streaming_random_chunks_one_char_at_a_time_and_seeded():
    text = "<think>\nstep one\n\nstep two\n</think>\n\nfinal answer\n"
    expected = split_reasoning(text)
    assert expected == ("step one\n\nstep two", "final answer\n")
    assert stream_split(text, list(range(1, len(text))), False) == expected
    rng = random.Random(1234)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
        assert stream_split(text, cuts, False) == expected


def test_tag_is_not_leaked_while_partial():
    parser = ReasoningParser(starts_in_reasoning=True)
    assert parser.feed("idea </th") == ("idea", "")
    assert parser.feed("ink>done") == ("", "done")
    assert parser.finish() == ("", "")


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
