"""Lab: what one engine step costs per prefill chunk size, on the 27B shape (dummy FP8, CUDA).

For each --chunks C: an engine with chunked_prefill_size C and pacing off runs a --depth-token
prompt alone (steps of C prompt rows), then again while one request decodes (steps of C + 1 rows).
Prints the mean step time of each and the tokens/s, so the step cost's staircase (the FP8 GEMM's
128-row tiles, the GDN's 64-token chunks) shows beside the linear fit the pacer uses. Not a test.

  PYTHONPATH=. python3 tools/gpu/lab/step_sweep.py --chunks 128 144 256 272 384 400 512 528
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, nargs="+", default=[128, 144, 256, 272, 384, 400, 512, 528])
    ap.add_argument("--depth", type=int, default=8192, help="prompt tokens of each timed prefill")
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--prefill-weight-copy", default="on")
    ap.add_argument("--out")
    args = ap.parse_args()

    from pyengine.engine import EngineArgs, NativeEngine
    from tools.bench_stall_free import Bench, load_model

    ns = argparse.Namespace(shape27b=True, layers=args.layers, device="cuda",
                            prefill_weight_copy=args.prefill_weight_copy, model=None)  # fmt: skip
    model, vocab, _ = load_model(ns)
    rows = []
    for c in args.chunks:
        kw = dict(max_batch=4, max_model_len=args.depth + 4096, chunked_prefill_size=c, prefix_cache=False,
                  max_step_ms=-1, kv_cache_dtype="fp16", gpu_mem_ratio=0.92)  # fmt: skip
        engine = NativeEngine(model, EngineArgs(**kw), [])
        try:
            b = Bench(engine, vocab)
            b.token_times(b.submit(16, 16)[1])
            b.prefill(2 * c)
            n_steps = -(-args.depth // c)
            alone = b.prefill(args.depth)
            r = b.decoders_during(1, args.depth, 24)
            mixed = r["prefill_s"]
            row = {"chunk": c, "alone_step_ms": alone / n_steps * 1e3, "alone_tok_s": args.depth / alone,
                   "mixed_step_ms": mixed / n_steps * 1e3, "mixed_tok_s": args.depth / mixed}  # fmt: skip
            rows.append(row)
            print(f"chunk {c:5d}: alone {row['alone_step_ms']:7.2f} ms/step {row['alone_tok_s']:8.1f} tok/s | "
                  f"+1 decode row {row['mixed_step_ms']:7.2f} ms/step {row['mixed_tok_s']:8.1f} tok/s", flush=True)
        finally:
            engine.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"depth": args.depth, "rows": rows}, f)


if __name__ == "__main__":
    main()
