"""The shipped prompt and eval sets, and seeded filler text for long prompts.

A client of an arbitrary endpoint has no tokenizer, so long prompts are sized in characters
from a ratio measured on the endpoint itself (one request's `usage.prompt_tokens`); every
result reports the prompt tokens the server counted.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .client import ChatRequest, Client

DATA = Path(__file__).resolve().parent / "data"
KINDS = ("code", "math", "prose")
FALLBACK_CHARS_PER_TOKEN = 4.0  # when the endpoint reports no usage
_WORDS = ("valve", "pump", "sensor", "relay", "queue", "worker", "cache", "shard", "replica",
          "batch", "socket", "thread", "buffer", "index", "ledger", "router")  # fmt: skip
_STATES = ("ok", "degraded", "retrying", "idle", "saturated", "recovered", "draining")


def load_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def chat_prompts() -> list[dict]:
    """{kind, messages} rows; the first of each kind is the benchmark's prompt."""
    return load_jsonl(DATA / "prompts.jsonl")


def bench_prompts() -> dict[str, list[dict]]:
    first: dict[str, list[dict]] = {}
    for row in chat_prompts():
        first.setdefault(row["kind"], row["messages"])
    return {k: first[k] for k in KINDS}


def log_lines(n_chars: int, rng: random.Random) -> str:
    """Tool-output-like text (a service log) of at least n_chars characters, distinct per seed."""
    lines, size = [], 0
    while size < n_chars:
        line = (f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d} "
                f"{rng.choice(_WORDS)}-{rng.randrange(1000)} {rng.choice(_STATES)} "
                f"latency={rng.randrange(1, 5000)}ms load={rng.random():.2f}")  # fmt: skip
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def long_messages(n_tokens: int, chars_per_token: float, rng: random.Random) -> list[dict]:
    """A user message of about n_tokens tokens; a fresh nonce first, so no prefix cache can hold
    any of it (cache-busted)."""
    nonce = f"session {rng.getrandbits(64):016x}"
    body = log_lines(max(1, int(n_tokens * chars_per_token) - 120), rng)
    text = f"{nonce}\nHere is a service log.\n{body}\nWhich component reported the highest latency?"
    return [{"role": "user", "content": text}]


def chars_per_token(client: Client, seed: int = 0) -> float:
    """Characters per prompt token of filler text on this endpoint (one 1-token request)."""
    sample = log_lines(4000, random.Random(seed))
    r = client.run(ChatRequest(messages=[{"role": "user", "content": sample}], max_tokens=1))
    if r.prompt_tokens:
        return len(sample) / r.prompt_tokens
    return FALLBACK_CHARS_PER_TOKEN
