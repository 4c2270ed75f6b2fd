"""GPU benchmark of speculative verify steps on the 27B shape with dummy weights (not a test).

One engine per setting on the MODEL_SPEC §1 27B shape with an MTP head (mtp_num_hidden_layers 1),
dummy FP8 weights, batch --batch (1 and 8 by default), prompt 32 tokens, greedy, ignore_eos,
--tokens decode tokens. Dummy weights draft random tokens, so nearly every draft is rejected and
each verify step emits one token: the step computes 1 + k tokens, which is what is measured.
  step_ms        the verify step alone: the engine's step time (stats step_seconds: forward, verify
                 and the proposer's turn) less the proposer's (spec_propose_seconds), mean over
                 the decode steps of the run
  draft_ms       the proposer's turn per step (the MTP head's k chained steps)
  token_ms       wall time per emitted token per request (steps + the MTP head's k draft steps)
  ratio          step_ms / the plain decode step's (spec off, same batch)
  implied        the speedup at a mean accepted length L (--accepted-length, tokens per verify;
                 the default model's on code, tools/bench_spec.py): L x plain token_ms / token_ms
k = 0 is spec off (plain decode). Prints a table and a JSON line.

  PYTHONPATH=. python3 tools/bench_spec_gpu.py [--k 1 3 5] [--batch 1 8] [--accepted-length 2.5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

from bench_gpu import CONFIG_27B


def write_config(layers: int) -> str:
    cfg = dict(CONFIG_27B, num_hidden_layers=layers, mtp_num_hidden_layers=1)
    cfg["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    d = tempfile.mkdtemp(prefix="pe27b_mtp_")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    # LLM needs a tokenizer; the prompts are token ids, so the embedded model's serves.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(ROOT, "pyengine", "default_model", name)
        if os.path.exists(src):
            shutil.copy(src, d)
    return d


def measure(model_dir: str, k: int, batch: int, tokens: int) -> dict:
    from pyengine import LLM, SamplingParams

    kw = {"device": "cuda", "load_format": "dummy", "weight_quant": "fp8", "max_model_len": 4096,
          "max_batch": batch, "prefix_cache": False}
    if k:
        kw.update(speculative_algorithm="mtp", speculative_num_draft_tokens=k)
    with LLM(model_dir, **kw) as llm:
        prompts = [[(7 * i + 13 * j) % 50000 + 100 for j in range(32)] for i in range(batch)]
        sp = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        llm.generate(prompt_token_ids=prompts, sampling_params=sp)  # warm-up
        sp = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        before = llm.stats()
        streams = [llm.submit(prompt_token_ids=p, sampling_params=sp) for p in prompts]
        times = []
        for s in streams:
            t = []
            for ev in s:
                t += ev.token_times
            times.append(t)
        after = llm.stats()
    h0, h1 = before["step_seconds"], after["step_seconds"]
    steps = h1["count"] - h0["count"]
    propose_s = after["spec_propose_seconds"] - before["spec_propose_seconds"]
    # Steady state: from the moment every request has its first token.
    start = max(t[0] for t in times)
    per_token = [(t[-1] - start) / max(1, sum(1 for x in t if x > start)) for t in times]
    out = {"k": k, "batch": batch, "steps": steps,
           "step_ms": 1e3 * (h1["sum"] - h0["sum"] - propose_s) / max(1, steps),
           "draft_ms": 1e3 * propose_s / max(1, steps),
           "token_ms": 1e3 * sum(per_token) / len(per_token),
           "accept_per_position": after.get("spec_accept_per_position", [])}  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 3, 5])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--accepted-length", type=float, default=2.5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    d = write_config(args.layers)
    rows = []
    print(f"{'batch':>5} {'k':>2} {'step ms':>8} {'ratio':>6} {'draft ms':>9} {'token ms':>9} {'implied':>8}  "
          f"(L = {args.accepted_length})", flush=True)  # fmt: skip

    def add(r: dict) -> None:  # printed as measured: a run cut short keeps what ran
        rows.append(r)
        print(f"{r['batch']:5d} {r['k']:2d} {r['step_ms']:8.3f} {r['ratio']:6.3f} {r['draft_ms']:9.3f} "
              f"{r['token_ms']:9.3f} {r['implied']:8.2f}", flush=True)  # fmt: skip

    try:
        for batch in args.batch:
            base = measure(d, 0, batch, args.tokens)
            add(dict(base, ratio=1.0, implied=1.0))
            for k in args.k:
                r = measure(d, k, batch, args.tokens)
                add(dict(r, ratio=r["step_ms"] / base["step_ms"],
                         implied=args.accepted_length * base["token_ms"] / r["token_ms"]))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    result = {"accepted_length": args.accepted_length, "rows": rows, "time": time.time()}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
