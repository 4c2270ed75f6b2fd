"""The MTP head (mtp.* tensors) against a reference built from transformers' modules with vLLM's
qwen3_5_mtp semantics (tests/data/README.md): row p drafts the token at p + 2."""

import os

import numpy as np
import pytest

from pyengine import LLM
from pyengine.errors import EngineError

DATA = os.path.join(os.path.dirname(__file__), "data")


def test_mtp_logits_match_the_reference():
    g = np.load(os.path.join(DATA, "ckpt_wrapper_bf16", "goldens.npz"))
    with LLM(os.path.join(DATA, "ckpt_wrapper_bf16"), max_model_len=512) as llm:
        for n in ("7", "70"):
            out = llm.mtp_logits(g[f"prompt_{n}_ids"].tolist())
            ref = g[f"mtp_{n}_logits"]
            assert out.shape == ref.shape
            assert np.abs(out - ref).max() < 2e-3, n


def test_checkpoint_without_mtp_says_so():
    with LLM(os.path.join(DATA, "ckpt_text_bf16"), max_model_len=64) as llm:
        with pytest.raises(EngineError, match="no MTP head"):
            llm.mtp_logits([1, 2, 3])
        with pytest.raises(ValueError, match="at least 2"):
            llm.mtp_logits([1])


def test_default_model_mtp_head_agrees_with_its_own_greedy_tokens_most_of_the_time():
    """Position-1 acceptance on a greedy continuation (model card: 90.7% on code, PyTorch)."""
    from pyengine import SamplingParams

    code = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    with LLM(max_model_len=1024) as llm:
        prompt = llm.tokenizer.encode(code)
        out = llm.generate(prompt_token_ids=[prompt],
                           sampling_params=SamplingParams(max_tokens=96, temperature=0.0, ignore_eos=True))[0]
        seq = prompt + out.token_ids
        drafts = llm.mtp_logits(seq).argmax(1)  # row p drafts seq[p + 2]
        p0 = len(prompt) - 1
        agree = np.mean(drafts[p0 : len(seq) - 2] == np.array(seq[p0 + 2 :]))
    assert agree >= 0.6, agree
