"""GPU benchmark of the 27B shape with dummy weights (issue 6). Not a test.

Measures in ONE run, on the GPU it runs on:
  hardware   device-to-device copy bandwidth (bytes read + written, torch) and the bf16 matmul
             rate (torch.matmul 8192^3): the two roofs the engine's numbers are divided by
  decode     tokens/s at batch 1, 2, 8 (dummy FP8 weights, prompt 32 tokens, greedy, ignore_eos;
             steady state: token times after every request has its first token), bytes read per
             step (weights except the embedding table, which is gathered, + GDN state read and
             written + KV) and that traffic / step time / copy bandwidth = the HBM roofline share
  prefill    tokens/s of one 4K and one 32K prompt (submit -> first token), and the share of the
             bf16 matmul rate (2 * matmul params * tokens/s; attention FLOPs not counted)
  breakdown  (--prefill-breakdown) where one more prompt of each size spends its prefill: the
             kernels recorded by CUPTI (torch.profiler), grouped as GEMMs, GDN (chunked rule, gates),
             conv, attention (inputs, prefill kernel), norms / glue, and the gaps with no kernel
             running, each with its share of the wall time; the GEMMs also as TFLOP/s and their
             share of the bf16 matmul rate (2 * matmul params without the lm_head * tokens)
  depth      decode step time at context depth 1K, 8K, 32K, 64K for each KV dtype, on
             --depth-layers layers of the 27B attention-layer shape, all attention (default 8; a
             64K prefill of all 64 layers per dtype would cost minutes of GPU time, and GDN layers
             do not depend on the depth); --depth-rounds interleaved rounds over one engine per
             dtype: the least over the rounds of a request's median of 60 decode steps, and the
             median per-round difference to fp16 (the 64-layer model has 16 attention layers)
  hf         (--hf) Hugging Face transformers, bf16, eager, random weights, same config: decode
             tokens/s at batch 1 and prefill tokens/s at 4K, in a subprocess after the engine's GPU
             memory is released
  graphs     (--cuda-graphs) the decode rows again with the engine option cuda_graphs on (same
             model, a second engine), and the same A/B on the embedded default model (tiny, so
             launch-bound: where replaying graphs matters most)

Every engine runs with the engine option overlap_schedule at its default (on for CUDA) unless
--overlap-schedule on / off says otherwise.

  PYTHONPATH=. python3 tools/bench_gpu.py [--hf] [--skip-depth] [--cuda-graphs] [--prefill-sizes N ...]
                                          [--prefill-breakdown] [--out results.json]     (--prefill-sizes with no sizes: none)
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# MODEL_SPEC.md §1: the 27B-class dense shape.
CONFIG_27B = {
    "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 248320,
    "hidden_size": 5120, "num_hidden_layers": 64, "intermediate_size": 17408, "num_attention_heads": 24,
    "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6, "partial_rotary_factor": 0.25, "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": False, "hidden_act": "silu", "mtp_num_hidden_layers": 0, "eos_token_id": 248046,
    "attention_bias": False, "full_attention_interval": 4,
}  # fmt: skip


def write_config(layers: int, attention_only: bool = False) -> str:
    cfg = dict(CONFIG_27B, num_hidden_layers=layers)
    cfg["layer_types"] = ["full_attention" if attention_only or (i + 1) % 4 == 0 else "linear_attention"
                          for i in range(layers)]  # fmt: skip
    d = tempfile.mkdtemp(prefix=f"pe27b_{layers}_")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def matmul_params(c: dict) -> int:
    """Weights every token multiplies (lm_head included, embedding excluded)."""
    H, I, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    n_full = sum(1 for t in c["layer_types"] if t == "full_attention")
    n_gdn = L - n_full
    D, Hq, Hkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    Hk, Hv, dk, dv = (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
                      c["linear_value_head_dim"])  # fmt: skip
    mlp = 3 * H * I
    attn = H * (2 * Hq * D + 2 * Hkv * D) + Hq * D * H
    gdn = H * (2 * Hk * dk + Hv * dv + Hv * dv + 2 * Hv) + Hv * dv * H
    return L * mlp + n_full * attn + n_gdn * gdn + c["vocab_size"] * H


def gdn_step_bytes(c: dict) -> tuple[int, int]:
    """GDN state bytes one decode step reads and writes per sequence: the recurrent state both
    ways; of the conv ring (K rows a layer) the older positions' K - 1 rows read, one written."""
    n_gdn = sum(1 for t in c["layer_types"] if t == "linear_attention")
    row = (2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] +
           c["linear_num_value_heads"] * c["linear_value_head_dim"])  # fmt: skip
    rec = c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"]
    return n_gdn * ((c["linear_conv_kernel_dim"] - 1) * row + rec) * 4, n_gdn * (row + rec) * 4


# ---- hardware roofs (torch) ----
def copy_bandwidth() -> float:
    import torch

    n = 4 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t = time.perf_counter()
    reps = 10
    for _ in range(reps):
        b.copy_(a)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / reps
    del a, b
    torch.cuda.empty_cache()
    return 2 * n / dt


def bf16_matmul_rate() -> float:
    import torch

    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    reps = 20
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / reps
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / dt


# ---- the engine ----
def make_model(cfg_dir: str):
    """The dummy FP8 model of cfg_dir on the GPU."""
    from pyengine.config import ModelConfig
    from pyengine.model_loader import NativeModel

    return NativeModel(cfg_dir, ModelConfig.from_dir(cfg_dir), "cuda", weight_quant="fp8", load_format="dummy",
                       prefill_weight_copy=weight_copy(PREFILL_WEIGHT_COPY))


PREFILL_WEIGHT_COPY = "auto"  # --prefill-weight-copy


def weight_copy(flag: str) -> bool | None:
    """The model option prefill_weight_copy of an auto / on / off flag."""
    return None if flag == "auto" else flag == "on"


def make_engine(cfg_dir: str, kv: str, max_len: int, max_batch: int, chunk: int, **kw):
    t = time.perf_counter()
    model = make_model(cfg_dir)
    load_s = time.perf_counter() - t
    return model, engine_on(model, kv, max_len, max_batch, chunk, **kw), load_s


OVERLAP_SCHEDULE = "auto"  # --overlap-schedule


def engine_on(model, kv: str, max_len: int, max_batch: int, chunk: int, cuda_graphs: bool = False, **kw):
    from pyengine.engine import EngineArgs, NativeEngine

    kw.setdefault("gpu_mem_ratio", 0.92)
    if OVERLAP_SCHEDULE != "auto":
        kw.setdefault("overlap_schedule", OVERLAP_SCHEDULE == "on")
    args = EngineArgs(max_batch=max_batch, max_model_len=max_len, chunked_prefill_size=chunk,
                      max_num_batched_tokens=chunk + max_batch, kv_cache_dtype=kv, prefix_cache=True,
                      cuda_graphs=cuda_graphs, **kw)  # fmt: skip
    return NativeEngine(model, args, [])


def run(engine, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[float]]]:
    """Submits all prompts at once; returns the submit time and each request's token times."""
    from pyengine.sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.monotonic()
    qs = [q for _, q in engine.add_requests([(p, sp, 0) for p in prompts])]  # one admission for all
    times = []
    for q in qs:
        ts = []
        while True:
            ev = q.get(timeout=600)
            if ev.finished:
                if ev.finish_reason not in ("length", "stop"):
                    raise RuntimeError(f"request ended with {ev.finish_reason}: {ev.error}")
                break
            ts.append(ev.time)
        times.append(ts)
    return t0, times


def decode_rate(engine, batch: int, n_tokens: int, seed: int, vocab: int = 200000) -> tuple[float, float]:
    """(tokens/s over all requests, seconds per step) in the window where all are decoding."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(min(1000, vocab // 2), vocab) for _ in range(32)] for _ in range(batch)]
    _, times = run(engine, prompts, n_tokens)
    start = max(ts[0] for ts in times)
    end = min(ts[-1] for ts in times)
    steps = [sum(1 for t in ts if start < t <= end) for ts in times]
    step_s = (end - start) / max(1, min(steps))
    return batch / step_s, step_s


def prefill_rate(engine, n: int, seed: int) -> float:
    rng = random.Random(seed)
    prompt = [rng.randrange(1000, 200000) for _ in range(n)]
    t0, times = run(engine, [prompt], 1)
    return n / (times[0][0] - t0)


# Kernel groups of the prefill breakdown: the first whose pattern is in the kernel's short name.
PREFILL_GROUPS = [("gemm", ("gemm",)), ("gdn", ("gdn_",)), ("conv", ("conv",)),
                  ("attention", ("attention", "prefill_mma", "prefill_sm80", "prefill_sm90", "kv_write"))]  # fmt: skip


def prefill_breakdown(engine, n: int, seed: int, gemm_flops: float, mm: float, top: int = 0) -> dict:
    """Profiles one prefill of n tokens (a fresh prompt: no prefix-cache hit) and prints each kernel
    group's device time (exclusive: while it is the earliest-started kernel running) and share of
    the wall time from the first kernel's start to the last one's end."""
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, os.path.join(ROOT, "tools", "gpu"))
    from timeline_decode import load_trace, sweep

    rng = random.Random(seed)
    prompt = [rng.randrange(1000, 200000) for _ in range(n)]
    path = os.path.join(tempfile.mkdtemp(prefix="pe_prefill_"), "trace.json")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(engine, [prompt], 1)
    prof.export_chrome_trace(path)
    return summarize_prefill(load_trace(path)[0], sweep, n, gemm_flops, mm, top)


def summarize_prefill(kernels: list[dict], sweep, n: int, gemm_flops: float, mm: float, top: int = 0) -> dict:
    """Prints and returns the kernel groups of one prefill's trace (prefill_breakdown)."""
    lo, hi = kernels[0]["start"], max(k["start"] + k["dur"] for k in kernels)
    excl, gap = sweep([(k["start"], k["start"] + k["dur"]) for k in kernels], lo, hi + 1e-3)
    groups: dict[str, list[float]] = {}
    gemm_names: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for k, x in zip(kernels, excl):
        calls, us = by_name.get(k["short"], [0, 0.0])
        by_name[k["short"]] = [calls + 1, us + x]
        g = next((name for name, pats in PREFILL_GROUPS if any(p in k["short"] for p in pats)), "norms/glue")
        calls, us = groups.get(g, [0, 0.0])
        groups[g] = [calls + 1, us + x]
        if g == "gemm":
            gemm_names[k["name"]] = gemm_names.get(k["name"], 0.0) + x
    wall = hi - lo
    print(f"prefill {n} tokens, kernel timeline (CUPTI): {wall / 1e3:.1f} ms from the first kernel to the last")
    rows = {}
    for g in [name for name, _ in PREFILL_GROUPS] + ["norms/glue"]:
        calls, us = groups.get(g, [0, 0.0])
        line = f"  {g:12s} {calls:6d} calls {us / 1e3:9.1f} ms {100 * us / wall:5.1f} %"
        rows[g] = {"calls": calls, "ms": round(us / 1e3, 2)}
        if g == "gemm" and us > 0:
            rate = gemm_flops / (us * 1e-6)
            rows[g]["tflops"] = round(rate / 1e12, 1)
            line += f"   {rate / 1e12:6.1f} TFLOP/s = {100 * rate / mm:.1f} % of the bf16 matmul rate"
        print(line, flush=True)
    print(f"  {'gaps':12s} {'':12s} {gap / 1e3:9.1f} ms {100 * gap / wall:5.1f} %", flush=True)
    for name in sorted(gemm_names, key=lambda m: -gemm_names[m])[:2]:  # which GEMM kernels ran
        print(f"    {gemm_names[name] / 1e3:9.1f} ms  {name[:110]}")
    for name in sorted(by_name, key=lambda m: -by_name[m][1])[:top]:  # --prefill-top
        print(f"    {by_name[name][1] / 1e3:9.2f} ms {by_name[name][0]:6d} calls  {name[:100]}")
    rows["gaps"] = {"ms": round(gap / 1e3, 2)}
    return {"tokens": n, "wall_ms": round(wall / 1e3, 2), "groups": rows}


def depth_step(engine, prompt: list[int], depth: int) -> float:
    """Decode step time after a prompt of `depth` tokens (a prefix of `prompt`: cached): the median
    step of a 64-token request."""
    _, times = run(engine, [prompt[:depth]], 64)
    ts = times[0]
    return statistics.median(b - a for a, b in zip(ts[4:], ts[5:]))


def bench_engine(args, out: dict) -> None:
    cfg_dir = write_config(64)
    with open(os.path.join(cfg_dir, "config.json")) as f:
        c = json.load(f)
    model, engine, load_s = make_engine(cfg_dir, "fp16", 40000, 8, args.chunk)
    wbytes, copies = model.weight_bytes(), model.prefill_copy_bytes()
    embed = c["vocab_size"] * c["hidden_size"] * 2
    out["weights"] = {"device_bytes": wbytes, "prefill_copy_bytes": copies, "load_dummy_s": round(load_s, 1)}
    print(f"27B dummy FP8: weights {wbytes / 1e9:.2f} GB on the device ({copies / 1e9:.2f} GB of them the prefill "
          f"GEMM's row-major copies), generated in {load_s:.1f} s", flush=True)
    bw, mm = out["copy_bytes_per_s"], out["bf16_flops"]
    state_read, state_written = gdn_step_bytes(c)

    def decode_rows(engine, key: str, label: str) -> None:
        decode_rate(engine, 1, 16, 0)  # warm-up
        out[key] = []
        for b in (1, 2, 8):
            tps, step = decode_rate(engine, b, args.decode_tokens, b)
            read = (wbytes - copies - embed) + b * state_read  # + KV of ~50 tokens: negligible
            written = b * state_written
            frac = (read + written) / step / bw
            row = {"batch": b, "tok_s": round(tps, 1), "step_ms": round(step * 1e3, 3), "bytes_read_per_step": read,
                   "bytes_written_per_step": written, "hbm_fraction": round(frac, 3)}  # fmt: skip
            out[key].append(row)
            print(f"decode{label} batch {b}: {tps:8.1f} tok/s  step {step * 1e3:7.3f} ms  read {read / 1e9:.2f} GB + "
                  f"written {written / 1e9:.2f} GB per step  = {frac * 100:.1f} % of copy bandwidth", flush=True)  # fmt: skip

    decode_rows(engine, "decode", "")
    if args.cuda_graphs:
        engine.close()
        engine = engine_on(model, "fp16", 40000, 8, args.chunk, cuda_graphs=True)
        decode_rows(engine, "decode_cuda_graphs", " (cuda_graphs)")
    params = matmul_params(c)
    out["prefill"] = []
    if args.prefill_sizes:  # warm-up: first uses (a 75-only build's PTX JIT took seconds) are not timed
        prefill_rate(engine, 512, 1)
    for n in args.prefill_sizes:
        tps = prefill_rate(engine, n, n)
        frac = 2 * params * tps / mm
        out["prefill"].append({"tokens": n, "tok_s": round(tps, 1), "bf16_matmul_fraction": round(frac, 3)})
        print(f"prefill {n:6d} tokens: {tps:8.1f} tok/s  = {frac * 100:.1f} % of the bf16 matmul rate "
              f"(2 x {params / 1e9:.2f} G params x tok/s)", flush=True)  # fmt: skip
    if args.prefill_breakdown:
        head = c["vocab_size"] * c["hidden_size"]  # one token's logits per prefill
        out["prefill_breakdown"] = [prefill_breakdown(engine, n, n + 1, 2.0 * ((params - head) * n + head), mm,
                                                      args.prefill_top)
                                    for n in args.prefill_sizes]  # fmt: skip
    engine.close()
    del engine, model


def bench_default_model_graphs(args, out: dict) -> None:
    """Decode A/B of cuda_graphs on the embedded default model (small: launch-bound)."""
    from pyengine.config import ModelConfig
    from pyengine.llm import default_model_path
    from pyengine.model_loader import NativeModel

    path = default_model_path()
    config = ModelConfig.from_dir(path)
    model = NativeModel(path, config, "cuda")
    out["default_model_decode"] = {}
    for graphs in (False, True):
        engine = engine_on(model, "fp16", 512, 8, 256, cuda_graphs=graphs, kv_cache_bytes=1 << 30)
        decode_rate(engine, 1, 16, 0, config.vocab_size)  # warm-up
        rows = []
        for b in (1, 2, 8):
            tps, step = decode_rate(engine, b, args.decode_tokens, b, config.vocab_size)
            rows.append({"batch": b, "tok_s": round(tps, 1), "step_ms": round(step * 1e3, 3)})
            print(f"default model decode (cuda_graphs {'on' if graphs else 'off'}) batch {b}: {tps:8.1f} tok/s  "
                  f"step {step * 1e3:7.3f} ms", flush=True)  # fmt: skip
        out["default_model_decode"]["on" if graphs else "off"] = rows
        engine.close()
    del model


DEPTH_KV = ("fp16", "bf16", "fp8_e4m3", "int8", "fp4")


def bench_depth(args, out: dict) -> None:
    """Interleaved rounds: one model, one engine per KV dtype (its 64K prompt prefilled once and
    cached), and every round times every depth of every dtype in turn, so drift hits all dtypes
    alike. Per dtype: the least step over the rounds (the host's turnaround between steps only
    ever adds time: session 12 timelines, 41-119 us of gaps per step) and the median over rounds
    of its difference to fp16 in the same round."""
    cfg_dir = write_config(args.depth_layers, attention_only=True)
    depths = args.depths
    rng = random.Random(5)
    prompt = [rng.randrange(1000, 200000) for _ in range(max(depths))]
    model = make_model(cfg_dir)
    engines = {}
    # --depth-kv-bytes: room for the cached prompt and a request's max_model_len (what admission
    # reserves), so the prompt stays cached from round to round.
    for kv in DEPTH_KV:
        engines[kv] = engine_on(model, kv, max(depths) + 64, 1, args.chunk, kv_cache_bytes=args.depth_kv_bytes)
        prefill_rate(engines[kv], max(depths), 5)  # fills the prefix cache; the depths below hit it
    print(f"decode step time (ms) by context depth, {args.depth_layers} attention layers of the 27B shape, "
          f"{args.depth_rounds} interleaved rounds:", flush=True)
    steps = {kv: [[] for _ in depths] for kv in DEPTH_KV}
    for r in range(args.depth_rounds):
        for i, d in enumerate(depths):
            for kv in DEPTH_KV:
                steps[kv][i].append(depth_step(engines[kv], prompt, d))
        print(f"  round {r + 1}: " + "  ".join(f"{kv} " + "/".join(f"{s[-1] * 1e3:.3f}" for s in steps[kv])
                                                for kv in DEPTH_KV), flush=True)  # fmt: skip
    for e in engines.values():
        e.close()
    del engines, model
    out["depth"] = {"layers": args.depth_layers, "attention_layers": args.depth_layers, "depths": depths,
                    "rounds": args.depth_rounds, "step_ms": {}, "diff_to_fp16_ms": {}}  # fmt: skip
    print("  kv dtype   " + "".join(f"{d:>10d}" for d in depths) + "   median per-round difference to fp16 (ms)")
    for kv in DEPTH_KV:
        best = [min(s) for s in steps[kv]]
        diff = [statistics.median(a - b for a, b in zip(s, f)) for s, f in zip(steps[kv], steps["fp16"])]
        out["depth"]["step_ms"][kv] = [round(b * 1e3, 3) for b in best]
        out["depth"]["diff_to_fp16_ms"][kv] = [round(x * 1e3, 4) for x in diff]
        print(f"  {kv:11s}" + "".join(f"{b * 1e3:10.3f}" for b in best) + "   " +
              " ".join(f"{x * 1e3:+.4f}" for x in diff), flush=True)  # fmt: skip


def bench_hf(out: dict) -> None:
    """transformers eager bf16, random weights, in a fresh process (GPU memory of the engine freed)."""
    code = r"""
import json, time, torch, sys
from transformers import Qwen3_5TextConfig, Qwen3_5ForCausalLM
cfg = Qwen3_5TextConfig(**json.loads(sys.argv[1]))
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = Qwen3_5ForCausalLM(cfg).eval()
res = {}
with torch.no_grad():
    ids = torch.randint(1000, 200000, (1, 32), device="cuda")
    out = model(ids, use_cache=True); past = out.past_key_values
    tok = out.logits[:, -1:].argmax(-1)
    times = []
    for i in range(24):
        torch.cuda.synchronize(); t = time.perf_counter()
        out = model(tok, past_key_values=past, use_cache=True); past = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
    times = sorted(times[4:]); res["decode_tok_s_batch1"] = 1.0 / times[len(times) // 2]
    for n in (512, 4096):
        ids = torch.randint(1000, 200000, (1, n), device="cuda")
        torch.cuda.synchronize(); t = time.perf_counter(); model(ids, use_cache=False, logits_to_keep=1)
        torch.cuda.synchronize(); res[f"prefill_tok_s_{n}"] = n / (time.perf_counter() - t)
print("HFRESULT " + json.dumps(res))
"""
    cfg = dict(CONFIG_27B)
    cfg["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)]
    for k in ("model_type", "architectures", "mtp_num_hidden_layers"):
        cfg.pop(k, None)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], capture_output=True, text=True, timeout=900)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("HFRESULT ")), None)
    if line is None:
        print("transformers baseline failed:\n" + p.stdout[-2000:] + p.stderr[-3000:])
        out["hf"] = {"error": p.stderr[-500:]}
        return
    res = json.loads(line[len("HFRESULT "):])
    res["wall_s"] = round(time.perf_counter() - t, 1)
    out["hf"] = res
    print(f"transformers {__import__('transformers').__version__} bf16 eager: decode batch 1 "
          f"{res['decode_tok_s_batch1']:.2f} tok/s, prefill 4K {res['prefill_tok_s_4096']:.1f} tok/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hf", action="store_true", help="also run the transformers baseline")
    ap.add_argument("--skip-depth", action="store_true")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--depth-layers", type=int, default=8)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--chunk", type=int, default=4096, help="chunked_prefill_size")
    ap.add_argument("--prefill-sizes", type=int, nargs="*", default=[4096, 32768])
    ap.add_argument("--prefill-breakdown", action="store_true", help="per-kernel-group time of each prefill size")
    ap.add_argument("--prefill-top", type=int, default=0, help="with --prefill-breakdown: the N costliest kernels")
    ap.add_argument("--cuda-graphs", action="store_true", help="A/B decode with the engine option cuda_graphs")
    ap.add_argument("--depths", type=int, nargs="+", default=[1024, 8192, 32768, 65536])
    ap.add_argument("--depth-rounds", type=int, default=5)
    ap.add_argument("--depth-kv-bytes", type=int, default=6 << 30, help="kv_cache_bytes of each depth engine")
    ap.add_argument("--overlap-schedule", choices=["auto", "on", "off"], default="auto",
                    help="the engines' overlap_schedule option (auto: the engine's default)")
    ap.add_argument("--prefill-weight-copy", choices=["auto", "on", "off"], default="auto",
                    help="the model option prefill_weight_copy (FP8 row-major copies for the sm_90 prefill GEMM)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    global OVERLAP_SCHEDULE, PREFILL_WEIGHT_COPY
    OVERLAP_SCHEDULE = args.overlap_schedule
    PREFILL_WEIGHT_COPY = args.prefill_weight_copy
    import torch

    out: dict = {"gpu": torch.cuda.get_device_name(0), "command": " ".join(sys.argv)}
    out["copy_bytes_per_s"] = copy_bandwidth()
    out["bf16_flops"] = bf16_matmul_rate()
    print(f"{out['gpu']}: copy {out['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write), "
          f"bf16 matmul {out['bf16_flops'] / 1e12:.0f} TFLOP/s", flush=True)
    if args.prefill_breakdown:  # CUPTI set up before the engine's work, so it sees the library's kernels
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]):
            torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    if args.cuda_graphs:
        bench_default_model_graphs(args, out)
    if not args.skip_engine:
        bench_engine(args, out)
    if not args.skip_depth:
        bench_depth(args, out)
    if args.hf:
        bench_hf(out)
    print(json.dumps(out))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
