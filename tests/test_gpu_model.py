"""The model on the CUDA backend (issue 6): run with `pytest -m gpu` on a machine with a GPU.

Reference: the transformers goldens (fp32) and the CPU engine. The CUDA GEMM rounds its
operands to fp16 for chunks of more than 8 tokens (kernels/cuda/cuda_ops.h), so prompt logits
carry fp16-operand error; bounds sit about 2x above the errors measured on the device, which the
tests print. Greedy continuations (ignore_eos) must be identical.
"""

import gc
import os
import random
import threading
import time

import numpy as np
import pytest

from pyengine import LLM, SamplingParams
from pyengine._native import cuda_available
from pyengine.llm import default_model_path

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="no CUDA device or no CUDA build")]

DATA = os.path.join(os.path.dirname(__file__), "data")
CHECKPOINTS = ["ckpt_text_bf16", "ckpt_wrapper_bf16", "ckpt_interval_f32", "ckpt_text_fp8"]
PROMPTS = ["1", "7", "70", "150", "text"]
# Chunks of <= 8 tokens take the fp32 GEMV, close to the CPU engine; longer chunks go
# through the fp16-operand GEMM, whose rounding these random checkpoints amplify chaotically (they
# turn int8 weights into 25 % logit error, tests/test_weight_quant.py): bounded separately, with
# the trained default model held to a tight bound.
# Per checkpoint: (max abs for prompts of <= 8 tokens, max abs and ||cuda - ref|| / ||ref|| for
# longer prompts) against transformers fp32; about twice the worst measured on the device (the
# test prints the measured errors and twice them).
CUDA_BOUNDS = {  # twice the errors measured on an H100 (short max-abs, long max-abs, long relative)
    "ckpt_text_bf16": (1.0e-4, 1.3, 1.5e-2),
    "ckpt_wrapper_bf16": (2.7e-4, 0.59, 7.4e-3),
    "ckpt_interval_f32": (1.0e-4, 1.0, 1.8e-2),
    "ckpt_text_fp8": (7.8e-5, 0.58, 9.6e-3),
}
# FP8 checkpoints' prompts of >= 128 tokens (kFp8GemmMinTokens) on an H100 / H200: their FP8
# GEMMs run W8A8 (x quantized to e4m3 per token per 128 columns, cuda_ops.h linear), so they carry
# the quantization of x too: (max abs, relative) for those prompts, twice what an H100 measured
# (2026-12-06: 150 tokens, max abs 13.7, rel 0.27). The random weights of this checkpoint amplify
# the ~2e-2 that quantizing x costs a GEMM (the op tests); the trained default model under
# weight_quant fp8 is the accuracy check (test_weight_quant_on_cuda_matches_the_cpu_quantized_model:
# 200 tokens rel 2.8e-2, top-1 0.965 measured). Other GPUs take the fp16-operand GEMM there.
W8A8_BOUNDS = {"ckpt_text_fp8": (27.0, 0.54)}
REL_TRAINED = 3e-3  # ||cuda - ref|| / ||ref|| on the trained default model
KV_BYTES = 1 << 30  # each test engine takes this much for KV + GDN state, not the whole GPU


def cuda_llm(path, **kw):
    kw.setdefault("kv_cache_bytes", KV_BYTES)
    return LLM(path, device="cuda", **kw)


def goldens(name):
    return np.load(os.path.join(DATA, name, "goldens.npz"))


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module", params=CHECKPOINTS)
def ckpt(request):
    llm = cuda_llm(os.path.join(DATA, request.param), max_batch=4, max_model_len=512, chunked_prefill_size=32)
    yield request.param, llm, goldens(request.param)
    llm.close()


def test_prompt_logits_match_transformers_on_cuda(ckpt):
    name, llm, g = ckpt
    atol_short, atol_long, rel_long = CUDA_BOUNDS[name]
    worst = {"short": 0.0, "long": 0.0, "rel": 0.0}
    for n in PROMPTS:
        ids = g[f"prompt_{n}_ids"].tolist()
        out = llm.prompt_logits(ids, kv_cache_dtype="fp32")
        ref = g[f"prompt_{n}_logits"]
        assert out.shape == ref.shape
        err = np.abs(out - ref).max()
        rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        print(f"{name} prompt {n}: max abs {err:.2e} rel {rel:.2e}")
        if len(ids) <= 8:
            worst["short"] = max(worst["short"], err)
        elif name in W8A8_BOUNDS and len(ids) >= 128:
            print(f"W8A8_BOUNDS {name} prompt {n} ({len(ids)} tokens): twice: ({2 * err:.1e}, {2 * rel:.1e})")
            assert err < W8A8_BOUNDS[name][0] and rel < W8A8_BOUNDS[name][1], (name, n, err, rel)
        else:
            worst["long"], worst["rel"] = max(worst["long"], err), max(worst["rel"], rel)
    print(f"CUDA_BOUNDS {name}: measured short {worst['short']:.2e}, long {worst['long']:.2e} / rel "
          f"{worst['rel']:.2e}; twice: ({2 * worst['short']:.1e}, {2 * worst['long']:.1e}, {2 * worst['rel']:.1e})")
    assert worst["short"] < atol_short, (name, worst)
    assert worst["long"] < atol_long and worst["rel"] < rel_long, (name, worst)


def test_mtp_logits_on_cuda_match_the_reference_and_the_cpu():
    """The MTP head through the one forward on the CUDA backend: against the vLLM-semantics
    reference (tests/data) with the prompt-logit bounds, and against the CPU model."""
    g = goldens("ckpt_wrapper_bf16")
    path = os.path.join(DATA, "ckpt_wrapper_bf16")
    with cuda_llm(path, max_model_len=512) as llm, LLM(path, max_model_len=512) as cpu:
        for n in ("7", "70"):
            ids = g[f"prompt_{n}_ids"].tolist()
            out, ref, on_cpu = llm.mtp_logits(ids), g[f"mtp_{n}_logits"], cpu.mtp_logits(ids)
            assert out.shape == ref.shape
            err = np.abs(out - ref).max()
            rel = np.linalg.norm(out - on_cpu) / np.linalg.norm(on_cpu)
            print(f"mtp {n}: max abs vs reference {err:.2e}, rel vs cpu {rel:.2e}")
            short, long, rel_bound = CUDA_BOUNDS["ckpt_wrapper_bf16"]
            assert err < (short if len(ids) - 1 <= 8 else long) and rel < rel_bound, (n, err, rel)


def test_default_model_goldens_on_cuda():
    g = np.load(os.path.join(DATA, "default_model_goldens.npz"))
    with cuda_llm(default_model_path(), max_model_len=512) as llm:
        for key, rows in (("chat", None), ("code", 8)):
            out = llm.prompt_logits(g[f"{key}_ids"].tolist(), kv_cache_dtype="fp32")
            out = out if rows is None else out[-rows:]
            ref = g[f"{key}_logits"]
            rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
            print(f"default model {key}: max abs {np.abs(out - ref).max():.2e} rel {rel:.2e}")
            assert rel < REL_TRAINED, (key, rel)
            # ignore_eos: an early EOS (a wrong first token among them) cannot cut the comparison short.
            out = llm.generate(prompt_token_ids=[g[f"{key}_ids"].tolist()], sampling_params=greedy(40))[0]
            assert out.token_ids == g[f"{key}_greedy_ids"].tolist(), key


def test_greedy_continuations_match_transformers_on_cuda(ckpt):
    """Each prompt alone, as transformers ran it: its prefill chunks, then decode steps of its one
    token (the fp32 GEMV). Not as one batch: generate() admits a batch in one engine event, so with
    chunk 32 the 1-token prompt's first step always shares the fp16-operand GEMM (> 8 tokens) with
    the 7- and 70-token prompts' chunks, whose error on these random checkpoints (CUDA_BOUNDS, long)
    is far above transformers' own top-2 gap at that prompt's step 1 on ckpt_text_fp8 (0.028):
    that batch gives another token at step 1 on an H200. Batched decode steps are
    held to the CPU engine below, and to eager = graphs."""
    name, llm, g = ckpt
    for k in ["1", "7", "70", "150"]:
        out = llm.generate(prompt_token_ids=[g[f"prompt_{k}_ids"].tolist()], sampling_params=greedy(20))[0]
        assert out.token_ids == g[f"greedy_{k}_ids"].tolist(), f"{name} prompt {k}"


@pytest.mark.parametrize("keys", [["70"], ["1", "7", "70"]], ids=["alone", "batched"])
def test_decode_logprobs_equal_the_cpu_engine(keys):
    """Decode steps (n <= 8 rows: fp32 GEMV) match the CPU engine closely, fp16 KV included, one
    sequence or a batch (chunk 1 keeps every step at <= 3 tokens, so all of them take the GEMV)."""
    g = goldens("ckpt_text_bf16")
    prompts = [g[f"prompt_{k}_ids"].tolist() for k in keys]
    res = {}
    for dev in ("cpu", "cuda"):
        with LLM(os.path.join(DATA, "ckpt_text_bf16"), device=dev, max_model_len=256, kv_cache_dtype="fp16",
                 chunked_prefill_size=1, kv_cache_bytes=KV_BYTES) as llm:  # fmt: skip
            res[dev] = llm.generate(prompt_token_ids=prompts, sampling_params=greedy(16, logprobs=5))
    for cpu, cuda in zip(res["cpu"], res["cuda"]):
        assert cpu.token_ids == cuda.token_ids
        for a, b in zip(cpu.logprobs, cuda.logprobs):
            assert abs(a["logprob"] - b["logprob"]) < 1e-3
            assert [t[0] for t in a["top"]][:3] == [t[0] for t in b["top"]][:3]


KV_BOUNDS = {"bf16": (2e-3, 1.0), "int8": (5e-3, 0.98), "fp8_e4m3": (2.5e-2, 0.95), "fp4": (7e-2, 0.9)}


@pytest.mark.parametrize("name", ["ckpt_text_bf16", "ckpt_wrapper_bf16", "ckpt_text_fp8"])
def test_quantized_kv_on_cuda_stays_close_to_fp16_kv(name):
    """What each KV dtype costs against fp16 KV. The FP8 checkpoint's prompt stays below the sm_90
    FP8 GEMM's 128 tokens: there W8A8 quantizes the activations, which amplifies any difference
    in them (an H100, 2026-12-06, 150 tokens: bf16 KV rel 4.6e-3, the rounding of x to e4m3 on
    top of the KV's), so the bounds would measure the GEMM rather than the cache."""
    ids = goldens(name)["prompt_150_ids"].tolist()
    if name == "ckpt_text_fp8":
        ids = ids[:120]
    with cuda_llm(os.path.join(DATA, name), max_model_len=512) as llm:
        ref = llm.prompt_logits(ids, kv_cache_dtype="fp16")
        for dtype, (rel_bound, top1_bound) in KV_BOUNDS.items():
            out = llm.prompt_logits(ids, kv_cache_dtype=dtype)
            rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
            top1 = np.mean(out.argmax(1) == ref.argmax(1))
            print(f"{name} kv {dtype}: rel {rel:.2e} top1 {top1:.3f}")
            assert 0 < rel < rel_bound and top1 >= top1_bound, (dtype, rel, top1)


# FP8 GEMMs of >= 128 tokens on an H100 / H200 run W8A8 (x quantized to e4m3 per token per 128
# columns, cuda_ops.h linear), which the CPU does not: bounded on their own (an H100, 2026-12-06:
# the default model, 200 tokens, rel 2.8e-2, top-1 0.965).
REL_W8A8, TOP1_W8A8 = 5e-2, 0.9


@pytest.mark.parametrize("quant", ["int8", "fp8", "nvfp4"])
def test_weight_quant_on_cuda_matches_the_cpu_quantized_model(quant):
    """Same quantized weights on both backends (tests/test_weight_quant.py bounds what the
    quantization itself costs, on the CPU). fp8: 120 tokens stay below the sm_90 FP8 GEMM's
    threshold (kFp8GemmMinTokens, the CPU's numerics); 200 tokens run W8A8 where the GPU has it."""
    path = default_model_path()
    with open(os.path.join(os.path.dirname(DATA), "..", "pyengine", "llm.py")) as f:
        text = f.read()[:1500]
    lengths = (120, 200) if quant == "fp8" else (200,)
    out = {}
    for dev in ("cpu", "cuda"):
        with LLM(path, device=dev, max_model_len=512, weight_quant=quant, kv_cache_bytes=KV_BYTES) as llm:
            ids = llm.tokenizer.encode(text)
            for n in lengths:
                out[dev, n] = llm.prompt_logits(ids[:n], kv_cache_dtype="fp32")
    for n in lengths:
        cuda, cpu = out["cuda", n], out["cpu", n]
        same = np.linalg.norm(cuda - cpu) / np.linalg.norm(cpu)
        top1 = np.mean(cuda.argmax(1) == cpu.argmax(1))
        print(f"weight_quant {quant}, {n} tokens: cuda vs cpu rel {same:.2e} top1 {top1:.3f}")
        if quant == "fp8" and n >= 128:
            assert same < REL_W8A8 and top1 >= TOP1_W8A8
        else:
            assert same < REL_TRAINED * 3 and top1 >= 0.97


def test_prefill_weight_copy_gives_the_untiled_products():
    """prefill_weight_copy on: the W8A8 prefill GEMM reads the kept row-major copies (an H100 /
    H200 keeps them: compute capability 9.0 with the CUTLASS GEMM); the same logits, bit for bit,
    as untiling the weights per call (off), and decode unchanged."""
    path = default_model_path()
    ids = list(range(100, 300))  # 200 tokens: over the FP8 GEMM's threshold
    out, copies = {}, {}
    for copy in (True, False):
        with LLM(path, device="cuda", max_model_len=512, weight_quant="fp8", kv_cache_bytes=KV_BYTES,
                 prefill_weight_copy=copy) as llm:  # fmt: skip
            copies[copy] = llm._model.prefill_copy_bytes()
            out[copy] = llm.prompt_logits(ids, kv_cache_dtype="fp32")
            sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
            out[copy, "gen"] = llm.generate(prompt_token_ids=[ids], sampling_params=sp)[0].token_ids
    print(f"prefill copies: {copies[True]} bytes")
    assert copies[False] == 0
    if copies[True]:  # kept: the FP8 layer matrices once more
        assert np.array_equal(out[True], out[False]) and out[True, "gen"] == out[False, "gen"]


def test_sampling_with_penalties_and_seeds_matches_the_cpu_engine():
    ids = goldens("ckpt_text_bf16")["prompt_7_ids"].tolist()
    sps = [SamplingParams(max_tokens=24, temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5,
                          frequency_penalty=0.3, ignore_eos=True),
           SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, top_k=40, seed=11, ignore_eos=True)]  # fmt: skip
    res = {}
    for dev in ("cpu", "cuda"):
        with LLM(os.path.join(DATA, "ckpt_text_bf16"), device=dev, max_model_len=256, kv_cache_dtype="fp16",
                 chunked_prefill_size=1, kv_cache_bytes=KV_BYTES) as llm:  # fmt: skip
            res[dev] = [o.token_ids for o in llm.generate(prompt_token_ids=[ids, ids], sampling_params=sps)]
    assert res["cpu"][0] == res["cuda"][0]
    # Sampled: equal unless u lands within rounding of a CDF step; allow one divergence point.
    a, b = res["cpu"][1], res["cuda"][1]
    assert a[:8] == b[:8], (a, b)


def test_thousand_requests_with_random_cancels_leave_device_memory_at_baseline():
    rng = random.Random(2026)
    with cuda_llm(os.path.join(DATA, "ckpt_text_bf16"), max_batch=16, max_model_len=512, chunked_prefill_size=64) as llm:
        # Warm-up with every request feature, so kernels loaded lazily on first use (the CUDA
        # module loader allocates device memory for them) are in the baseline.
        llm.generate(prompt_token_ids=[[1, 2, 3] * 40, [4, 5]], sampling_params=[
            SamplingParams(max_tokens=4, temperature=0.8, seed=1, logprobs=3, repetition_penalty=1.2),
            SamplingParams(max_tokens=4, temperature=0.0, presence_penalty=0.5)])  # fmt: skip
        gc.collect()  # models of earlier tests still waiting for the collector would free memory mid-test
        base = llm.stats()
        streams = []
        for i in range(1000):
            sp = SamplingParams(max_tokens=rng.randint(1, 32), temperature=rng.choice([0.0, 0.8]), seed=i,
                                logprobs=rng.choice([None, 3]), repetition_penalty=rng.choice([1.0, 1.2]))  # fmt: skip
            prompt = [rng.randrange(500) for _ in range(rng.randint(1, 300))]
            streams.append(llm.submit(prompt_token_ids=prompt, sampling_params=sp))
        to_cancel = rng.sample(streams, 300)
        threading.Thread(target=lambda: [s.cancel() or time.sleep(0.0005) for s in to_cancel]).start()
        reasons = []
        for s in streams:
            last = None
            for ev in s:
                last = ev
            assert last is not None and last.finished
            assert last.finish_reason in ("length", "stop", "cancelled"), last.finish_reason
            reasons.append(last.finish_reason)
        time.sleep(0.1)
        gc.collect()
        after = llm.stats()
        print(f"1000 requests: {reasons.count('cancelled')} cancelled, {reasons.count('length')} length; "
              f"device bytes in use {after['device_bytes_in_use']} vs {base['device_bytes_in_use']} after warm-up "
              f"(engine start: {after['device_bytes_baseline']})")
        assert reasons.count("cancelled") >= 1 and reasons.count("length") >= 1
        for key in ("running", "waiting", "gdn_slots_free", "kv_pages_free"):
            assert after[key] == base[key], key
        assert after["device_bytes_in_use"] == base["device_bytes_in_use"]


def log_softmax(logits):
    m = logits.max(1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(1, keepdims=True))


def test_dummy_weights_on_cuda_generate_what_their_prefill_predicts():
    """Dummy weights differ between the backends, so the reference is the engine itself: each
    greedy decode token is the argmax of the prefill logits of the tokens before it, with the
    same logprob. 1 + 7 tokens keep every prefill at <= 8 rows (the fp32 GEMV, as in decode)."""
    with cuda_llm(os.path.join(DATA, "ckpt_text_bf16"), max_model_len=128, load_format="dummy",
                  weight_quant="fp8", kv_cache_dtype="fp32") as llm:  # fmt: skip
        out = llm.generate(prompt_token_ids=[[7]], sampling_params=greedy(8, logprobs=1))[0]
        logits = llm.prompt_logits([7] + out.token_ids[:-1], kv_cache_dtype="fp32")
    assert out.token_ids == logits.argmax(1).tolist()
    lsm = log_softmax(logits)
    diff = max(abs(e["logprob"] - lsm[i, t]) for i, (e, t) in enumerate(zip(out.logprobs, out.token_ids)))
    print(f"dummy weights: greedy decode vs prefill logprob max diff {diff:.1e}")
    assert diff < 1e-5  # 1.8e-6 measured on an H100


@pytest.mark.parametrize("model", ["default", "ckpt_text_bf16"])
def test_cuda_graphs_decode_equals_eager_decode(model, capfd):
    """cuda_graphs replays decode steps from captured graphs: the same kernels with the same
    arguments, so tokens and logprobs equal those of eager launches. Batch 1, then six requests
    of different prompt and output lengths (batch sizes change as they finish). Prompts go in
    one token per step (chunked_prefill_size=1), so every step is graph-eligible and each row's
    arithmetic does not depend on which requests share its step (a timing matter between two
    engines): longer chunks would take the fp16 GEMM and the chunked GDN path by batch make-up."""
    path = default_model_path() if model == "default" else os.path.join(DATA, model)
    rng = random.Random(11)
    prompts = [[rng.randrange(1, 500) for _ in range(n)] for n in (1, 5, 17, 40, 3, 90)]
    sps = [greedy(n, logprobs=3) for n in (24, 9, 31, 5, 40, 16)]
    res = {}
    for graphs in (False, True):
        with cuda_llm(path, max_model_len=256, max_batch=8, chunked_prefill_size=1, cuda_graphs=graphs) as llm:
            single = llm.generate(prompt_token_ids=[prompts[2]], sampling_params=greedy(32, logprobs=3))
            res[graphs] = single + llm.generate(prompt_token_ids=prompts, sampling_params=sps)
    err = capfd.readouterr().err
    assert "replaying decode steps from CUDA graphs" in err  # the graphs did run
    worst = 0.0
    for i, (a, b) in enumerate(zip(res[False], res[True])):
        assert a.token_ids == b.token_ids, f"request {i}"
        for la, lb in zip(a.logprobs, b.logprobs):
            worst = max(worst, abs(la["logprob"] - lb["logprob"]))
            assert [t[0] for t in la["top"]] == [t[0] for t in lb["top"]]
    print(f"cuda_graphs {model}: {sum(len(o.token_ids) for o in res[True])} tokens, max |logprob diff| {worst:.1e}")
    assert worst <= 1e-5


def first_difference(a, b):
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_overlapped_steps_equal_one_step_at_a_time(graphs):
    """overlap_schedule (on by default on CUDA) queues each decode step before the previous one's
    tokens are read; its input tokens are fed on the device.
    1. Six greedy and seeded requests with logprobs, batched, none stopping early: the same steps
       in both engines, so the same bits.
    2. Each request again with a token of its own continuation as its stop id, one at a time: it
       stops with a step queued for it, which is dropped; the same bits again.
    3. All six with their stop ids at once: the dropped steps change the batch shape of steps the
       others are in (the GEMVs' rounding), so greedy tokens are equal up to where the reference's
       top two logprobs are within 1e-3 (a tie the rounding may flip). Pools come back and the
       stats count the overlapped steps and the dropped tokens."""
    path = os.path.join(DATA, "ckpt_text_bf16")
    rng = random.Random(5)
    prompts = [[rng.randrange(1, 500) for _ in range(n)] for n in (1, 5, 17, 40, 3, 90)]
    lengths, temps = (24, 9, 31, 5, 40, 16), (0.0, 0.8, 0.0, 1.0, 0.7, 0.0)

    def params(stops=None, greedy_only=False):
        return [SamplingParams(max_tokens=n, temperature=0.0 if greedy_only else t, seed=3 + i, logprobs=3,
                               ignore_eos=True, stop_token_ids=stops[i] if stops else None)
                for i, (n, t) in enumerate(zip(lengths, temps))]  # fmt: skip

    # Prompts in one chunk each (the same steps in both engines), then decode steps, which overlap.
    kw = dict(max_model_len=256, max_batch=8, chunked_prefill_size=128, cuda_graphs=graphs)
    runs = {}
    for overlap in (False, True):
        with cuda_llm(path, overlap_schedule=overlap, **kw) as llm:
            base = llm.stats()
            free = llm.generate(prompt_token_ids=prompts, sampling_params=params())
            stops = [[o.token_ids[len(o.token_ids) // 2]] for o in free]
            alone = [llm.generate(prompt_token_ids=[p], sampling_params=sp)[0]
                     for p, sp in zip(prompts, params(stops))]  # fmt: skip
            batched = llm.generate(prompt_token_ids=prompts, sampling_params=params(stops, greedy_only=True))
            time.sleep(0.05)
            runs[overlap] = free, alone, batched, llm.stats(), base
    (ref_free, ref_alone, ref_batched, ref_stats, _), (free, alone, batched, stats, base) = runs[False], runs[True]
    assert ref_stats["overlapped_steps"] == 0
    for a, b in zip(ref_free + ref_alone, free + alone):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert [e["top"] for e in a.logprobs] == [e["top"] for e in b.logprobs]
    assert [o.finish_reason for o in alone].count("stop") >= 4
    flips = 0
    for a, b in zip(ref_batched, batched):
        k = first_difference(a.token_ids, b.token_ids)
        if k is None:
            assert a.finish_reason == b.finish_reason
            continue
        top = a.logprobs[k]["top"]
        assert top[0][2] - top[1][2] < 1e-3, f"tokens differ at {k} where the reference is no tie: {top}"
        flips += 1
    print(f"overlap ({'graphs' if graphs else 'eager'}): {stats['overlapped_steps']} of {stats['steps']} steps "
          f"overlapped, {stats['overlap_dropped_tokens']} tokens dropped, {flips} of 6 stopping requests "
          f"flipped at a tie")  # fmt: skip
    assert stats["overlapped_steps"] >= stats["steps"] // 2 and stats["overlap_dropped_tokens"] >= 4
    for key in ("kv_pages_free", "gdn_slots_free", "running", "waiting"):
        assert stats[key] == base[key], key
