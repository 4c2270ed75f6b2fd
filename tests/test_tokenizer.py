"""Tokenizer and incremental detokenizer on a tiny byte-level BPE trained here (like Qwen's:
ByteLevel pre-tokenizer and decoder), so multi-byte characters split across tokens."""

import json
import random

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from pyengine.errors import CheckpointError
from pyengine.tokenizer import IncrementalDetokenizer, Tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["hello world, the quick brown fox jumps over the lazy dog"] * 20 + [
    "def f(x):\n    return x + 1"
] * 5
# Characters that are absent from the corpus, so their UTF-8 bytes stay separate tokens.
MULTI_BYTE_TEXTS = ["héllo 🙂 wörld", "中文字符 and 日本語", "emoji 👩‍👩‍👧 family", "ẞ€𝄞😀"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(directory / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "special": True} for t in SPECIAL_TOKENS}
    config = {
        "eos_token": "<|im_end|>",
        "pad_token": {"content": "<|endoftext|>", "special": True},
        "bos_token": None,
        "added_tokens_decoder": added,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer(model_dir, extra_eos_token_ids=[0])


def test_special_tokens_and_eos(tokenizer):
    im_end = tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_ids == (im_end, 0)  # 0 is <|endoftext|>, the first special token
    assert tokenizer.pad_token_id == 0 and tokenizer.bos_token_id is None
    assert set(tokenizer.special_tokens) == set(SPECIAL_TOKENS)
    assert tokenizer.is_special(im_end) and not tokenizer.is_special(tokenizer.encode("a")[0])
    assert tokenizer.vocab_size == 300


def test_encode_decode_round_trip(tokenizer):
    for text in CORPUS[-1:] + MULTI_BYTE_TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_encode_as_one_id_and_can_be_skipped(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tokenizer.token_to_id("<|im_start|>")
    assert ids[-1] == tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"


def stream(detokenizer: IncrementalDetokenizer, ids, chunk_sizes=None) -> list[str]:
    deltas, i = [], 0
    while i < len(ids):
        n = 1 if chunk_sizes is None else chunk_sizes(i)
        deltas.append(detokenizer.add(ids[i : i + n] if n > 1 else ids[i]))
        i += n
    deltas.append(detokenizer.flush())
    return deltas


@pytest.mark.parametrize("text", MULTI_BYTE_TEXTS)
def test_incremental_decode_equals_full_decode_without_replacement_chars(tokenizer, text):
    ids = tokenizer.encode(text)
    assert len(ids) > len(text) / 2  # the characters really are split across tokens
    deltas = stream(tokenizer.detokenizer(), ids)
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


def test_emoji_bytes_are_held_until_complete(tokenizer):
    ids = tokenizer.encode("🙂")
    assert len(ids) == 4  # one token per UTF-8 byte
    detokenizer = tokenizer.detokenizer()
    assert [detokenizer.add(i) for i in ids] == ["", "", "", "🙂"]


def test_random_chunking_and_specials(tokenizer):
    rng = random.Random(0)
    text = "<|im_start|>assistant\n" + " ".join(MULTI_BYTE_TEXTS) + "<|im_end|>"
    ids = tokenizer.encode(text)
    for skip in (True, False):
        for _ in range(20):
            deltas = stream(
                tokenizer.detokenizer(skip_special_tokens=skip), ids, lambda i: rng.randint(1, 4)
            )
            assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip)
            assert not any("\ufffd" in d for d in deltas)


def test_prompt_context_is_not_emitted(tokenizer):
    prompt = tokenizer.encode("hello ")
    output = tokenizer.encode("wörld 🙂")
    deltas = stream(tokenizer.detokenizer(prompt_ids=prompt), output)
    assert "".join(deltas) == tokenizer.decode(output)


def test_flush_emits_an_incomplete_character(tokenizer):
    ids = tokenizer.encode("a🙂")[:-1]  # the emoji's last byte never comes
    detokenizer = tokenizer.detokenizer()
    assert "".join(detokenizer.add(i) for i in ids) == "a"
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.flush() == ""


def test_missing_or_broken_files(tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer.json: file not found"):
        Tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match="tokenizer.json: cannot load tokenizer"):
        Tokenizer(tmp_path)


def test_unknown_eos_token_is_reported(model_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(CheckpointError, match="eos_token '</s>' is not in the vocabulary"):
        Tokenizer(tmp_path)
