"""Speculative decoding on the CPU (not a test): tokens/s with spec off, with the MTP proposer and
with a DFlash draft, the first users' method: one chat prompt per kind (code, math, prose;
pyengine/tools/data/prompts.jsonl, thinking off), T = 0, --max_tokens (256) with ignore_eos, median
of --runs (3), batch 1. Spec off and each proposer run interleaved (off, mtp, dflash, off, ...) in
one process, so load from other processes hits all alike. tok/s = tokens / (submit -> last token),
the first users' wall time. Also the mean accepted length (tokens per verify) and acceptance per
draft position, and that the tokens are the same with and without speculation. --device cuda
runs the engines on the GPU. --batch N > 1 submits N requests at once (every prompt of every kind,
cycled) and reports their total tokens/s (all tokens / submit -> last token). Prints the machine,
the command and a JSON line.

  PYTHONPATH=. python3 tools/bench_spec.py [--model DIR] [--algorithms mtp,dflash] [--draft DIR]
                                           [--k 3] [--dflash-k N] [--threads 2] [--device cuda] [--batch 8]
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


def prompts_by_kind() -> dict[str, list[list[dict]]]:
    out: dict[str, list[list[dict]]] = {}
    with open(PROMPTS) as f:
        for line in f:
            row = json.loads(line)
            out.setdefault(row["kind"], []).append(row["messages"])
    return out


def first_prompt_of_each_kind() -> dict[str, list[dict]]:
    return {kind: rows[0] for kind, rows in prompts_by_kind().items()}


def run_once(llm: LLM, prompts: list[list[int]], n: int, speculative: bool):
    """The prompts submitted at once -> (total tokens/s, tokens per prompt, spec counts per prompt)."""
    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, speculative=speculative)
    t0 = time.monotonic()
    outs = [s.result() for s in [llm.submit(prompt_token_ids=p, sampling_params=sp) for p in prompts]]
    rate = sum(len(o.token_ids) for o in outs) / (time.monotonic() - t0)
    return rate, [o.token_ids for o in outs], [o.speculative for o in outs]


def groups(llm: LLM, kinds: list[str], batch: int) -> dict[str, list[list[int]]]:
    """Batch 1: the first prompt of each kind; batch N: N prompts of the kinds, cycled, as one group."""
    def encode(messages: list[dict]) -> list[int]:
        return llm.tokenizer.encode(llm.apply_chat_template(messages, enable_thinking=False))

    rows = {k: v for k, v in prompts_by_kind().items() if k in kinds}
    if batch == 1:
        return {k: [encode(v[0])] for k, v in rows.items()}
    every = [v[i] for i in range(max(map(len, rows.values()))) for v in rows.values() if i < len(v)]  # kinds in turn
    return {f"batch{batch}": [encode(every[i % len(every)]) for i in range(batch)]}


DEFAULT_DRAFT = os.path.join(os.path.dirname(__file__), "..", "pyengine", "default_model", "dflash")


def device_options(args) -> dict:
    """The engine options of --device / --threads. On the GPU each engine gets 1 GiB of KV cache:
    the default would take 90 % of the card for the first engine and leave the next none.
    --cuda-graphs: the engine option cuda_graphs (decode-only steps replayed from graphs)."""
    if args.device == "cpu":
        return {"num_threads": args.threads}
    return {"device": args.device, "kv_cache_bytes": 1 << 30, "cuda_graphs": bool(getattr(args, "cuda_graphs", False))}


def summary(spec: list[dict]) -> dict:
    drafted = [sum(x) for x in zip(*(s["spec_drafted_per_position"] for s in spec))]
    accepted = [sum(x) for x in zip(*(s["spec_accepted_per_position"] for s in spec))]
    return {"mean_accepted_length": (sum(accepted) + drafted[0]) / drafted[0] if drafted else 1.0,
            "accept_per_position": [round(a / d, 3) for a, d in zip(accepted, drafted)]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    ap.add_argument("--algorithms", default="mtp,dflash", help="proposers to measure: mtp, dflash or both")
    ap.add_argument("--draft", default=DEFAULT_DRAFT, help="the DFlash draft's directory (default: the embedded one)")
    ap.add_argument("--k", type=int, default=3, help="MTP speculative_num_draft_tokens (default 3)")
    ap.add_argument("--dflash-k", type=int, default=None, help="DFlash speculative_num_draft_tokens (default: block - 1)")
    ap.add_argument("--max_tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--kinds", default="code,math,prose")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--batch", type=int, default=1, help="requests at once (> 1: one group of every kind's prompts)")
    ap.add_argument("--cuda-graphs", action="store_true", help="engine option cuda_graphs (GPU)")
    args = ap.parse_args()
    algos = [a for a in args.algorithms.split(",") if a]
    if not algos or any(a not in ("mtp", "dflash") for a in algos):
        ap.error("--algorithms takes mtp and / or dflash")
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    engines = {}
    try:
        for a in algos:
            kw = {"speculative_num_draft_tokens": args.k} if a == "mtp" else \
                {"speculative_num_draft_tokens": args.dflash_k, "speculative_draft_model_path": args.draft}
            engines[a] = LLM(args.model, max_model_len=2048, max_batch=args.batch, speculative_algorithm=a,
                             **device_options(args), **kw)  # fmt: skip
        # Spec off: the first engine's per-request switch (the same engine, the same memory plan).
        first = engines[algos[0]]
        results = {}
        for kind, prompts in groups(first, args.kinds.split(","), args.batch).items():
            for llm in engines.values():
                run_once(llm, prompts, 16, True)  # warm-up
            off, base = [], None
            on = {a: [] for a in algos}
            spec = {a: [] for a in algos}
            same = {a: True for a in algos}
            for _ in range(args.runs):
                rate, base, _ = run_once(first, prompts, args.max_tokens, False)
                off.append(rate)
                for a, llm in engines.items():
                    rate, toks, s = run_once(llm, prompts, args.max_tokens, True)
                    on[a].append(rate)
                    same[a] = same[a] and toks == base
                    spec[a].extend(s)
            r = {"off_tok_s": statistics.median(off), "runs_off": off}
            line = f"{kind:6s} off {r['off_tok_s']:7.1f} tok/s"
            for a in algos:
                r[a] = {"tok_s": statistics.median(on[a]), "speedup": statistics.median(on[a]) / statistics.median(off),
                        **summary(spec[a]), "same_tokens": same[a], "runs": on[a]}  # fmt: skip
                line += (f" | {a} {r[a]['tok_s']:7.1f} tok/s x{r[a]['speedup']:.2f} accepted length "
                         f"{r[a]['mean_accepted_length']:.2f} per position {r[a]['accept_per_position']} "
                         f"same tokens: {same[a]}")  # fmt: skip
            results[kind] = r
            print(line)
    finally:
        for llm in engines.values():
            llm.close()
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    print(json.dumps({"k": args.k, "dflash_k": args.dflash_k, "max_tokens": args.max_tokens, "runs": args.runs,
                      "device": args.device, "batch": args.batch, "cuda_graphs": args.cuda_graphs, "results": results}))  # fmt: skip
    return 0 if all(r[a]["same_tokens"] for r in results.values() for a in algos) else 1


if __name__ == "__main__":
    sys.exit(main())
