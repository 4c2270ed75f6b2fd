"""Tokenization by segments (pyengine/token_segments.py): the same ids as the tokenizer's own
encode for texts full of added tokens, the kept segments reused by a longer prompt, the bound
on what is kept, and tokenizers whose added tokens cannot be split out as plain strings."""

import glob
import os
import random

import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from pyengine.llm import default_model_path
from pyengine.token_segments import SegmentCache
from pyengine.tokenizer import SEGMENT_TEXT_CHARS, Tokenizer

DATA = os.path.join(os.path.dirname(__file__), "data")
MODEL_DIRS = [default_model_path()] + sorted(os.path.dirname(p) for p in glob.glob(f"{DATA}/*/tokenizer.json"))
FRAGMENTS = ["hello", " world", "\n", "\n\n", "  ", "\t", "1234567", "3.14", "é", "e\u0301", "\u0301",
             "中文", "🙂", "👩‍👩‍👧", "<", "|", ">", "<|im_", "im_end|>", "</", "tool", "_response>",
             "{\"a\": 1}", "def f(x):\n    return x", "'s", " 's", "ﬁ", "Å", "A\u030a"]  # fmt: skip


def random_text(rng: random.Random, added: list[str], n: int) -> str:
    return "".join(rng.choice(added) if rng.random() < 0.2 else rng.choice(FRAGMENTS) for _ in range(n))


@pytest.mark.parametrize("model_dir", MODEL_DIRS, ids=os.path.basename)
def test_segments_give_the_tokenizers_ids(model_dir):
    tok = Tokenizer(model_dir)
    hf = tok._tokenizer
    cache = SegmentCache.for_tokenizer(hf)
    assert cache is not None  # plain-string added tokens in every checkpoint here
    added = [t.content for t in hf.get_added_tokens_decoder().values()]
    piece = lambda text: hf.encode(text, add_special_tokens=False).ids  # noqa: E731
    rng = random.Random(7)
    for trial in range(300):
        text = random_text(rng, added, rng.randrange(1, 60))
        want = hf.encode(text, add_special_tokens=False).ids
        assert cache.encode(text, piece) == want, repr(text)
        assert cache.encode(text, piece) == want, repr(text)  # now from the kept segments
        longer = text + random_text(rng, added, 20)
        assert cache.encode(longer, piece) == hf.encode(longer, add_special_tokens=False).ids, repr(longer)
    assert cache.pieces_reused > 0


def chat(tok: Tokenizer, n_messages: int) -> str:
    rng = random.Random(3)
    turns = []
    for i in range(n_messages):
        body = " ".join(rng.choice(["export", "batch", "retry", "shard", "02:14", "id=77"]) for _ in range(400))
        turns.append(f"<|im_start|>user\n<tool_response>\n{body} {i}\n</tool_response><|im_end|>\n")
    return "".join(turns) + "<|im_start|>assistant\n"


def test_a_longer_prompt_tokenizes_only_its_new_pieces():
    tok = Tokenizer(default_model_path())
    first, second = chat(tok, 5), chat(tok, 6)
    assert second.startswith(first[: -len("<|im_start|>assistant\n")]) and len(first) > SEGMENT_TEXT_CHARS
    hf_ids = lambda text: tok._tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    assert tok.encode(first) == hf_ids(first)
    encoded = tok.segments.pieces_encoded
    assert encoded >= 5  # each message's body (and the role lines between the added tokens)
    assert tok.encode(second) == hf_ids(second)
    assert tok.segments.pieces_encoded == encoded + 1  # the sixth body; "user\n", "\n" ... are kept
    assert tok.encode_within(second, 100_000) == hf_ids(second)
    assert tok.encode("x" * 100) == hf_ids("x" * 100)  # short texts: one call, nothing kept


def test_kept_segments_stay_within_their_bound():
    tok = Tokenizer(default_model_path())
    cache = SegmentCache.for_tokenizer(tok._tokenizer, max_chars=5000)
    piece = lambda text: tok._tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    for n in range(1, 8):
        text = chat(tok, n)
        assert cache.encode(text, piece) == piece(text)
        assert cache._chars <= 5000
        assert cache._chars == sum(map(len, cache._pieces))


def small_tokenizer(token: AddedToken, normalizer=None, more=()) -> HFTokenizer:
    tok = HFTokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.normalizer = normalizer
    tok.add_special_tokens([token, *more])
    return tok


@pytest.mark.parametrize("token, normalizer", [
    (AddedToken("<x>", lstrip=True, special=True), None),
    (AddedToken("<x>", rstrip=True, special=True), None),
    (AddedToken("<x>", single_word=True, special=True), None),
    (AddedToken("<x>", normalized=True, special=False), normalizers.Lowercase()),
])  # fmt: skip
def test_no_cache_where_added_tokens_are_no_plain_strings(token, normalizer):
    assert SegmentCache.for_tokenizer(small_tokenizer(token, normalizer)) is None


def test_overlapping_added_tokens_match_leftmost_longest():
    # "<x>" (id 3) is a prefix of "<x><y>" (4), and "<y>" (5) overlaps the end of both.
    hf = small_tokenizer(AddedToken("<x>", special=True), more=[AddedToken("<x><y>", special=True),
                                                                AddedToken("<y>", special=False)])
    cache = SegmentCache.for_tokenizer(hf)
    piece = lambda text: hf.encode(text, add_special_tokens=False).ids  # noqa: E731
    for text in ["a <x>b<x><x> a", "<x><y>", "<x><x><y><y>b", "a<y><x>", "<x<x><y"]:
        assert cache.encode(text, piece) == hf.encode(text, add_special_tokens=False).ids, text
    assert cache.encode("a <x>b<x><y>", piece) == [0, 3, 1, 4]
