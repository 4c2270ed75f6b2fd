"""Token streams of the corpus and the batch sampler.

Each source is one uint16 stream: documents joined by <|endoftext|>, with the start offset of
every document. The corpus travels as compressed text and is tokenized where it is trained
(16 cores there; a few seconds), cached under --cache keyed by corpus + tokenizer hash.

Design decision: a batch is a pure function of (seed, step) - every row picks a source by the
mixture weights, then a window: at a random document start for chats (a chat is learned from its
beginning), at a random offset for code and prose. The data position saved in a checkpoint is
therefore just the step number.
"""

import hashlib
import json
import lzma
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

SOURCES = ["code", "prose", "arith", "wiki_chat", "code_chat", "small_talk"]
CHAT_SOURCES = {"arith", "wiki_chat", "code_chat", "small_talk"}
# Rows per source. Code is the largest natural source (8.7M tokens); prose (1.4M) is small, and
# its extracts recur as answers in wiki_chat, so it gets few rows; small_talk is a few hundred
# distinct exchanges.
DEFAULT_WEIGHTS = "code=0.38,prose=0.08,arith=0.22,wiki_chat=0.14,code_chat=0.16,small_talk=0.02"
EOT_ID = 0  # <|endoftext|>


def parse_weights(spec: str) -> dict[str, float]:
    weights = {k: float(v) for k, v in (item.split("=") for item in spec.split(","))}
    assert set(weights) <= set(SOURCES), weights
    total = sum(weights.values())
    return {k: v / total for k, v in weights.items() if v > 0}


def _read_texts(path: Path) -> list[str]:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _tokenize(tokenizer: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    ids, starts, pos = [], [], 0
    for i in range(0, len(texts), 4096):
        for enc in tokenizer.encode_batch(texts[i:i + 4096], add_special_tokens=False):
            starts.append(pos)
            ids.append(np.asarray(enc.ids + [EOT_ID], dtype=np.uint16))
            pos += len(enc.ids) + 1
    return np.concatenate(ids), np.asarray(starts, dtype=np.int64)


def load_streams(corpus: Path, tokenizer_file: Path, split: str, cache: Path | None) -> dict:
    """{source: (tokens uint16 [N], doc_starts int64 [D])} for the sources present in corpus/split."""
    key = hashlib.sha1((corpus / "manifest.json").read_bytes() + tokenizer_file.read_bytes()).hexdigest()[:16]
    cache_dir = cache / key / split if cache else None
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    streams = {}
    for source in SOURCES:
        path = corpus / split / f"{source}.jsonl.xz"
        if not path.exists():
            continue
        if cache_dir and (cache_dir / f"{source}.tokens.npy").exists():
            streams[source] = (np.load(cache_dir / f"{source}.tokens.npy"), np.load(cache_dir / f"{source}.starts.npy"))
            continue
        streams[source] = _tokenize(tokenizer, _read_texts(path))
        if cache_dir:
            cache_dir.mkdir(parents=True, exist_ok=True)
            np.save(cache_dir / f"{source}.tokens.npy", streams[source][0])
            np.save(cache_dir / f"{source}.starts.npy", streams[source][1])
    return streams


class Sampler:
    def __init__(self, streams: dict, weights: dict[str, float], batch_size: int, row_len: int, seed: int):
        self.sources = [s for s in weights if s in streams]
        self.probs = np.asarray([weights[s] for s in self.sources])
        self.probs /= self.probs.sum()
        self.streams, self.batch_size, self.row_len, self.seed = streams, batch_size, row_len, seed
        for s in self.sources:
            assert len(streams[s][0]) > row_len, f"source {s} is shorter than one row"

    def batch(self, step: int) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, step])
        rows = np.empty((self.batch_size, self.row_len), dtype=np.int64)
        for r, k in enumerate(rng.choice(len(self.sources), size=self.batch_size, p=self.probs)):
            tokens, starts = self.streams[self.sources[k]]
            limit = len(tokens) - self.row_len
            if self.sources[k] in CHAT_SOURCES:
                start = int(starts[rng.integers(len(starts))])
                start = min(start, limit)
            else:
                start = int(rng.integers(limit + 1))
            rows[r] = tokens[start:start + self.row_len]
        return torch.from_numpy(rows)


def eval_windows(tokens: np.ndarray, row_len: int, max_rows: int) -> torch.Tensor:
    """Consecutive non-overlapping windows from the start of a held-out stream."""
    n = min(max_rows, len(tokens) // row_len)
    return torch.from_numpy(tokens[: n * row_len].astype(np.int64).reshape(n, row_len))


def stream_stats(streams: dict) -> dict:
    return {s: {"tokens": int(len(t)), "docs": int(len(d))} for s, (t, d) in streams.items()}
