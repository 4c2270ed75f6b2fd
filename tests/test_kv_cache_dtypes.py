"""Quantized KV caches: what they cost in accuracy against an fp16 cache, and what they save.

Bounds sit ~2x above what was measured on these checkpoints (150-token prompt):
rel = ||logits - logits_fp16|| / ||logits_fp16||, top1 = share of positions with the same argmax.
  ckpt_text_bf16:  bf16 6e-4, int8 2.2e-3, fp8 1.1e-2, fp4 3.7e-2 (top1 0.95)
"""

import os

import numpy as np
import pytest

from pyengine import LLM, SamplingParams

DATA = os.path.join(os.path.dirname(__file__), "data")
BOUNDS = {"fp32": (2e-4, 1.0), "bf16": (2e-3, 1.0), "int8": (5e-3, 0.98), "fp8_e4m3": (2.5e-2, 0.95),
          "fp4": (7e-2, 0.9)}  # fmt: skip


@pytest.mark.parametrize("name", ["ckpt_text_bf16", "ckpt_wrapper_bf16", "ckpt_text_fp8"])
def test_quantized_kv_logits_stay_close_to_fp16_kv(name):
    ids = np.load(os.path.join(DATA, name, "goldens.npz"))["prompt_150_ids"].tolist()
    with LLM(os.path.join(DATA, name), max_model_len=512) as llm:
        ref = llm.prompt_logits(ids, kv_cache_dtype="fp16")
        for dtype, (rel_bound, top1_bound) in BOUNDS.items():
            out = llm.prompt_logits(ids, kv_cache_dtype=dtype)
            rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
            top1 = np.mean(out.argmax(1) == ref.argmax(1))
            assert rel < rel_bound and top1 >= top1_bound, (dtype, rel, top1)
            assert rel > 0 or dtype == "fp32"  # the quantized caches really are quantized


def test_quantized_caches_hold_more_tokens_in_the_same_budget():
    pages = {}
    for dtype in ("fp32", "fp16", "fp8_e4m3", "int8", "fp4"):
        with LLM(os.path.join(DATA, "ckpt_text_bf16"), max_model_len=256, kv_cache_bytes=4_000_000,
                 kv_cache_dtype=dtype) as llm:  # fmt: skip
            plan = llm.stats()["plan"]
            pages[dtype] = plan["kv_pages"]
            prompt = list(range(40))
            out = llm.generate(prompt_token_ids=[prompt],
                               sampling_params=SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
            # Each decode token (read from this cache) is what a prefill over the same cache predicts.
            logits = llm.prompt_logits(prompt + out.token_ids[:-1], kv_cache_dtype=dtype)
            assert out.token_ids == logits[-8:].argmax(1).tolist(), dtype
    assert pages["fp32"] < pages["fp16"] < pages["int8"] < pages["fp4"]
    assert pages["fp8_e4m3"] >= pages["int8"]


def test_bad_kv_cache_dtypes_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(os.path.join(DATA, "ckpt_text_bf16"), max_model_len=64, kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="head_dim % 16"):  # head_dim 24
        LLM(os.path.join(DATA, "ckpt_interval_f32"), max_model_len=64, kv_cache_dtype="fp4")


def test_device_kv_encoders_match_the_cpu_bit_for_bit():
    """kv_codec.cuh's fp8 / fp4 encoders (their source, compiled for the host) against the CPU's
    on every 17th float bit pattern and every midpoint / tie with its neighbours
    (tools/gpu/kv_encoders_exhaustive.py; without --stride: all 2^32)."""
    import subprocess
    import sys

    tool = os.path.join(os.path.dirname(__file__), "..", "tools", "gpu", "kv_encoders_exhaustive.py")
    run = subprocess.run([sys.executable, tool, "--stride", "17"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "fp8 mismatches 0, fp4 mismatches 0" in run.stdout, run.stdout
