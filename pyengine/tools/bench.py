"""`pyengine bench`: the first users' throughput method.

One chat prompt per kind (code, math, prose; shipped in data/prompts.jsonl), T = 0, N tokens with
ignore_eos, R runs, medians over runs; each run sends c identical requests at once, for c = 1 and
c = --concurrency. Reported per (kind, c): TTFT, TPOT, tok/s per stream (medians over every
stream of every run), combined tok/s (median over runs), ITL p50/p95/p99 over every gap of every
run, and speculative acceptance per position where the endpoint reports it.
"""

from __future__ import annotations

from .client import ChatRequest, Client
from .metrics import (
    acceptance_between,
    combined_tok_s,
    itls,
    median,
    merge_acceptance,
    stream_metrics,  # fmt: skip
    summarize,
)
from .progress import progress
from .texts import bench_prompts

_MEDIAN_KEYS = ("ttft_s", "tpot_s", "tok_s", "decode_tok_s")


def run_bench(client: Client, kinds: list[str], concurrency: int, runs: int, max_tokens: int,
              seed: int, thinking: bool | None, warmup: int = 1) -> dict:  # fmt: skip
    prompts = bench_prompts()
    levels = sorted({1, concurrency})
    for i in range(warmup):  # first-request costs (allocations, caches) stay out of the numbers
        client.run(ChatRequest(prompts[kinds[i % len(kinds)]], max_tokens=16, seed=seed, thinking=thinking))
    before = client.stats()
    cells, usages = [], []
    total = sum(levels) * len(kinds) * runs
    with progress(total, "bench", "req") as bar:
        for c in levels:
            for kind in kinds:
                req = ChatRequest(prompts[kind], max_tokens=max_tokens, temperature=0.0, seed=seed,
                                  ignore_eos=True, thinking=thinking)  # fmt: skip
                run_results = []
                for _ in range(runs):
                    run_results.append(client.run_together([req] * c))
                    bar.update(c)
                cells.append(_cell(kind, c, run_results))
                usages += [r.usage for rs in run_results for r in rs if r.ok]
    accept = merge_acceptance(usages) or acceptance_between(before, client.stats())
    return {"cells": cells, "accept_per_position": accept}


def _cell(kind: str, c: int, run_results) -> dict:
    streams = [stream_metrics(r) for rs in run_results for r in rs]
    ok = [s for s in streams if s["error"] is None]
    gaps = [g for rs in run_results for r in rs if r.ok for g in itls(r)]
    cell = {"kind": kind, "concurrency": c, "streams": len(streams), "errors": len(streams) - len(ok)}
    cell.update({k: median([s[k] for s in ok]) for k in _MEDIAN_KEYS})
    cell["combined_tok_s"] = median([combined_tok_s(rs) for rs in run_results])
    cell["completion_tokens"] = median([s["completion_tokens"] for s in ok])
    cell["itl_s"] = summarize(gaps)
    cell["itl_all_s"] = gaps  # for the plot's distribution
    cell["runs"] = [[stream_metrics(r) for r in rs] for rs in run_results]
    cell["error_messages"] = sorted({s["error"] for s in streams if s["error"]})
    return cell


def table(result: dict) -> str:
    rows = ["kind   c  TTFT ms  TPOT ms  tok/s/stream  combined tok/s  ITL p50/p95/p99 ms   errors"]
    for cell in result["cells"]:
        itl = cell["itl_s"]
        rows.append(
            f"{cell['kind']:<6} {cell['concurrency']:>1}  {_ms(cell['ttft_s']):>7}  {_ms(cell['tpot_s']):>7}  "
            f"{_num(cell['tok_s']):>12}  {_num(cell['combined_tok_s']):>14}  "
            f"{_ms(itl['p50'])}/{_ms(itl['p95'])}/{_ms(itl['p99'])}".ljust(86) + f"{cell['errors']:>6}"
        )
    acc = result.get("accept_per_position")
    rows.append("speculative acceptance per position: "
                + (" ".join(f"{i + 1}:{_pct(a)}" for i, a in enumerate(acc)) if acc else "n/a"))
    return "\n".join(rows)


def _ms(x) -> str:
    return "n/a" if x is None else f"{x * 1000:.1f}"


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{x * 100:.1f}%"
