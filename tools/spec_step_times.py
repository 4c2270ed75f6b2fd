"""Step times around rejected drafts (not a test): without replay, the step after a rejection costs
what any step costs. The default model (or --model), batch 1, T = 0, the code / math / prose chat
prompts (pyengine/tools/data/prompts.jsonl, thinking off), --max_tokens 256, --runs 3, k = 1: every
verify drafts exactly one token, so a step that emits two tokens accepted its draft and one that
emits one rejected it. A step's time is the gap between the first token events of consecutive
steps (the stream events' token_steps / token_times): its forward, verify and the proposer's turn.
Reports the median / mean / p90 step time after an accepted and after a rejected draft, and plain
decode's (spec off, the same engine) for reference, per --algorithms (mtp, dflash); --device cuda on
the GPU. Prints the command, the machine and a JSON line.

  PYTHONPATH=. python3 tools/spec_step_times.py [--algorithms mtp,dflash] [--draft DIR] [--threads 2] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_spec import DEFAULT_DRAFT, device_options, first_prompt_of_each_kind

from pyengine import LLM, SamplingParams


def step_gaps(token_steps: list[int], token_times: list[float]) -> list[tuple[float, int]]:
    """(ms since the step before, tokens the step before emitted) per step after the first two."""
    firsts, counts = [], []
    for step, t in zip(token_steps, token_times):
        if firsts and firsts[-1][0] == step:
            counts[-1] += 1
            continue
        firsts.append((step, t))
        counts.append(1)
    return [(1e3 * (firsts[i][1] - firsts[i - 1][1]), counts[i - 1]) for i in range(2, len(firsts))]


def describe(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {"n": len(ms), "median_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms),
            "p90_ms": ms[int(0.9 * (len(ms) - 1))]} if ms else {"n": 0}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    ap.add_argument("--algorithms", default="mtp,dflash")
    ap.add_argument("--draft", default=DEFAULT_DRAFT, help="the DFlash draft's directory")
    ap.add_argument("--max_tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--cuda-graphs", action="store_true", help="engine option cuda_graphs (GPU)")
    args = ap.parse_args()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    results = {}
    for algo in [a for a in args.algorithms.split(",") if a]:
        kw = {"speculative_draft_model_path": args.draft} if algo == "dflash" else {}
        kw.update(device_options(args))
        with LLM(args.model, max_model_len=2048, max_batch=1, speculative_algorithm=algo, speculative_num_draft_tokens=1,
                 **kw) as llm:  # fmt: skip
            prompts = [llm.tokenizer.encode(llm.apply_chat_template(m, enable_thinking=False))
                       for m in first_prompt_of_each_kind().values()]  # fmt: skip
            plain, accepted, rejected = [], [], []
            for _ in range(args.runs):
                for p in prompts:
                    for spec in (False, True):
                        sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True,
                                            speculative=spec)  # fmt: skip
                        steps, times = [], []
                        for ev in llm.submit(prompt_token_ids=p, sampling_params=sp):
                            steps += ev.token_steps
                            times += ev.token_times
                        gaps = step_gaps(steps, times)[:-2]  # the last steps draft less (max_tokens)
                        if not spec:
                            plain += [ms for ms, _ in gaps]
                            continue
                        accepted += [ms for ms, n in gaps if n == 2]
                        rejected += [ms for ms, n in gaps if n == 1]
        r = {"plain": describe(plain), "after_accepted": describe(accepted), "after_rejected": describe(rejected)}
        r["rejected_over_accepted"] = r["after_rejected"]["median_ms"] / r["after_accepted"]["median_ms"]
        results[algo] = r
        for name in ("plain", "after_accepted", "after_rejected"):
            d = r[name]
            print(f"{algo:6s} {name:15s} n {d['n']:5d}  median {d['median_ms']:6.2f} ms  mean {d['mean_ms']:6.2f} ms  "
                  f"p90 {d['p90_ms']:6.2f} ms")  # fmt: skip
        print(f"{algo:6s} after a rejection / after an acceptance (medians): {r['rejected_over_accepted']:.3f}")
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    print(json.dumps({"max_tokens": args.max_tokens, "runs": args.runs, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
