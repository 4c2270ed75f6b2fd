"""Where a decode step's time goes in the real stream: the kernel timeline of steady decode steps
of the 27B dummy FP8 model, recorded by CUPTI through torch.profiler in this process (it sees the
kernels pyengine's library launches too). Unlike ncu's serialized per-kernel times this keeps the
overlap of programmatic dependent launch and the host gaps between kernels. GPU machine, repo root:

  PYENGINE_LIBRARY=<build>/libpyengine.so PYTHONPATH=. python3 tools/gpu/timeline_decode.py \
      [--steps 20] [--batch 1] [--kv fp16] [--layers 64] [--csv kernels.csv]

A step runs from the start of its embedding kernel (embedding_kernel or embedding_norm_kernel) to
the start of the next one; the first --skip-first (prefill, first decodes) and last --skip-last
steps are dropped. Per kernel name
(and by name + template args + grid, which tells the GEMV shapes apart): calls, us per call and
per step, share of the wall time, and the exclusive time (while that kernel is the earliest-started
one running: exclusive times + gaps = wall). --csv: every kernel (name, grid, start, dur, step);
--trace T.json analyzes a saved chrome trace instead of running the engine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import statistics
import sys
import tempfile
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))


def split_name(full: str) -> tuple[str, str]:
    """Demangled kernel name -> (short name, short name + template args), namespaces dropped."""
    s = re.sub(r"\(anonymous namespace\)::|<unnamed>::|\{anonymous\}::", "", full.strip())
    s = re.sub(r"^void ", "", s)
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # the parameter list: the first '(' outside template args
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0:
            cut = i
            break
    s = s[:cut].strip()
    lt = s.find("<")
    base, targs = (s[:lt], s[lt:]) if lt >= 0 else (s, "")
    base = base.split("::")[-1].strip()
    return base, base + re.sub(r"\b[A-Za-z_]\w*::", "", targs).replace(" ", "")


def load_trace(path: str) -> tuple[list[dict], list[dict]]:
    """Chrome trace -> (kernels sorted by start, memcpy/memset events): dicts, times in us."""
    with open(path) as f:
        events = json.load(f)
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    kernels, copies = [], []
    for ev in events:
        cat = str(ev.get("cat", "")).lower()
        if ev.get("ph") != "X" or cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        args = ev.get("args") or {}
        short, full = split_name(ev.get("name", "?"))
        grid = "x".join(str(g) for g in args["grid"]) if "grid" in args else ""
        block = "x".join(str(b) for b in args["block"]) if "block" in args else ""
        k = {"name": ev.get("name", "?"), "short": short, "full": full, "grid": grid, "block": block,
             "start": float(ev["ts"]), "dur": float(ev.get("dur", 0.0))}  # fmt: skip
        (kernels if cat == "kernel" else copies).append(k)
    kernels.sort(key=lambda k: (k["start"], k["dur"]))
    return kernels, copies


def sweep(intervals: list[tuple[float, float]], lo: float, hi: float) -> tuple[list[float], float]:
    """intervals (start, end), sorted by start, starts in [lo, hi); ends clipped to hi. Returns the
    exclusive time of each (while it is the earliest-started one running) and the gap time (none
    running) in [lo, hi): sum(exclusive) + gap = hi - lo. Kernel i owns [max(s_i, M), e_i) where
    M is the latest end of the kernels started before it."""
    excl, gap, m = [], 0.0, lo
    for s, e in intervals:
        e = min(e, hi)
        gap += max(0.0, s - m)
        excl.append(max(0.0, e - max(s, m)))
        m = max(m, e)
    return excl, gap + max(0.0, hi - m)


def step_bounds(kernels: list[dict], boundary: str, skip_first: int, skip_last: int) -> list[tuple[float, float]]:
    """(lo, hi) of each complete step: from one `boundary` kernel's start to the next one's."""
    starts = [k["start"] for k in kernels if k["short"] in boundary.split(",")]
    steps = list(zip(starts, starts[1:]))
    return steps[skip_first : len(steps) - skip_last]


def analyze(kernels: list[dict], bounds: list[tuple[float, float]]) -> tuple[list[dict], list[dict]]:
    """Per step: wall, kernel, busy, gap us and kernel count; sets k["step"] and k["excl"]."""
    rows, j = [], 0
    for n, (lo, hi) in enumerate(bounds):
        while j < len(kernels) and kernels[j]["start"] < lo:
            j += 1
        mine = []
        while j < len(kernels) and kernels[j]["start"] < hi:
            mine.append(kernels[j])
            j += 1
        excl, gap = sweep([(k["start"], k["start"] + k["dur"]) for k in mine], lo, hi)
        for k, x in zip(mine, excl):
            k["step"], k["excl"] = n, x
        rows.append({"wall": hi - lo, "kernel": sum(k["dur"] for k in mine), "gap": gap, "n": len(mine)})
    return rows, [k for k in kernels if "excl" in k]


def table(window: list[dict], key: str, n_steps: int, wall: float, gap: float, top: int) -> None:
    calls, dur, excl = defaultdict(int), defaultdict(float), defaultdict(float)
    for k in window:
        g = k["short"] if key == "short" else f"{k['full']} grid {k['grid'] or '?'}"
        calls[g] += 1
        dur[g] += k["dur"]
        excl[g] += k["excl"]
    w = 70 if key == "short" else 100
    print(f"\n{'kernel' if key == 'short' else 'kernel, template args, grid':{w}s} {'calls':>6s} {'us/call':>8s} "
          f"{'us/step':>9s} {'share':>6s} {'excl us':>9s} {'excl':>6s}")  # fmt: skip
    for g in sorted(dur, key=lambda g: -excl[g])[:top]:
        c, d, x = calls[g] / n_steps, dur[g] / n_steps, excl[g] / n_steps
        print(f"{g[:w]:{w}s} {c:6.1f} {dur[g] / calls[g]:8.2f} {d:9.1f} {100 * d / wall:5.1f}% {x:9.1f} "
              f"{100 * x / wall:5.1f}%")  # fmt: skip
    print(f"{'(gaps: no kernel running)':{w}s} {'':6s} {'':8s} {'':9s} {'':6s} {gap:9.1f} {100 * gap / wall:5.1f}%")
    print(f"{'wall time per step (mean)':{w}s} {'':6s} {'':8s} {sum(dur.values()) / n_steps:9.1f} "
          f"{'':6s} {sum(excl.values()) / n_steps + gap:9.1f} {'100.0%':>6s}")  # fmt: skip


def record(args) -> tuple[str, float, float]:
    """Engine, warm-up, one profiled request -> (trace path, token interval ms unprofiled, profiled)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_gpu import decode_rate, make_engine, write_config, run as run_requests

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]):  # CUPTI set up before the engine's work
        torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    cfg = write_config(args.layers, attention_only=args.attention_only)
    _, engine, _ = make_engine(cfg, args.kv, args.prompt + 512 + args.steps, args.batch, 2048,
                               kv_cache_bytes=4 << 30, cuda_graphs=args.cuda_graphs)  # fmt: skip
    decode_rate(engine, args.batch, 16, 0)  # warm-up: 32-token prompts, 16 tokens
    _, plain_step = decode_rate(engine, args.batch, args.steps, 1)
    rng = random.Random(2)
    prompts = [[rng.randrange(1000, 200000) for _ in range(args.prompt)] for _ in range(args.batch)]
    path = os.path.join(tempfile.mkdtemp(prefix="pe_timeline_"), "trace.json")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _, times = run_requests(engine, prompts, args.steps)
    prof.export_chrome_trace(path)
    engine.close()
    ts = times[0]
    return path, plain_step * 1e3, statistics.median(b - a for a, b in zip(ts[1:], ts[2:])) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="tokens generated by the profiled request")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens of the profiled request (context depth)")
    ap.add_argument("--attention-only", action="store_true", help="every layer full attention (bench_gpu's depth model)")
    ap.add_argument("--kv", default="fp16", help="kv_cache_dtype")
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--cuda-graphs", action="store_true", help="engine option cuda_graphs")
    ap.add_argument("--skip-first", type=int, default=3, help="steps dropped at the start (prefill included)")
    ap.add_argument("--skip-last", type=int, default=2)
    ap.add_argument("--boundary", default="embedding_kernel,embedding_norm_kernel",
                    help="the first kernel of every step (names, comma-separated)")
    ap.add_argument("--top", type=int, default=40, help="rows of the name + grid table")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--trace", default=None, help="analyze this chrome trace instead of running the engine")
    args = ap.parse_args()
    if not args.trace and args.steps < args.skip_first + args.skip_last + 3:
        ap.error("--steps must exceed --skip-first + --skip-last + 2")
    path, plain, prof_ms = (args.trace, float("nan"), float("nan")) if args.trace else record(args)
    kernels, copies = load_trace(path)
    if not any(k["short"] in args.boundary.split(",") or "pe::" in k["name"] for k in kernels):
        print(f"CUPTI saw none of the pyengine library's kernels ({len(kernels)} kernel events in {path}, "
              f"no {args.boundary}): nothing to analyze")  # fmt: skip
        sys.exit(1)
    bounds = step_bounds(kernels, args.boundary, args.skip_first, args.skip_last)
    if not bounds:
        print(f"too few steps: {sum(k['short'] in args.boundary.split(',') for k in kernels)} {args.boundary} "
              f"launches; raise --steps or lower --skip-first/--skip-last")  # fmt: skip
        sys.exit(1)
    rows, window = analyze(kernels, bounds)
    n = len(rows)
    med = {f: statistics.median(r[f] for r in rows) for f in ("wall", "kernel", "gap", "n")}
    wall, gap = sum(r["wall"] for r in rows) / n, sum(r["gap"] for r in rows) / n
    cps = [c for c in copies if bounds[0][0] <= c["start"] < bounds[-1][1]]
    print(f"trace {path}: {len(kernels)} kernels; {n} steady steps (dropped {args.skip_first} first, "
          f"{args.skip_last} last), batch {args.batch}, {args.layers} layers, kv {args.kv}")
    print(f"step wall (first kernel start -> next step's): median {med['wall'] / 1e3:.3f} ms "
          f"(min {min(r['wall'] for r in rows) / 1e3:.3f}, max {max(r['wall'] for r in rows) / 1e3:.3f})")
    print(f"sum of kernel durations: median {med['kernel'] / 1e3:.3f} ms ({100 * med['kernel'] / med['wall']:.1f} % "
          f"of wall; over 100 % where kernels overlap)")  # fmt: skip
    print(f"gaps (no kernel running): median {med['gap'] / 1e3:.3f} ms ({100 * med['gap'] / med['wall']:.1f} %); "
          f"kernels per step: median {med['n']:.0f} (min {min(r['n'] for r in rows)}, max {max(r['n'] for r in rows)})")
    print(f"memcpy/memset per step: {len(cps) / n:.1f} events, {sum(c['dur'] for c in cps) / n:.1f} us")
    print(f"engine token interval (host clock): unprofiled {plain:.3f} ms, profiled {prof_ms:.3f} ms")
    table(window, "short", n, wall, gap, 10**9)
    table(window, "full", n, wall, gap, args.top)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["name", "short", "grid", "block", "start_us", "dur_us", "step"])
            t0 = kernels[0]["start"]
            for k in kernels:
                w.writerow([k["name"], k["short"], k["grid"], k["block"], f"{k['start'] - t0:.3f}",
                            f"{k['dur']:.3f}", k.get("step", -1)])  # fmt: skip
        print(f"\n{len(kernels)} kernels written to {args.csv}")


if __name__ == "__main__":
    main()
