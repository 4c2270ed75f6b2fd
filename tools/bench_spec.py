"""Speculative decoding on the CPU (not a test): tokens/s with spec off and with the MTP proposer,
the first users' method: one chat prompt per kind (code, math, prose; pyengine/tools/data/
prompts.jsonl, thinking off), T = 0, --max_tokens (256) with ignore_eos, median of --runs (3),
batch 1. Spec off and on run interleaved (off, on, off, on ...) in one process, so load from other
processes hits both alike. tok/s = tokens / (submit -> last token), the first users' wall time.
Also the mean accepted length (tokens per verify) and acceptance per draft position, and that the
tokens are the same with and without speculation. Prints the machine, the command and a JSON line.

  PYTHONPATH=. python3 tools/bench_spec.py [--model DIR] [--k 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from pyengine import LLM, SamplingParams

PROMPTS = os.path.join(os.path.dirname(__file__), "..", "pyengine", "tools", "data", "prompts.jsonl")


def first_prompt_of_each_kind() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    with open(PROMPTS) as f:
        for line in f:
            row = json.loads(line)
            out.setdefault(row["kind"], row["messages"])
    return out


def run_once(llm: LLM, prompt: list[int], n: int, speculative: bool) -> tuple[float, list[int], dict | None]:
    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, speculative=speculative)
    t0 = time.monotonic()
    out = llm.submit(prompt_token_ids=prompt, sampling_params=sp).result()
    return len(out.token_ids) / (time.monotonic() - t0), out.token_ids, out.speculative


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint directory with an MTP head (default: the embedded model)")
    ap.add_argument("--k", type=int, default=3, help="speculative_num_draft_tokens (default 3)")
    ap.add_argument("--max_tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--kinds", default="code,math,prose")
    args = ap.parse_args()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    # One engine: spec off is the per-request switch (the same engine, the same memory plan).
    with LLM(args.model, max_model_len=2048, max_batch=1, num_threads=args.threads, speculative_algorithm="mtp",
             speculative_num_draft_tokens=args.k) as llm:  # fmt: skip
        results = {}
        for kind, messages in first_prompt_of_each_kind().items():
            if kind not in args.kinds.split(","):
                continue
            prompt = llm.tokenizer.encode(llm.apply_chat_template(messages, enable_thinking=False))
            run_once(llm, prompt, 16, True)  # warm-up
            off, on, same, spec = [], [], True, []
            for _ in range(args.runs):
                rate, base, _ = run_once(llm, prompt, args.max_tokens, False)
                off.append(rate)
                rate, toks, s = run_once(llm, prompt, args.max_tokens, True)
                on.append(rate)
                same = same and toks == base
                spec.append(s)
            drafted = [sum(x) for x in zip(*(s["spec_drafted_per_position"] for s in spec))]
            accepted = [sum(x) for x in zip(*(s["spec_accepted_per_position"] for s in spec))]
            r = {"off_tok_s": statistics.median(off), "mtp_tok_s": statistics.median(on),
                 "speedup": statistics.median(on) / statistics.median(off),
                 "mean_accepted_length": (sum(accepted) + drafted[0]) / drafted[0],
                 "accept_per_position": [round(a / d, 3) for a, d in zip(accepted, drafted)],
                 "same_tokens": same, "runs_off": off, "runs_mtp": on}  # fmt: skip
            results[kind] = r
            print(f"{kind:6s} off {r['off_tok_s']:7.1f} tok/s  mtp {r['mtp_tok_s']:7.1f} tok/s  "
                  f"x{r['speedup']:.2f}  accepted length {r['mean_accepted_length']:.2f}  "
                  f"per position {r['accept_per_position']}  same tokens: {same}")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    print(json.dumps({"k": args.k, "max_tokens": args.max_tokens, "runs": args.runs, "results": results}))
    return 0 if all(r["same_tokens"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
