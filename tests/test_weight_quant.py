"""On-load weight quantization (weight_quant = int8 / fp8 / nvfp4) on the CPU backend.

Measured on the shipped default model (trained, so its logits mean something; random test
checkpoints amplify any perturbation chaotically), 200 tokens of this repository's Python:
  int8  rel 8.6e-3, top1 0.980, nll 4.360 -> 4.361
  fp8   rel 3.2e-2, top1 0.955, nll 4.360 -> 4.355
  nvfp4 rel 1.2e-1, top1 0.865, nll 4.360 -> 4.392
rel = ||logits - logits_bf16|| / ||logits_bf16||. Bounds sit ~2x above.
"""

import argparse
import os

import numpy as np
import pytest

from pyengine import LLM, SamplingParams
from pyengine.cli_args import add_engine_arguments, engine_kwargs
from pyengine.llm import default_model_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOUNDS = {"int8": (2e-2, 0.95, 0.02), "fp8": (7e-2, 0.9, 0.05), "nvfp4": (0.25, 0.75, 0.1)}


def log_softmax(x):
    m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))


@pytest.fixture(scope="module")
def reference():
    with LLM(default_model_path(), max_model_len=512) as llm:
        with open(os.path.join(ROOT, "pyengine", "llm.py")) as f:
            ids = llm.tokenizer.encode(f.read()[:1500])[:200]
        return ids, llm.prompt_logits(ids)


@pytest.mark.parametrize("quant", list(BOUNDS))
def test_quantized_weights_stay_close_to_the_bf16_model(reference, quant):
    ids, full = reference
    with LLM(default_model_path(), max_model_len=512, weight_quant=quant) as llm:
        out = llm.prompt_logits(ids)
        sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        tokens = llm.generate(prompt_token_ids=[ids[:50]], sampling_params=sp)[0].token_ids
        # Decode (the quantized GEMV path) picks what the quantized prefill predicts.
        assert tokens == llm.prompt_logits(ids[:50] + tokens[:-1])[-8:].argmax(1).tolist()
    rel_bound, top1_bound, nll_bound = BOUNDS[quant]
    rel = np.linalg.norm(out - full) / np.linalg.norm(full)
    top1 = np.mean(out.argmax(1) == full.argmax(1))
    rows = np.arange(len(ids) - 1)
    nll = -log_softmax(full)[rows, ids[1:]].mean()
    nll_q = -log_softmax(out)[rows, ids[1:]].mean()
    assert 0 < rel < rel_bound and top1 >= top1_bound and abs(nll_q - nll) < nll_bound, (quant, rel, top1, nll, nll_q)


def test_bad_weight_quant_names_the_problem():
    with pytest.raises(ValueError, match="weight_quant must be one of"):
        LLM(default_model_path(), max_model_len=64, weight_quant="int4")
    ckpt = os.path.join(ROOT, "tests", "data", "ckpt_interval_f32")  # out_proj has 60 columns
    with pytest.raises(Exception, match="multiple of 16"):
        LLM(ckpt, max_model_len=64, weight_quant="nvfp4")


def test_dummy_weights_load_and_generate_on_the_cpu():
    ckpt = os.path.join(ROOT, "tests", "data", "ckpt_text_bf16")
    for quant in (None, "fp8", "int8"):
        with LLM(ckpt, max_model_len=64, load_format="dummy", weight_quant=quant) as llm:
            out = llm.generate(prompt_token_ids=[[1, 2, 3]],
                               sampling_params=SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
            tokens = out[0].token_ids
            assert tokens == llm.prompt_logits([1, 2, 3] + tokens[:-1])[-4:].argmax(1).tolist(), quant
    with pytest.raises(ValueError, match="load_format"):
        LLM(ckpt, max_model_len=64, load_format="npz")


def test_prefill_weight_copy_is_checked_and_changes_nothing_on_the_cpu():
    """The option only matters on a CUDA device with the sm_90 FP8 GEMM (pyengine.h); elsewhere
    every value loads and gives the same logits; bad values are named."""
    ckpt = os.path.join(ROOT, "tests", "data", "ckpt_text_bf16")
    logits = []
    for copy in (None, True, False):
        with LLM(ckpt, max_model_len=64, weight_quant="fp8", prefill_weight_copy=copy) as llm:
            logits.append(llm.prompt_logits([1, 2, 3, 4]))
            assert llm._model.prefill_copy_bytes() == 0  # the CPU keeps no copies
    assert np.array_equal(logits[0], logits[1]) and np.array_equal(logits[0], logits[2])
    with pytest.raises(ValueError, match="prefill_weight_copy"):
        LLM(ckpt, max_model_len=64, prefill_weight_copy="yes")
    p = argparse.ArgumentParser()  # the CLI flag maps to the option
    add_engine_arguments(p)
    for flag, want in (("auto", None), ("on", True), ("off", False)):
        assert engine_kwargs(p.parse_args(["--prefill_weight_copy", flag]))["prefill_weight_copy"] is want
