"""Tokenizer.encode_within: a text over a token limit is refused after work bounded by the limit,
a text within it is tokenized exactly as encode() does, and long texts release the GIL.

The character bound rests on a claim checked here on every tokenizer the project ships: no token
decodes to more characters than Tokenizer.max_token_chars."""
import random
import threading
import time

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from server_process import REPO

from pyengine.errors import PromptTooLongError
from pyengine.tokenizer import LONG_TEXT_CHARS, Tokenizer, check_text

MODEL_DIRS = [REPO / "pyengine" / "default_model",
              *sorted((REPO / "tests" / "data").glob("ckpt_*"))]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(REPO / "pyengine" / "default_model")


@pytest.mark.parametrize("model_dir", MODEL_DIRS, ids=lambda p: p.name)
def test_no_token_covers_more_characters_than_the_bound(model_dir):
    t = Tokenizer(model_dir)
    assert t.max_token_chars is not None
    longest = max(len(t.decode([i], skip_special_tokens=False)) for i in range(t.vocab_size))
    assert 0 < longest <= t.max_token_chars, (longest, t.max_token_chars)


def cjk(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(n))


@pytest.mark.parametrize("text, seconds", [
    ("a" * 10_000_000, 0.05),          # over the character bound: no tokenizing at all
    (cjk(300_000), 0.5),               # ~3 tokens a character: refused on its first piece
    ("1" * 300_000, 0.5),              # one token a character
    (" " * 300_000, 2.0),              # 45 characters a token: counted up to the margin
])
def test_far_over_the_limit_is_refused_fast(tok, text, seconds):
    t0 = time.perf_counter()
    with pytest.raises(PromptTooLongError) as err:
        tok.encode_within(text, 8191)
    assert time.perf_counter() - t0 < seconds
    assert err.value.limit == 8191 and "8191" in str(err.value)


def test_texts_within_the_limit_are_tokenized_exactly(tok):
    # Long enough for the piece count (over 4 characters a token allowed), yet within the limit.
    for text in (" " * 40_000, "        \n" * 4_000, "word\n" * 3_500):
        assert len(text) > LONG_TEXT_CHARS
        ids = tok.encode(text)
        assert len(ids) <= 8191
        assert tok.encode_within(text, 8191) == ids
        assert tok.encode_within(text, len(ids)) == ids
        with pytest.raises(PromptTooLongError) as err:
            tok.encode_within(text, len(ids) - 1)
        assert err.value.n_tokens == len(ids)


TEXT = st.lists(st.sampled_from(["a", "b", " ", "1", "\n", "\t", "中", "文", "😀", "\u00e9",
                                 "e\u0301", "\u1100\u1161\u11a8"]), max_size=300).map("".join)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(TEXT, st.integers(1, 40))
def test_refused_exactly_when_over_the_limit(text, repeat):
    tok = Tokenizer(REPO / "tests" / "data" / "ckpt_text_bf16")  # NFC: the 4x character margin
    text = text * repeat
    n = len(tok.encode(text))
    for limit in (max(n, 1), n + 1, n - 1, n // 3):
        if limit < 1:
            continue
        if n <= limit:
            assert tok.encode_within(text, limit) == tok.encode(text)
        else:
            with pytest.raises(PromptTooLongError):
                tok.encode_within(text, limit)


UNIT = st.lists(st.sampled_from(["    ", "\n", "        ", "word", " ", "=" * 16, "中", "1", "ab"]),
                min_size=1, max_size=12).map("".join)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(UNIT, st.integers(17_000, 40_000))
def test_counting_in_pieces_never_refuses_a_text_that_fits(tok, unit, n_chars):
    # Long texts of many characters a token: the piece count runs (more than 4 characters a
    # token allowed) and must agree with the whole text's count at and around the limit.
    text = (unit * (n_chars // len(unit) + 1))[:n_chars]
    n = len(tok.encode(text))
    event("pieces counted" if n_chars > 4 * n else "too few characters a token")
    for limit in (n, n + 1, n - 1, n // 2):
        if limit < 1:
            continue
        if n <= limit:
            assert tok.encode_within(text, limit) == tok.encode(text)
        else:
            with pytest.raises(PromptTooLongError):
                tok.encode_within(text, limit)


def test_lone_surrogates_are_a_value_error(tok):
    for text in ("a\ud800", "\udfffb", "x" * 20_000 + "\ud9ab"):
        with pytest.raises(ValueError, match="surrogate"):
            check_text(text)
        with pytest.raises(ValueError, match="surrogate"):
            tok.encode(text)
    assert tok.encode("\U0001F600") == tok.encode("😀")


def test_long_texts_are_tokenized_without_the_gil(tok):
    text = "1" * 400_000  # a few hundred ms of tokenizing
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.005)

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    tok.encode(text)
    took = time.perf_counter() - t0
    stop.set()
    thread.join()
    gaps = [b - a for a, b in zip(ticks, ticks[1:]) if b > t0]
    print(f"encode of {len(text)} characters took {took:.3f} s; longest gap of a Python "
          f"thread meanwhile {max(gaps):.3f} s")
    assert took > 0.1 and max(gaps) < max(0.1, took / 4)
