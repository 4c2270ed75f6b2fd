"""Speculative decoding (MTP and DFlash proposers) on the CUDA backend: `pytest -m gpu` on a machine
with a GPU. Token for token what plain decoding gives at T = 0 on the same device (MTP k = 1, 3, 5,
DFlash blocks; one request, and 8 at once beside a long prompt prefilling in chunks; prefix cache
on), on the default model (50 prompts) and the test checkpoints; and acceptance close to the CPU engine's."""

import os

import numpy as np
import pytest
from test_speculative import chat_prompts, check_50_prompts, check_dummy_mtp_head

from pyengine import LLM, SamplingParams
from pyengine._native import cuda_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="no CUDA device or no CUDA build")]

DATA = os.path.join(os.path.dirname(__file__), "data")


def run(llm, prompts, n_tokens):
    sp = SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=sp)]


@pytest.mark.parametrize("model", [None, os.path.join(DATA, "ckpt_wrapper_bf16")])
def test_cuda_spec_equals_plain_at_temperature_0(model):
    kw = {"device": "cuda", "max_model_len": 2048, "max_batch": 16, "chunked_prefill_size": 128}
    with LLM(model, **kw) as llm:
        if model is None:
            prompts = chat_prompts(llm, 16)
            long_prompt = llm.tokenizer.encode("The history of the printing press. " * 150)[:1500]
        else:
            rng = np.random.default_rng(0)
            prompts = [rng.integers(0, 512, size=n).tolist() for n in (3, 17, 40, 90, 5, 33, 61, 12)]
            long_prompt = rng.integers(0, 512, size=1500).tolist()
        solo = [run(llm, [p], 96)[0] for p in prompts[:4]]
        batch = run(llm, prompts[:8] + [long_prompt], 64)
    for k in (1, 3, 5):
        with LLM(model, speculative_algorithm="mtp", speculative_num_draft_tokens=k, **kw) as llm:
            assert [run(llm, [p], 96)[0] for p in prompts[:4]] == solo, k
            for _ in range(2):  # the second time from the prefix cache
                assert run(llm, prompts[:8] + [long_prompt], 64) == batch, k
            st = llm.stats()
            assert st["spec_verifies"] > 0
            if model is None:
                assert st["spec_mean_accepted_length"] > 1.5, st["spec_accept_per_position"]
            print(f"k={k}: mean accepted length {st['spec_mean_accepted_length']:.2f}, "
                  f"per position {st['spec_accept_per_position']}")


DFLASH = {"ckpt_text_bf16": os.path.join(DATA, "dflash_text_bf16"),
          None: os.path.join(os.path.dirname(DATA), "..", "pyengine", "default_model", "dflash")}


@pytest.mark.parametrize("model", [None, "ckpt_text_bf16"])
def test_cuda_dflash_spec_equals_plain_at_temperature_0(model):
    draft = DFLASH[model]
    path = model and os.path.join(DATA, model)
    kw = {"device": "cuda", "max_model_len": 2048, "max_batch": 16, "chunked_prefill_size": 128}
    rng = np.random.default_rng(0)
    with LLM(path, **kw) as llm:
        if model is None:
            prompts = chat_prompts(llm, 8)
            long_prompt = llm.tokenizer.encode("The history of the printing press. " * 150)[:1500]
        else:
            prompts = [rng.integers(0, 500, size=n).tolist() for n in (3, 17, 40, 90, 5, 33, 61, 12)]
            long_prompt = rng.integers(0, 500, size=1500).tolist()
        solo = [run(llm, [p], 96)[0] for p in prompts[:4]]
        batch = run(llm, prompts + [long_prompt], 64)
    with LLM(path, speculative_algorithm="dflash", speculative_draft_model_path=draft, **kw) as llm:
        assert [run(llm, [p], 96)[0] for p in prompts[:4]] == solo
        for _ in range(2):  # the second time from the prefix cache
            assert run(llm, prompts + [long_prompt], 64) == batch
        st = llm.stats()
        assert st["spec_verifies"] > 0
        print(f"dflash {model}: mean accepted length {st['spec_mean_accepted_length']:.2f}, "
              f"per position {st['spec_accept_per_position']}")


@pytest.mark.parametrize("algo,k", [("mtp", 1), ("mtp", 3), ("mtp", 5), ("dflash", None)])
def test_cuda_default_model_50_prompts_spec_equals_plain(algo, k):
    check_50_prompts(algo, k, device="cuda")


def test_cuda_acceptance_matches_the_cpu():
    """The same drafts up to rounding: acceptance on the same prompts within 5 points per position."""
    rates = {}
    for device in ("cpu", "cuda"):
        with LLM(device=device, max_model_len=2048, speculative_algorithm="mtp", speculative_num_draft_tokens=3) as llm:
            run(llm, chat_prompts(llm, 6), 128)
            rates[device] = llm.stats()["spec_accept_per_position"]
    print(rates)
    assert np.max(np.abs(np.array(rates["cpu"]) - np.array(rates["cuda"]))) < 0.05


def test_cuda_dummy_weights_fill_a_configured_mtp_head(tmp_path):
    """Dummy weights generated on the device (another path than the host's) fill the MTP head too."""
    check_dummy_mtp_head(tmp_path, device="cuda")
