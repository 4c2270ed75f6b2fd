"""Decodes during a long prefill, per max_step_ms (the engine's step time limit). Not a test.

For each --max_step_ms value, one engine on one model (the embedded default model on the CPU, or
with --shape27b the 27B shape of MODEL_SPEC.md with dummy FP8 weights on CUDA), in this order:
  warm-up    a 16-token request (a prefill, decode steps) and a prompt of two full chunks: the
             engine's step-cost model gets ready, first-use costs are paid before anything is timed
  alone      the long prompt alone: its prefill tokens/s (submit -> first token)
  ttft       the long prompt again, a short request (16 tokens) submitted after --ttft-after steps
             of it: the short one's first-token time / the long one's prefill time
  decoders   for each --decoders N: N requests decode (solo rate measured first), then the long
             prompt arrives; while it prefills: the decoders' inter-token latency p50 / p99 (all
             gaps of all decoders), their tokens/s (per decoder), and the long prompt's prefill
             tokens/s and its share of the alone rate
and the engine's view at the end: the fitted step-cost model and its paced steps.
Every prompt is distinct (prefix cache off unless --prefix-cache), greedy, ignore_eos.

  PYTHONPATH=. python3 tools/bench_stall_free.py                      # CPU, default model
  PYTHONPATH=. python3 tools/bench_stall_free.py --shape27b --long 32768 --chunk 512 \\
      --decoders 1 4 --max_step_ms 0 30 60 -1 --out stall_free.json   # GPU
max_step_ms: > 0 a limit in ms, 0 derived per step (the default), < 0 off (full chunks).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100.0 * len(s) + 0.5)) - 1))]


def histogram_delta(a: dict, b: dict) -> dict:
    """What an engine histogram (EngineStats) counted between two stats() calls."""
    return {"upper_bounds": b["upper_bounds"], "counts": [y - x for x, y in zip(a["counts"], b["counts"])],
            "count": b["count"] - a["count"], "sum": b["sum"] - a["sum"]}  # fmt: skip


def histogram_line(h: dict, scale: float, unit: str) -> str:
    """Non-empty buckets as '<= bound: count' (scale: bound multiplier for printing)."""
    bounds = [f"<={b * scale:g}{unit}" for b in h["upper_bounds"]] + [">"]
    return " ".join(f"{lab}:{c}" for lab, c in zip(bounds, h["counts"]) if c)


class Bench:
    def __init__(self, engine, vocab: tuple[int, int]):
        self.engine = engine
        self.vocab = vocab
        self.seed = 0

    def prompt(self, n: int) -> list[int]:
        self.seed += 1
        rng = random.Random(self.seed)
        return [rng.randrange(*self.vocab) for _ in range(n)]

    def submit(self, n_prompt: int, max_tokens: int):
        from pyengine.sampling_params import SamplingParams

        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return self.engine.add_request(self.prompt(n_prompt), sp, 0)

    @staticmethod
    def token_times(q, count: int | None = None, timeout: float = 900) -> list[float]:
        """Token times from a request's queue: `count` of them, or all until it finishes."""
        times = []
        while count is None or len(times) < count:
            ev = q.get(timeout=timeout)
            if ev.finished:
                if ev.finish_reason not in ("length", "stop", "cancelled"):
                    raise RuntimeError(f"request ended with {ev.finish_reason}: {ev.error}")
                break
            times.append(ev.time)
        return times

    def steps(self) -> int:
        return self.engine.stats()["steps"]

    def prefill(self, n: int) -> float:
        """Seconds from submitting an n-token prompt to its first token."""
        t0 = time.monotonic()
        _, q = self.submit(n, 1)
        return self.token_times(q)[0] - t0

    def ttft_during(self, n: int, after_steps: int) -> tuple[float, float]:
        """(short request's first-token time, long prompt's prefill time)."""
        t0 = time.monotonic()
        start = self.steps()
        _, q = self.submit(n, 1)
        while self.steps() < start + after_steps:
            time.sleep(0.0002)
        t_short = time.monotonic()
        _, qs = self.submit(16, 2)
        short_first = self.token_times(qs)[0]
        return short_first - t_short, self.token_times(q)[0] - t0

    def histograms(self) -> dict:
        st = self.engine.stats()
        return {k: st[k] for k in ("step_seconds", "prefill_tokens_per_step")}

    def decoders_during(self, n_decoders: int, n: int, solo_tokens: int) -> dict:
        ids = [self.submit(16, 1 << 20) for _ in range(n_decoders)]
        solo = [self.token_times(q, solo_tokens) for _, q in ids]
        start = max(ts[1] for ts in solo)  # after every decoder's first gap
        solo_rate = statistics.median(sum(1 for t in ts if t > start) / (ts[-1] - start) for ts in solo
                                      if ts[-1] > start)  # fmt: skip
        before = self.histograms()
        t_long = time.monotonic()
        _, q = self.submit(n, 1)
        long_first = self.token_times(q)[0]
        after = self.histograms()
        for rid, _ in ids:
            self.engine.cancel(rid)
        gaps, rates = [], []
        for _, dq in ids:
            during = [t for t in self.token_times(dq) if t_long <= t <= long_first]
            gaps += [b - a for a, b in zip(during, during[1:])]
            rates.append(len(during) / (long_first - t_long))
        return {"decoders": n_decoders, "prefill_s": long_first - t_long, "itl_p50_ms": percentile(gaps, 50) * 1e3,
                "itl_p99_ms": percentile(gaps, 99) * 1e3, "itl_max_ms": max(gaps) * 1e3, "itl_samples": len(gaps),
                "decode_tok_s": statistics.mean(rates), "solo_decode_tok_s": solo_rate,
                "steps": {k: histogram_delta(before[k], after[k]) for k in after}}  # fmt: skip


def load_model(args):
    from pyengine.config import ModelConfig
    from pyengine.model_loader import NativeModel

    if args.shape27b:
        from tools.bench_gpu import weight_copy, write_config

        cfg_dir = write_config(args.layers)
        model = NativeModel(cfg_dir, ModelConfig.from_dir(cfg_dir), args.device or "cuda", weight_quant="fp8",
                            load_format="dummy", prefill_weight_copy=weight_copy(args.prefill_weight_copy))  # fmt: skip
        return model, (1000, 200000), cfg_dir
    from pyengine.llm import default_model_path

    path = args.model or default_model_path()
    config = ModelConfig.from_dir(path)
    return NativeModel(path, config, args.device or "cpu"), (0, min(config.vocab_size, 500)), path


def run_setting(model, vocab, args, max_step_ms: float) -> dict:
    from pyengine.engine import EngineArgs, NativeEngine

    kw = dict(max_batch=max(args.decoders) + 2, max_model_len=args.long + 4096, chunked_prefill_size=args.chunk,
              prefix_cache=args.prefix_cache, max_step_ms=max_step_ms, num_threads=args.threads)  # fmt: skip
    if args.shape27b and model.device == "cuda":
        kw.update(kv_cache_dtype="fp16", gpu_mem_ratio=0.92)
    engine = NativeEngine(model, EngineArgs(**kw), [])
    try:
        b = Bench(engine, vocab)
        b.token_times(b.submit(16, 16)[1])  # a first prefill and decode steps for the cost model
        b.prefill(2 * args.chunk)  # full chunks once before they are timed (first-use costs)
        alone_s = b.prefill(args.long)
        ttft_s, ttft_prefill_s = b.ttft_during(args.long, args.ttft_after)
        out = {"max_step_ms": max_step_ms, "alone_prefill_s": alone_s, "alone_prefill_tok_s": args.long / alone_s,
               "ttft_s": ttft_s, "ttft_prefill_s": ttft_prefill_s, "ttft_ratio": ttft_s / ttft_prefill_s,
               "runs": []}  # fmt: skip
        for n_dec in args.decoders:
            r = b.decoders_during(n_dec, args.long, args.solo_tokens)
            r["prefill_tok_s"] = args.long / r["prefill_s"]
            r["prefill_share_of_alone"] = r["prefill_tok_s"] / out["alone_prefill_tok_s"]
            out["runs"].append(r)
        st = engine.stats()
        keys = [k for k in st if k.startswith(("cost_", "step_", "paced_steps")) and not isinstance(st[k], dict)]
        out["engine"] = {k: st[k] for k in keys}
        return out
    finally:
        engine.close()


def report(res: dict) -> None:
    ms = res["max_step_ms"]
    label = "derived (default)" if ms == 0 else "off" if ms < 0 else f"{ms:g} ms"
    print(f"max_step_ms {label}: long prefill alone {res['alone_prefill_tok_s']:.1f} tok/s "
          f"({res['alone_prefill_s']:.2f} s); short request's TTFT {res['ttft_s'] * 1e3:.1f} ms = "
          f"{res['ttft_ratio'] * 100:.2f} % of the long prefill ({res['ttft_prefill_s']:.2f} s)")  # fmt: skip
    for r in res["runs"]:
        print(f"  {r['decoders']} decoding: ITL p50 {r['itl_p50_ms']:7.1f} ms  p99 {r['itl_p99_ms']:7.1f} ms  "
              f"(max {r['itl_max_ms']:.1f}, {r['itl_samples']} gaps)  decode {r['decode_tok_s']:6.1f} tok/s each "
              f"(solo {r['solo_decode_tok_s']:.1f})  prefill {r['prefill_tok_s']:8.1f} tok/s = "
              f"{r['prefill_share_of_alone'] * 100:5.1f} % of alone", flush=True)  # fmt: skip
        st, pt = r["steps"]["step_seconds"], r["steps"]["prefill_tokens_per_step"]
        print(f"    {st['count']} steps, {st['sum'] / max(st['count'], 1) * 1e3:.1f} ms mean: "
              f"{histogram_line(st, 1e3, 'ms')}", flush=True)  # fmt: skip
        print(f"    prefill tokens per step: {histogram_line(pt, 1, '')}", flush=True)
    e = res["engine"]
    print(f"  cost model (ms): base {e['cost_base_ms']:.3f} + {e['cost_decode_row_ms']:.3f}/decode row + "
          f"{e['cost_prefill_step_ms']:.3f}/step with prefill + {e['cost_prefill_token_ms']:.4f}/prefill token + "
          f"{e['cost_attention_ms']:.3f}/M attended pairs; scales decode {e['cost_scale_decode_only']:.3f} "
          f"prefill {e['cost_scale_prefill_only']:.3f} mixed {e['cost_scale_mixed']:.3f}; "
          f"paced steps {e['paced_steps']}", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape27b", action="store_true", help="27B shape, dummy FP8 weights, on CUDA")
    ap.add_argument("--model", default=None, help="checkpoint (default: the embedded default model)")
    ap.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda with --shape27b, else cpu")
    ap.add_argument("--layers", type=int, default=64, help="--shape27b: layers (64: the 27B model)")
    ap.add_argument("--long", type=int, default=4096, help="tokens of the long prompt")
    ap.add_argument("--chunk", type=int, default=512, help="chunked_prefill_size")
    ap.add_argument("--decoders", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--max_step_ms", type=float, nargs="+", default=[0.0, -1.0])
    ap.add_argument("--solo-tokens", type=int, default=24, help="tokens each decoder makes before the long prompt")
    ap.add_argument("--ttft-after", type=int, default=3, help="steps of the long prefill before the short request")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--prefix-cache", action="store_true",
                    help="prefix cache on (no hits: its GDN snapshots every 16 pages split the chunks' GDN work)")
    ap.add_argument("--prefill-weight-copy", choices=["auto", "on", "off"], default="auto",
                    help="--shape27b: the model option prefill_weight_copy (FP8 row-major copies, sm_90 prefill GEMM)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model, vocab, source = load_model(args)
    name = f"27B shape ({args.layers} layers), dummy FP8" if args.shape27b else os.path.basename(source.rstrip("/"))
    where = f"{name}, {model.device}"
    print(f"{where}: long prompt {args.long} tokens, chunk {args.chunk}, decoders {args.decoders}, "
          f"prefix cache {'on' if args.prefix_cache else 'off'}", flush=True)
    results = {"command": " ".join(sys.argv), "model": where, "settings": []}
    for ms in args.max_step_ms:
        res = run_setting(model, vocab, args, ms)
        report(res)
        results["settings"].append(res)
    print(json.dumps(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
