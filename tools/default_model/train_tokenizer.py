"""Trains the byte-level BPE tokenizer of the pyengine default model and writes
tokenizer.json + tokenizer_config.json (with the chat template) to --out (default .train/tokenizer).

Digits are split one per token before the byte-level step (arithmetic needs it: NOTES.md).
Special tokens get the first ids, in a fixed order, whatever the vocabulary size:
"""

import argparse
import itertools
import json
import lzma
import random
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# (token, special): "special" tokens are dropped by decode(skip_special_tokens=True); the
# reasoning and tool tags are not, as in Qwen's tokenizer, so a client can still parse them.
SPECIAL_TOKENS = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                  ("<think>", False), ("</think>", False), ("<tool_call>", False), ("</tool_call>", False),
                  ("<tool_response>", False), ("</tool_response>", False)]
EOS_TOKEN, PAD_TOKEN = "<|im_end|>", "<|endoftext|>"


def read_texts(path: Path):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def training_texts(corpus: Path, seed: int, n_arith: int, n_code_chat: int):
    """All natural text, plus samples of the repetitive generated chats (they would waste merges)."""
    rng = random.Random(seed)
    for name in ("code", "prose", "wiki_chat", "small_talk"):
        yield from read_texts(corpus / "train" / f"{name}.jsonl.xz")
    for name, n in (("arith", n_arith), ("code_chat", n_code_chat)):
        texts = list(itertools.islice(read_texts(corpus / "train" / f"{name}.jsonl.xz"), 20 * n))
        yield from rng.sample(texts, min(n, len(texts)))


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def added_tokens():
    return [AddedToken(tok, special=special, normalized=False) for tok, special in SPECIAL_TOKENS]


def tokenizer_config(tokenizer: Tokenizer, template: str) -> dict:
    decoder = {}
    for token, special in SPECIAL_TOKENS:
        decoder[str(tokenizer.token_to_id(token))] = {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": None, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN, "unk_token": None,
        "model_max_length": 32768, "clean_up_tokenization_spaces": False, "add_prefix_space": False,
        "errors": "replace", "split_special_tokens": False,
        "chat_template": template,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", type=Path, default=REPO / ".train" / "corpus")
    ap.add_argument("--out", type=Path, default=REPO / ".train" / "tokenizer")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--n-arith", type=int, default=20_000)
    ap.add_argument("--n-code-chat", type=int, default=4_000)
    args = ap.parse_args()
    assert 8192 <= args.vocab_size <= 16384, "the brief asks for 8K-16K"

    tokenizer = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size, min_frequency=2, special_tokens=added_tokens(),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(training_texts(args.corpus, args.seed, args.n_arith, args.n_code_chat), trainer)
    for i, (token, _) in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == i, (token, tokenizer.token_to_id(token))

    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out / "tokenizer.json"))
    template = (HERE / "chat_template.jinja").read_text()
    config = tokenizer_config(tokenizer, template)
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    print(f"vocab {tokenizer.get_vocab_size()} -> {args.out}")


if __name__ == "__main__":
    main()
