"""Cooperative prefill benchmark (CPU or GPU): what a long prompt costs short requests.

For cooperative_prefill on and off it prints
  ttft_ratio    = the short request's first-token time / the long prompt's prefill time
                  (short submitted while the long one prefills; lower is better, 1.0 = it waited)
  decode_ratio  = a running short request's decode speed while the long prompt prefills /
                  its solo decode speed (higher is better, 0 = it stalled)
Usage: python tools/bench_cooperative.py [--model DIR] [--long 4096] [--chunk 256] [--max_step_ms MS]
(--max_step_ms: the engine option; 0, the default, derived; -1: off, full prefill chunks)
"""

from __future__ import annotations

import argparse
import os
import random
import time

from pyengine import LLM, SamplingParams

HERE = os.path.dirname(os.path.abspath(__file__))


def ids(n: int, seed: int, vocab: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(vocab) for _ in range(n)]


def token_times(stream) -> list[float]:
    times = []
    for ev in stream:
        times += ev.token_times
    return times


def rate(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0


def wait_started(llm: LLM, steps: int) -> None:
    start = llm.stats()["steps"]
    while llm.stats()["steps"] < start + steps:
        time.sleep(0.0002)


def run_mode(args, cooperative: bool, vocab: int) -> dict:
    greedy = dict(temperature=0.0, ignore_eos=True)
    kw = dict(max_batch=4, max_model_len=args.long + 1000, chunked_prefill_size=args.chunk,
              cooperative_prefill=cooperative, prefix_cache=False, max_step_ms=args.max_step_ms)  # fmt: skip
    with LLM(args.model, **kw) as llm:
        solo = token_times(llm.submit(prompt_token_ids=ids(16, 1, vocab),
                                      sampling_params=SamplingParams(max_tokens=64, **greedy)))  # fmt: skip
        # (a) a short request arrives while the long prompt prefills
        t_long = time.monotonic()
        long = llm.submit(prompt_token_ids=ids(args.long, 2, vocab), sampling_params=SamplingParams(max_tokens=1, **greedy))
        wait_started(llm, 2)
        t_short = time.monotonic()
        short = llm.submit(prompt_token_ids=ids(16, 3, vocab), sampling_params=SamplingParams(max_tokens=4, **greedy))
        short_first = token_times(short)[0]
        long_first = token_times(long)[0]
        ttft_ratio = (short_first - t_short) / (long_first - t_long)
        # (b) a short request is decoding when the long prompt arrives
        running = llm.submit(prompt_token_ids=ids(16, 4, vocab), sampling_params=SamplingParams(max_tokens=100000, **greedy))
        it = iter(running)
        next(it)
        t_long = time.monotonic()
        long = llm.submit(prompt_token_ids=ids(args.long, 5, vocab), sampling_params=SamplingParams(max_tokens=1, **greedy))
        long_first = token_times(long)[0]
        running.cancel()
        during = [t for t in token_times(it) if t_long <= t <= long_first]
        during_rate = len(during) / (long_first - t_long)  # tokens it got while the long one prefilled
        return {
            "long_prefill_s": long_first - t_long,
            "ttft_ratio": ttft_ratio,
            "decode_ratio": during_rate / rate(solo) if rate(solo) else 0.0,
            "solo_tok_s": rate(solo),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(HERE, "..", "tests", "data", "ckpt_text_bf16"))
    p.add_argument("--long", type=int, default=3000)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--max_step_ms", type=float, default=0.0)
    args = p.parse_args()
    from pyengine.config import ModelConfig

    vocab = min(ModelConfig.from_dir(args.model).vocab_size, 500)
    print(f"model {os.path.basename(os.path.abspath(args.model))}, long prompt {args.long} tokens, chunk {args.chunk}, "
          f"max_step_ms {args.max_step_ms:g}")
    print(f"{'cooperative':>11} {'long prefill s':>14} {'ttft_ratio':>10} {'decode_ratio':>12} {'solo tok/s':>10}")
    for cooperative in (True, False):
        r = run_mode(args, cooperative, vocab)
        print(f"{'on' if cooperative else 'off':>11} {r['long_prefill_s']:14.3f} {r['ttft_ratio']:10.3f} "
              f"{r['decode_ratio']:12.3f} {r['solo_tok_s']:10.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
