"""`pyengine bench --bisect-metric NAME --bisect-threshold X`: bench as a `git bisect run` predicate.

Exit 0 (good) when the metric is on the good side of the threshold, 1 (bad) when not, 125 (skip)
when it cannot be measured at this commit: the endpoint or engine does not come up, every request
fails, or the endpoint does not report the metric.

Metrics (median over the prompt kinds at concurrency 1 unless a kind is named, e.g. `tok_s:code`):
  accept_posK     speculative acceptance at draft position K (1-based), a fraction; higher is good
  tok_s           tokens/s per stream; higher is good
  decode_tok_s    1 / TPOT; higher is good
  combined_tok_s  all streams together at the highest concurrency; higher is good
  ttft_s, tpot_s  seconds; lower is good
"""

from __future__ import annotations

import re

from .metrics import median

GOOD, BAD, SKIP = 0, 1, 125
_HIGHER = {"tok_s": True, "decode_tok_s": True, "combined_tok_s": True, "ttft_s": False, "tpot_s": False}
_ALIASES = {"ttft": "ttft_s", "tpot": "tpot_s", "tokens_per_s": "tok_s", "tps": "tok_s"}


def check_name(name: str) -> str | None:
    """None when the metric name is known, else the message for the user."""
    base = _ALIASES.get(name.split(":")[0], name.split(":")[0])
    if base in _HIGHER or re.fullmatch(r"accept_pos[1-9][0-9]*", base):
        return None
    return f"unknown --bisect-metric {name!r}; use accept_posK, {', '.join(_HIGHER)} (optionally :KIND)"


def metric_value(result: dict, name: str) -> tuple[float | None, bool]:
    """(value, higher_is_better) of the named metric in a bench result (None: not measured)."""
    base, _, kind = name.partition(":")
    base = _ALIASES.get(base, base)
    pos = re.fullmatch(r"accept_pos([1-9][0-9]*)", base)
    if pos:
        rates = result.get("accept_per_position") or []
        k = int(pos.group(1))
        return (rates[k - 1] if k <= len(rates) else None), True
    cells = [c for c in result["cells"] if not kind or c["kind"] == kind]
    if base == "combined_tok_s":
        top = max((c["concurrency"] for c in cells), default=1)
        cells = [c for c in cells if c["concurrency"] == top]
    else:
        cells = [c for c in cells if c["concurrency"] == 1]
    return median([c[base] for c in cells]), _HIGHER[base]


def verdict(value: float | None, threshold: float, higher_is_better: bool) -> int:
    if value is None:
        return SKIP
    good = value >= threshold if higher_is_better else value <= threshold
    return GOOD if good else BAD
