"""Tensor parallel on the CPU communicator (one process per rank): TP > 1 gives TP = 1's greedy
tokens and logits, refuses splits that cannot work, keeps the engine's features (prefix cache,
cooperative prefill, cancels), and a rank that dies ends requests with an error instead of a hang.
"""

import os
import random
import signal
import time

import numpy as np
import pytest

from pyengine import LLM, SamplingParams
from pyengine.errors import CheckpointError

DATA = os.path.join(os.path.dirname(__file__), "data")
DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.dirname(__file__)), "pyengine", "default_model")

# checkpoint, TP size: the even split (wrapper: 6 heads, 2 GDN key heads), an uneven one (text_bf16:
# 3 query heads, 1 KV head; default model: 3 GDN key heads) and TP = 3 (interval: 3 KV heads).
CASES = [("ckpt_wrapper_bf16", 2), ("ckpt_text_bf16", 2), ("ckpt_interval_f32", 3), ("default_model", 2)]


def path(name):
    return DEFAULT_MODEL if name == "default_model" else os.path.join(DATA, name)


def prompts(n, seed, vocab):
    r = random.Random(seed)
    return [[r.randrange(vocab) for _ in range(r.randrange(3, 40))] for _ in range(n)]


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("name,tp", CASES)
def test_tp_gives_the_same_greedy_tokens_and_logits_as_tp1(name, tp):
    kw = dict(max_batch=8, max_model_len=256, num_threads=1)
    with LLM(path(name), **kw) as one, LLM(path(name), tensor_parallel_size=tp, **kw) as many:
        vocab = min(one.config.vocab_size, 500)
        ps = prompts(50, 7, vocab)
        a = one.generate(prompt_token_ids=ps, sampling_params=greedy(12))
        b = many.generate(prompt_token_ids=ps, sampling_params=greedy(12))
        same = sum(x.token_ids == y.token_ids for x, y in zip(a, b))
        assert same == 50, f"{50 - same} of 50 prompts differ at TP {tp}"
        for p in ps[:5]:
            la, lb = one.prompt_logits(p), many.prompt_logits(p)
            rel = np.abs(la - lb).max() / np.abs(la).max()
            assert rel < 1e-4, f"logits differ by {rel:.2e} (relative to the largest)"
        if one.config.mtp_num_hidden_layers:  # the MTP head's drafts, through every rank
            ma, mb = one.mtp_logits(ps[0]), many.mtp_logits(ps[0])
            rel = np.abs(ma - mb).max() / np.abs(ma).max()
            assert rel < 1e-4, f"MTP logits differ by {rel:.2e} (relative to the largest)"


@pytest.mark.parametrize("name", ["ckpt_wrapper_bf16", "default_model"])
def test_mtp_speculation_at_tp2_gives_tp1s_greedy_tokens(name):
    """Every rank keeps its hidden rows and runs the MTP head's steps; the GDN states after each
    draft position are written on every rank and the leader's rollback picks one by slot id."""
    kw = dict(max_batch=8, max_model_len=512, num_threads=1, chunked_prefill_size=64)
    with LLM(path(name), **kw) as one:
        vocab = min(one.config.vocab_size, 500)
        ps = prompts(12, 11, vocab) + [prompts(1, 12, vocab)[0] * 8]  # one prompt prefills in chunks
        want = [o.token_ids for o in one.generate(prompt_token_ids=ps, sampling_params=greedy(40))]
    with LLM(path(name), tensor_parallel_size=2, speculative_algorithm="mtp", speculative_num_draft_tokens=3,
             **kw) as two:  # fmt: skip
        got = [o.token_ids for o in two.generate(prompt_token_ids=ps, sampling_params=greedy(40))]
        assert got == want
        st = two.stats()
        assert st["spec_verifies"] > 0
        assert st["gdn_slots_free"] == st["gdn_slots_total"] and st["kv_pages_free"] == st["kv_pages_total"]
        if name == "default_model":
            assert st["spec_mean_accepted_length"] > 1.2  # the trained head drafts through both ranks


def test_a_group_of_one_runs_the_tp_path_and_equals_no_group(monkeypatch):
    kw = dict(max_batch=8, max_model_len=256, num_threads=1)
    ps = prompts(12, 3, 400)
    with LLM(path("ckpt_wrapper_bf16"), **kw) as one:  # has an MTP head
        a = one.generate(prompt_token_ids=ps, sampling_params=greedy(10))
        la, ma = one.prompt_logits(ps[0]), one.mtp_logits(ps[0])
    monkeypatch.setenv("PYENGINE_TP_GROUP_OF_ONE", "1")
    with LLM(path("ckpt_wrapper_bf16"), **kw) as grouped:
        assert grouped._tp is not None and grouped._tp.size == 1
        b = grouped.generate(prompt_token_ids=ps, sampling_params=greedy(10))
        assert [x.token_ids for x in a] == [y.token_ids for y in b]
        np.testing.assert_array_equal(la, grouped.prompt_logits(ps[0]))
        np.testing.assert_array_equal(ma, grouped.mtp_logits(ps[0]))


def test_splits_that_cannot_work_are_refused_naming_the_count():
    # 2 GDN key heads cannot go to 3 ranks.
    with pytest.raises(CheckpointError, match=r"tensor_parallel_size 3 is more than the model's GDN key heads"):
        LLM(path("ckpt_wrapper_bf16"), tensor_parallel_size=3, max_model_len=64)
    with pytest.raises(ValueError, match="tensor_parallel_size must be an int >= 1"):
        LLM(path("ckpt_wrapper_bf16"), tensor_parallel_size=0)


def test_prefix_cache_cancel_and_cooperative_prefill_at_tp2():
    kw = dict(max_batch=4, max_model_len=2048, chunked_prefill_size=32, kv_page_size=16, snapshot_interval_pages=1,
              num_threads=1)  # fmt: skip
    r = random.Random(3)
    system = [r.randrange(500) for _ in range(300)]
    with LLM(path("ckpt_wrapper_bf16"), **kw) as one, LLM(path("ckpt_wrapper_bf16"), tensor_parallel_size=2, **kw) as two:
        # The same conversation twice: the second turn reuses the first one's cached prefix.
        for llm in (one, two):
            llm.generate(prompt_token_ids=[system + [1, 2, 3]], sampling_params=greedy(4))
        turn = system + [1, 2, 3, 9, 9, 9]
        a = one.generate(prompt_token_ids=[turn], sampling_params=greedy(8))[0]
        b = two.generate(prompt_token_ids=[turn], sampling_params=greedy(8))[0]
        assert b.cached_tokens > 0 and b.cached_tokens == a.cached_tokens
        assert a.token_ids == b.token_ids
        # A long prefill with a short request inserted and some cancelled: all end, pools return.
        long = two.submit(prompt_token_ids=[r.randrange(500) for _ in range(1500)], sampling_params=greedy(4))
        streams = [two.submit(prompt_token_ids=[5, 6, 7 + i], sampling_params=greedy(6)) for i in range(6)]
        for s in streams[::2]:
            s.cancel()
        outs = [s.result() for s in streams]
        assert all(o.finish_reason in ("length", "cancelled") for o in outs)
        ref = one.generate(prompt_token_ids=[[5, 6, 8]], sampling_params=greedy(6))[0]
        assert outs[1].token_ids == ref.token_ids
        assert long.result().finish_reason == "length"
        stats = two.stats()
        assert stats["running"] == 0 and stats["waiting"] == 0


def test_a_killed_rank_ends_the_request_with_an_error_and_nothing_hangs():
    t0 = time.monotonic()
    llm = LLM(path("ckpt_wrapper_bf16"), tensor_parallel_size=2, max_batch=2, max_model_len=4096,
              chunked_prefill_size=16, num_threads=1)  # fmt: skip
    try:
        stream = llm.submit(prompt_token_ids=list(range(1, 400)) * 8, sampling_params=greedy(200))
        time.sleep(0.3)  # mid-prefill
        worker = llm._tp._procs[0]
        os.kill(worker.pid, signal.SIGKILL)
        out = stream.result()
        assert out.finish_reason == "error"
        assert "rank 1" in (out.error or "")
        deadline = time.monotonic() + 5
        while llm.health_error() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "rank 1" in (llm.health_error() or "")
        # Later requests fail at once with the same cause instead of waiting.
        later = llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=greedy(2))[0]
        assert later.finish_reason == "error"
    finally:
        llm.close()
    assert time.monotonic() - t0 < 30
