"""Client-side measures of one stream, percentiles, and speculative acceptance per position.

Per stream: TTFT = first output chunk - send; TPOT = (last chunk - first chunk) / (tokens - 1);
ITL = the gaps between chunks; tok/s = tokens / (end - send) (what the user waited per token,
first token included); decode tok/s = 1 / TPOT.
"""

from __future__ import annotations

import math
from itertools import pairwise

from .client import StreamResult


def percentile(values, q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values) -> float | None:
    return percentile(values, 50)


def itls(r: StreamResult) -> list[float]:
    t = r.chunk_times
    return [b - a for a, b in pairwise(t)]


def stream_metrics(r: StreamResult) -> dict:
    n = r.n_tokens
    e2e = r.t_end - r.t_send
    span = r.chunk_times[-1] - r.chunk_times[0] if len(r.chunk_times) > 1 else None
    tpot = span / (n - 1) if span and n > 1 else None
    return {
        "ttft_s": r.ttft, "tpot_s": tpot, "decode_tok_s": 1.0 / tpot if tpot else None,
        "tok_s": n / e2e if e2e > 0 and r.chunk_times else None, "e2e_s": e2e,
        "completion_tokens": n, "chunks": len(r.chunk_times), "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens, "finish_reason": r.finish_reason, "error": r.error,
    }  # fmt: skip


def combined_tok_s(results: list[StreamResult]) -> float | None:
    """All streams' tokens over the wall time from the first send to the last end."""
    done = [r for r in results if r.ok and r.chunk_times]
    if not done:
        return None
    wall = max(r.t_end for r in done) - min(r.t_send for r in done)
    return sum(r.n_tokens for r in done) / wall if wall > 0 else None


def summarize(values, qs=(50, 95, 99)) -> dict:
    return {f"p{q}": percentile(values, q) for q in qs}


# ---- speculative decoding: acceptance per draft position ----
# Read where a server reports it, in usage (per response) or in /v1/stats / llm.stats():
#   spec_accept_per_position: [rate of position 1, 2, ...]                       (rates 0..1)
#   spec_accepted_per_position + spec_drafted_per_position: [count, ...]         (counts)
# and the same without the `spec_` prefix inside a "speculative" or "spec" object.
_NESTS = ("speculative", "spec", "spec_decode")


def _lists(obj: dict) -> tuple[list | None, list | None, list | None]:
    for scope, prefix in [(obj, "spec_")] + [(obj.get(k), "") for k in _NESTS]:
        if not isinstance(scope, dict):
            continue
        rates = scope.get(prefix + "accept_per_position") or scope.get(prefix + "acceptance_per_position")
        accepted = scope.get(prefix + "accepted_per_position")
        drafted = scope.get(prefix + "drafted_per_position")
        if rates or (accepted and drafted):
            return rates, accepted, drafted
    return None, None, None


def acceptance_counts(obj: dict | None) -> tuple[list[float], list[float]] | None:
    """(accepted, drafted) per position when obj reports counts."""
    if not isinstance(obj, dict):
        return None
    _, accepted, drafted = _lists(obj)
    return (list(accepted), list(drafted)) if accepted and drafted else None


def acceptance_rates(obj: dict | None) -> list[float] | None:
    if not isinstance(obj, dict):
        return None
    rates, accepted, drafted = _lists(obj)
    if accepted and drafted:
        return [a / d if d else None for a, d in zip(accepted, drafted)]
    return [float(r) for r in rates] if rates else None


def merge_acceptance(objs: list[dict | None]) -> list[float] | None:
    """One rate per position over many responses: pooled counts where every response has them,
    else the mean of their rates."""
    counts = [acceptance_counts(o) for o in objs if o is not None]
    if counts and all(counts):
        n = max(len(a) for a, _ in counts)
        acc = [sum(a[i] for a, _ in counts if i < len(a)) for i in range(n)]
        dr = [sum(d[i] for _, d in counts if i < len(d)) for i in range(n)]
        return [a / d if d else None for a, d in zip(acc, dr)]
    rates = [r for r in (acceptance_rates(o) for o in objs) if r]
    if not rates:
        return None
    n = max(len(r) for r in rates)
    cols = [[r[i] for r in rates if i < len(r) and r[i] is not None] for i in range(n)]
    return [sum(c) / len(c) if c else None for c in cols]


def acceptance_between(before: dict | None, after: dict | None) -> list[float] | None:
    """Rates over the requests between two stats snapshots (counters), else after's rates."""
    b, a = acceptance_counts(before), acceptance_counts(after)
    if a and b:
        acc = [x - y for x, y in zip(a[0], b[0])]
        dr = [x - y for x, y in zip(a[1], b[1])]
        return [x / d if d > 0 else None for x, d in zip(acc, dr)]
    return acceptance_rates(after)
