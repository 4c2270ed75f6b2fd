"""CPU speed benchmark (not a test): single-stream decode and prefill tokens/s of a model.

  decode   a short prompt, then --decode-tokens greedy tokens (ignore_eos); tokens/s from the
           engine's per-token times, first token (prefill) excluded: (n-1) / (t_last - t_first)
  prefill  a --prefill-tokens prompt as one request with max_tokens=1; tokens/s = prompt tokens /
           (submit -> first token) wall time, prefix cache off so every repeat really prefills
Each is the median of --repeats runs (after one warm-up run of each). Prints the machine (cores,
load average before and after: other processes on the machine slow it down), the command and a
JSON line.

  PYENGINE_LIBRARY=... PYTHONPATH=. python3 tools/bench_cpu.py [--model DIR] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time

from pyengine import LLM, SamplingParams


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def prompt_ids(llm: LLM, n: int, seed: int) -> list[int]:
    """n tokens of real text (this file's source, repeated) so the model sees ordinary input."""
    with open(os.path.abspath(__file__), encoding="utf-8") as f:
        ids = llm.tokenizer.encode(f.read())
    r = random.Random(seed)
    start = r.randrange(len(ids))
    out = (ids[start:] + ids) * (n // len(ids) + 2)
    return out[:n]


def decode_rate(llm: LLM, prompt: list[int], n: int) -> float:
    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    times: list[float] = []
    for ev in llm.submit(prompt_token_ids=prompt, sampling_params=sp):
        times += ev.token_times
    assert len(times) == n, (len(times), n)
    return (n - 1) / (times[-1] - times[0])


def prefill_rate(llm: LLM, prompt: list[int]) -> float:
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    t0 = time.monotonic()
    stream = llm.submit(prompt_token_ids=prompt, sampling_params=sp)
    for _ in stream:
        pass
    return len(prompt) / (time.monotonic() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None, help="model dir (default: the embedded default model)")
    ap.add_argument("--threads", type=int, default=0, help="engine CPU threads (0: all cores)")
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--decode-prompt", type=int, default=16, help="prompt tokens before decoding")
    ap.add_argument("--prefill-tokens", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=512, help="chunked_prefill_size")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", default="", help="decode or prefill")
    args = ap.parse_args(argv)
    command = (
        "python3 tools/bench_cpu.py"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    )
    load0 = os.getloadavg()
    llm = LLM(
        args.model,
        max_batch=1,
        max_model_len=max(4096, args.prefill_tokens + 16),
        num_threads=args.threads,
        chunked_prefill_size=args.chunk,
        prefix_cache=False,
    )
    info = {
        "command": command,
        "model": llm.model_path,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": args.threads or os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load0],
    }
    print(
        f"machine: {info['cpu']}, {info['cores']} cores, load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}"
    )
    print(f"command: {command}")
    result = dict(info)
    if "decode" not in args.skip:
        prompt = prompt_ids(llm, args.decode_prompt, 0)
        decode_rate(llm, prompt, 32)  # warm-up
        runs = [
            decode_rate(llm, prompt_ids(llm, args.decode_prompt, i + 1), args.decode_tokens)
            for i in range(args.repeats)
        ]
        result["decode_tok_s"] = round(statistics.median(runs), 1)
        result["decode_runs"] = [round(x, 1) for x in runs]
        print(
            f"decode : {result['decode_tok_s']:8.1f} tok/s  (median of {runs and len(runs)}: "
            f"{', '.join(f'{x:.1f}' for x in runs)}; {args.decode_tokens} tokens after a {args.decode_prompt}-token prompt)"
        )
    if "prefill" not in args.skip:
        prefill_rate(llm, prompt_ids(llm, min(512, args.prefill_tokens), 100))  # warm-up
        runs = [
            prefill_rate(llm, prompt_ids(llm, args.prefill_tokens, 200 + i))
            for i in range(args.repeats)
        ]
        result["prefill_tok_s"] = round(statistics.median(runs), 1)
        result["prefill_runs"] = [round(x, 1) for x in runs]
        print(
            f"prefill: {result['prefill_tok_s']:8.1f} tok/s  (median of {len(runs)}: "
            f"{', '.join(f'{x:.1f}' for x in runs)}; {args.prefill_tokens}-token prompt, max_tokens=1, chunk {args.chunk})"
        )
    llm.close()
    result["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
