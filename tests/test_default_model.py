"""The embedded default model: loads with no argument, matches transformers, answers sensibly."""

import os
import subprocess
import sys

import numpy as np

from pyengine import LLM, SamplingParams
from pyengine.llm import default_model_path

GOLDENS = os.path.join(os.path.dirname(__file__), "data", "default_model_goldens.npz")


def test_default_model_is_shipped_and_small():
    path = default_model_path()
    assert path is not None
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    assert size <= 40 * 1000 * 1000


def test_default_model_matches_transformers():
    g = np.load(GOLDENS)
    with LLM(max_model_len=512) as llm:  # no model argument: the embedded one
        chat = llm.prompt_logits(g["chat_ids"].tolist())
        # Max abs error measured 1.9e-5 (-march=native build) and 2.1e-5 (generic x86-64).
        assert np.abs(chat - g["chat_logits"]).max() < 4e-5
        code = llm.prompt_logits(g["code_ids"].tolist())[-8:]
        assert np.abs(code - g["code_logits"]).max() < 4e-5
        sp = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        outs = llm.generate(prompt_token_ids=[g["chat_ids"].tolist(), g["code_ids"].tolist()], sampling_params=sp)
        assert outs[0].token_ids == g["chat_greedy_ids"].tolist()
        assert outs[1].token_ids == g["code_greedy_ids"].tolist()


def test_default_model_adds_and_keeps_reasoning_tags():
    with LLM(max_model_len=512) as llm:
        out = llm.chat([{"role": "user", "content": "Compute 478 + 56."}],
                       SamplingParams(max_tokens=200, temperature=0.0),
                       chat_template_kwargs={"enable_thinking": True})[0]  # fmt: skip
    assert "</think>" in out.text  # not dropped as a special token
    assert out.text.rstrip().endswith("534")
    assert out.finish_reason == "stop"


def test_cli_generate_uses_the_embedded_model():
    cmd = [sys.executable, "-m", "pyengine", "generate", "--prompt", "What is 903 - 417?", "--max_tokens", "160",
           "--thinking", "on", "--max_model_len", "512"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=os.path.dirname(__file__))
    assert r.returncode == 0, r.stderr
    assert "486" in r.stdout
