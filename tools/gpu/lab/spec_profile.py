"""Where a speculative step's time goes on the GPU (lab, not a test): the default model on CUDA,
plain decode and each proposer at --batch sizes, each run under torch.profiler (CUPTI: every
kernel, copy and driver call of the process, the library's included). Per run: steps, tokens,
wall ms per step, GPU busy ms per step (kernels + copies), and per step the launches, copies,
syncs and allocations the host made; then the heaviest kernels and host calls by total time.

  PYTHONPATH=. python3 tools/gpu/lab/spec_profile.py [--batch 1 8] [--tokens 128] [--top 12]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import torch  # CUPTI through torch.profiler
from bench_spec import DEFAULT_DRAFT, groups
from torch.profiler import ProfilerActivity, profile

from pyengine import LLM, SamplingParams

HOST_KINDS = {"launch": ("LaunchKernel", "cuLaunch"), "copy": ("Memcpy",), "sync": ("Synchronize",),
              "alloc": ("Malloc", "MemAlloc", "cuMemCreate"), "free": ("Free",), "graph": ("Graph",)}  # fmt: skip


def device_us(e) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(e, name):
            return float(getattr(e, name))
    return 0.0


def profile_run(llm: LLM, prompts: list[list[int]], tokens: int, speculative: bool, top: int) -> None:
    sp = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, speculative=speculative)
    before = llm.stats()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.monotonic()
        outs = [s.result() for s in [llm.submit(prompt_token_ids=p, sampling_params=sp) for p in prompts]]
        wall = time.monotonic() - t0
        torch.cuda.synchronize()
    after = llm.stats()
    steps = max(1, after["step_seconds"]["count"] - before["step_seconds"]["count"])
    n_tok = sum(len(o.token_ids) for o in outs)
    kernels, host = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    busy = 0.0
    for e in prof.key_averages():
        d = device_us(e)
        if str(getattr(e, "device_type", "")).endswith("CUDA"):  # a kernel, copy or memset on the GPU
            kernels[e.key][0] += e.count
            kernels[e.key][1] += d
            busy += d
        elif e.key.startswith(("cu", "cuda")):
            host[e.key][0] += e.count
            host[e.key][1] += e.cpu_time_total
    per = {k: sum(c for name, (c, _) in host.items() if any(p in name for p in pats)) / steps
           for k, pats in HOST_KINDS.items()}  # fmt: skip
    propose = after["spec_propose_seconds"] - before["spec_propose_seconds"]
    print(f"  {'spec' if speculative else 'off '}: {steps} steps, {n_tok} tokens ({n_tok / wall:.0f} tok/s), "
          f"wall {1e3 * wall / steps:.3f} ms/step, GPU busy {busy / 1e3 / steps:.3f} ms/step, propose "
          f"{1e3 * propose / steps:.3f} ms/step; per step: " + ", ".join(f"{k} {v:.1f}" for k, v in per.items()))
    print("    kernels (calls/step, us/step):")
    for name, (c, d) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"      {c / steps:6.2f} {d / steps:8.2f}  {name[:110]}")
    print("    host calls (calls/step, us/step):")
    for name, (c, d) in sorted(host.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"      {c / steps:6.2f} {d / steps:8.2f}  {name[:110]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--algorithms", default="mtp,dflash")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    torch.cuda.init()
    for batch in args.batch:
        for algo in args.algorithms.split(","):
            kw = {"speculative_num_draft_tokens": 3} if algo == "mtp" else {"speculative_draft_model_path": DEFAULT_DRAFT}
            with LLM(device="cuda", kv_cache_bytes=1 << 30, max_model_len=2048, max_batch=batch,
                     speculative_algorithm=algo, **kw) as llm:  # fmt: skip
                prompts = next(iter(groups(llm, ["code"] if batch == 1 else ["code", "math", "prose"], batch).values()))
                for spec in (False, True):  # warm-up
                    [s.result() for s in [llm.submit(prompt_token_ids=p, sampling_params=SamplingParams(
                        max_tokens=32, temperature=0.0, ignore_eos=True, speculative=spec)) for p in prompts]]  # fmt: skip
                print(f"batch {batch}, {algo}:")
                for spec in (False, True):
                    profile_run(llm, prompts, args.tokens, spec, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
