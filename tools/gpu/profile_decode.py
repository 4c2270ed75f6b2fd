"""Where a decode step's GPU time goes: per-kernel durations of decode steps of the 27B dummy FP8
model, read with Nsight Compute, summed by kernel name. Run under ncu (GPU machine, repo root):

  ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 3000 \
      --launch-count 1500 python3 tools/gpu/profile_decode.py > ncu.csv
  python3 tools/gpu/profile_decode.py --summarize ncu.csv

The first form runs a 16-token prompt and 12 decode steps (batch 1; --batch for more); the
launch window skips the load, the prefill and the first decode steps. --kv, --attention-layers
and --prompt profile the depth table's model instead (e.g. fp8_e4m3 KV, 8 layers, 1,024 tokens). The second form prints,
per kernel name, the calls, the total microseconds, the share of the window and the mean.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))


def run(batch: int, steps: int, kv: str, attention_layers: int, prompt: int) -> None:
    from bench_gpu import make_engine, write_config
    from bench_gpu import run as run_requests

    cfg = write_config(attention_layers, attention_only=True) if attention_layers else write_config(64)
    # A 2 GiB KV cache, not 92 % of the GPU: ncu saves and restores the memory a profiled kernel
    # may write between its replay passes, which is slow for a ~100 GB pool.
    _, engine, _ = make_engine(cfg, kv, prompt + steps + 64, batch, 2048, kv_cache_bytes=2 << 30)
    prompts = [[1000 + (7 * i + 13 * j) % 100000 for j in range(prompt)] for i in range(batch)]
    run_requests(engine, prompts, steps)


def summarize(path: str, last: int = 0) -> None:
    """Per kernel name over the profiled window, or over its `last` kernels (e.g. the decode
    steps after a long prefill) when last > 0."""
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    rows = [r for r in csv.DictReader(io.StringIO(text[start:])) if r.get("Metric Name") == "gpu__time_duration.sum"]
    if last > 0:
        rows = rows[-last:]
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for r in rows:
        name = re.sub(r"<?unnamed>::|\(anonymous namespace\)::|^void ", "", r["Kernel Name"])
        name = name.split("(")[0].split("<")[0].strip()
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
        total[name] += value * scale
        calls[name] += 1
    window = sum(total.values())
    n = sum(calls.values())
    print(f"{n} kernels, {window:.1f} us of kernel time in the window")
    print(f"{'kernel':60s} {'calls':>6s} {'us':>10s} {'share':>7s} {'us/call':>8s}")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"{name[:60]:60s} {calls[name]:6d} {us:10.1f} {100 * us / window:6.1f}% {us / calls[name]:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summarize", metavar="NCU_CSV")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--kv", default="fp16", help="kv_cache_dtype")
    ap.add_argument("--attention-layers", type=int, default=0,
                    help="an all-attention model of this many 27B layers (the depth table's), not the 64-layer 27B")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens (the context depth)")
    ap.add_argument("--last", type=int, default=0, help="--summarize: only the window's last N kernels")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize, args.last)
    else:
        run(args.batch, args.steps, args.kv, args.attention_layers, args.prompt)


if __name__ == "__main__":
    main()
