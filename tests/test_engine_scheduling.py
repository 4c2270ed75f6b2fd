"""Continuous batching behaviour of the engine, measured in engine steps (ev.step), not seconds."""

import os
import random
import threading
import time

import numpy as np
import pytest

from pyengine import LLM, SamplingParams
from pyengine.errors import CapacityError

CKPT = os.path.join(os.path.dirname(__file__), "data", "ckpt_text_bf16")
VOCAB = 500  # below the special tokens


def golden(key):
    """A prompt of the checkpoint's transformers goldens and its greedy continuation."""
    g = np.load(os.path.join(CKPT, "goldens.npz"))
    return g[f"prompt_{key}_ids"].tolist(), g[f"greedy_{key}_ids"].tolist()


def ids(n, seed):
    r = random.Random(seed)
    return [r.randrange(VOCAB) for _ in range(n)]


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def wait_steps(llm, at_least):
    while llm.stats()["steps"] < at_least:
        time.sleep(0.0005)


def first_token_step(stream):
    for ev in stream:
        if ev.token_ids:
            return ev.token_steps[0]  # ev.step is the step of the event's last token
    raise AssertionError("stream ended without a token")


def collect(stream):
    steps, tokens, last = [], [], None
    for ev in stream:
        steps += ev.token_steps
        tokens += ev.token_ids
        last = ev
    return steps, tokens, last


LONG = 2400  # 150 chunks of 16


@pytest.mark.parametrize("cooperative", [True, False])
def test_short_request_during_long_prefill(cooperative):
    with LLM(CKPT, max_batch=4, max_model_len=4096, chunked_prefill_size=16,
             cooperative_prefill=cooperative) as llm:  # fmt: skip
        long = llm.submit(prompt_token_ids=ids(LONG, 1), sampling_params=greedy(2))
        wait_steps(llm, 3)
        short = llm.submit(prompt_token_ids=ids(10, 2), sampling_params=greedy(2))
        submitted = llm.stats()["steps"]
        short_first = first_token_step(short)
        long_first = first_token_step(long)
        if cooperative:
            assert short_first <= submitted + 2
            assert short_first < long_first  # it did not wait for the long prefill
        else:
            assert short_first > long_first - 1  # blocked until the long prefill ended
            assert long_first - submitted > 10


def test_running_request_decodes_every_step_during_long_prefill():
    with LLM(CKPT, max_batch=4, max_model_len=4096, chunked_prefill_size=16) as llm:
        short = llm.submit(prompt_token_ids=ids(8, 3), sampling_params=greedy(400))
        wait_steps(llm, 3)
        long = llm.submit(prompt_token_ids=ids(LONG, 4), sampling_params=greedy(1))
        long_first = first_token_step(long)
        steps, tokens, last = collect(short)
        during = [s for s in steps if s <= long_first]
        assert len(during) > 100  # the long prefill took > 100 steps ...
        assert during == list(range(during[0], during[0] + len(during)))  # ... a token each step


def test_cancel_during_long_prefill_frees_everything_and_keeps_cached_blocks():
    with LLM(CKPT, max_batch=2, max_model_len=4096, chunked_prefill_size=16) as llm:
        base = llm.stats()
        prompt = ids(LONG, 5)
        s = llm.submit(prompt_token_ids=prompt, sampling_params=greedy(4))
        wait_steps(llm, 20)
        cancelled_at = llm.stats()["steps"]
        s.cancel()
        steps, tokens, last = collect(s)
        assert last.finish_reason == "cancelled" and tokens == []
        assert last.step <= cancelled_at + 1
        after = llm.stats()
        prompt_tokens_after = after["prompt_tokens"]
        time.sleep(0.05)
        assert llm.stats()["prompt_tokens"] == prompt_tokens_after  # no chunk ran after it
        assert prompt_tokens_after < LONG
        for key in ("kv_pages_free", "gdn_slots_free", "running", "waiting"):
            assert after[key] == base[key], key
        again = llm.generate(prompt_token_ids=[prompt], sampling_params=greedy(4))[0]
        assert llm.stats()["prefix_cache_hit_tokens"] > 0
    with LLM(CKPT, max_batch=2, max_model_len=4096, chunked_prefill_size=16, prefix_cache=False) as ref:
        assert again.token_ids == ref.generate(prompt_token_ids=[prompt], sampling_params=greedy(4))[0].token_ids


def test_max_batch_requests_run_in_the_same_steps():
    # A's long prefill (125 chunks) leaves ample time to submit B and C; once A decodes, every
    # step carries a token of all three (max_batch 3, no clamping).
    with LLM(CKPT, max_batch=3, max_model_len=4096, chunked_prefill_size=16) as llm:
        a = llm.submit(prompt_token_ids=ids(2000, 10), sampling_params=greedy(60))
        b, c = (llm.submit(prompt_token_ids=ids(20, 11 + i), sampling_params=greedy(600)) for i in range(2))
        steps = [collect(s)[0] for s in (a, b, c)]
        assert min(steps[1]) < min(steps[0]) and min(steps[2]) < min(steps[0])  # B, C started first
        a_steps = steps[0]
        assert a_steps == list(range(a_steps[0], a_steps[0] + 60))
        for other in steps[1:]:
            assert set(a_steps) <= set(other)
        assert llm.stats()["plan"]["gdn_slots"] == 3


def test_running_never_exceeds_max_batch():
    """Every admitted short prompt gets a token in every step until it ends, so the requests with
    a token in a step are the running ones: never more than max_batch, and max_batch reached."""
    lengths = [7, 3, 12, 5, 9, 4, 6]
    with LLM(CKPT, max_batch=2, max_model_len=256) as llm:
        # One add for the batch (as generate() queues it), so all seven wait from the first step.
        batch = [llm._engine_item(ids(5 + i, 40 + i), greedy(n)) for i, n in enumerate(lengths)]
        streams = [llm._stream(None, item, a) for item, a in zip(batch, llm._engine.add_requests(batch))]
        per_step = {}
        for s in streams:
            steps, tokens, last = collect(s)
            assert len(tokens) == len(set(steps)) == s.sampling_params.max_tokens
            for step in steps:
                per_step[step] = per_step.get(step, 0) + 1
        assert max(per_step.values()) == 2, per_step
        assert sum(per_step.values()) == sum(lengths)
        assert sorted(per_step) == list(range(len(per_step)))  # a freed slot is refilled at once
        assert llm.stats()["plan"]["gdn_slots"] == 2


def test_impossible_configuration_fails_with_numbers(capfd):
    with pytest.raises(CapacityError, match=r"max_batch 64 .*max_model_len 4096.*needs at least \d+ bytes"):
        LLM(CKPT, max_batch=64, max_model_len=4096, kv_cache_bytes=1_000_000)
    with LLM(CKPT, max_batch=2, max_model_len=512) as llm:
        plan = llm.stats()["plan"]
    err = capfd.readouterr().err
    assert "memory plan" in err and f"{plan['kv_pages']} KV pages" in err
    assert plan["context_tokens_per_session"] == 512 and plan["sessions_at_full_context"] >= 2


def test_greedy_output_is_the_same_alone_and_batched():
    prompts = [ids(n, 20 + n) for n in (5, 37, 90, 150)]
    with LLM(CKPT, max_batch=1, max_model_len=512, prefix_cache=False) as llm:
        alone = [llm.generate(prompt_token_ids=[p], sampling_params=greedy(16))[0].token_ids for p in prompts]
    with LLM(CKPT, max_batch=4, max_model_len=512, chunked_prefill_size=32) as llm:
        batched = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=greedy(16))]
    assert alone == batched


def test_many_requests_with_random_cancels_all_end_and_pools_return():
    rng = random.Random(7)
    with LLM(CKPT, max_batch=6, max_model_len=512, chunked_prefill_size=32) as llm:
        base = llm.stats()
        streams = []
        for i in range(200):
            sp = SamplingParams(max_tokens=rng.randint(1, 24), temperature=rng.choice([0.0, 0.8]), seed=i)
            streams.append(llm.submit(prompt_token_ids=ids(rng.randint(1, 200), 100 + i), sampling_params=sp))
        to_cancel = rng.sample(streams, 60)
        threading.Thread(target=lambda: [s.cancel() or time.sleep(0.001) for s in to_cancel]).start()
        reasons = []
        for s in streams:
            steps, tokens, last = collect(s)
            assert last is not None and last.finished
            assert last.finish_reason in ("length", "stop", "cancelled")
            assert len(tokens) <= s.sampling_params.max_tokens
            reasons.append(last.finish_reason)
        assert reasons.count("cancelled") >= 1 and reasons.count("length") >= 1
        time.sleep(0.05)
        after = llm.stats()
        for key in ("kv_pages_free", "gdn_slots_free", "running", "waiting"):
            assert after[key] == base[key], key


@pytest.mark.parametrize("bad", [ids(80, 3), [VOCAB, 10**6]], ids=["too long", "outside the vocabulary"])
def test_a_bad_prompt_in_a_batch_queues_none_of_the_batch(bad):
    """generate() checks every prompt before it queues the first: nothing of the batch runs."""
    with LLM(CKPT, max_model_len=64) as llm:
        with pytest.raises(ValueError, match="max_model_len|outside the vocabulary"):
            llm.generate(prompt_token_ids=[ids(5, 1), ids(5, 2), bad], sampling_params=greedy(4))
        st = llm.stats()
        assert (st["running"], st["waiting"], st["prompt_tokens"], st["steps"]) == (0, 0, 0, 0)
        prompt, want = golden("7")
        out = llm.generate(prompt_token_ids=[prompt], sampling_params=greedy(4))[0]
        assert out.token_ids == want[:4]  # and the engine keeps serving, correctly


class StepAfterEachAdd:
    """Stands in for an engine's binding: each add returns only once the engine thread has run
    another step. Under this timing a batch added one prompt at a time gets one step per prompt;
    a batch added in one call still gets one step."""

    def __init__(self, llm):
        engine = llm._engine
        self._real, self._handle = engine._n, engine.handle
        self.ffi, self.check, self.lib = self._real.ffi, self._real.check, self
        engine._n = self

    def _steps(self) -> int:
        s = self.ffi.new("pe_engine_stats*")
        self._real.check(self._real.lib.pe_engine_get_stats(self._handle, s))
        return s.steps

    def __getattr__(self, name):  # the lib's functions, the two adds wrapped
        fn = getattr(self._real.lib, name)
        if not name.startswith("pe_engine_add_request"):
            return fn

        def add_then_wait_for_a_step(*args):
            before = self._steps()
            status = fn(*args)
            deadline = time.monotonic() + 30
            while status == 0 and self._steps() == before and time.monotonic() < deadline:
                time.sleep(0.0005)
            return status

        return add_then_wait_for_a_step


def first_token_steps(llm, monkeypatch) -> dict:
    """request id -> engine step of its first token, filled by the dispatcher as events arrive."""
    steps: dict = {}
    engine = llm._engine
    route, token = engine._route, engine._n.lib.PE_EVENT_TOKEN

    def record(ev):
        if ev.kind == token:
            steps.setdefault(ev.request_id, ev.step)
        route(ev)

    monkeypatch.setattr(engine, "_route", record)
    return steps


def test_a_generate_batch_is_admitted_in_one_step(monkeypatch):
    # The whole batch fits one step's budget (228 prompt tokens, chunk 512), so one admission
    # gives every prompt its first token in the engine's first step, however late the engine
    # thread runs. One add per prompt fails here: StepAfterEachAdd lets a step run between adds.
    prompts, wants = zip(*(golden(k) for k in ("1", "7", "70", "150")))
    with LLM(CKPT, max_batch=4, max_model_len=512) as llm:
        first = first_token_steps(llm, monkeypatch)
        StepAfterEachAdd(llm)
        outs = llm.generate(prompt_token_ids=list(prompts), sampling_params=greedy(3))
        assert [o.token_ids for o in outs] == [w[:3] for w in wants]
        assert [first[o.request_id] for o in outs] == [0, 0, 0, 0]
        assert llm.stats()["steps"] == 3


@pytest.mark.parametrize("bad_index, bad, message", [
    (2, [3, 512], r"request 2: prompt token 1 has id 512 outside the vocabulary \[0, 512\)"),
    (0, [], "request 0: prompt is empty"),
])  # fmt: skip
def test_a_refused_request_queues_none_of_its_batch(bad_index, bad, message):
    """The native check of pe_engine_add_requests (past generate's own checks): the error names
    the request, nothing is queued, no id is used, and the engine keeps serving."""
    with LLM(CKPT, max_model_len=64) as llm:
        assert llm.config.vocab_size == 512
        batch = [(ids(5, 1), greedy(4), 0), (ids(7, 2), greedy(4), 0), (ids(6, 3), greedy(4), 0)]
        batch[bad_index] = (bad, greedy(4), 0)
        with pytest.raises(ValueError, match=f"^{message}$"):
            llm._engine.add_requests(batch)
        time.sleep(0.05)  # a queued request would be running or waiting by now
        st = llm.stats()
        assert (st["running"], st["waiting"], st["prompt_tokens"], st["steps"]) == (0, 0, 0, 0)
        assert llm._engine._queues == {}
        (p1, w1), (p2, w2) = golden("7"), golden("1")
        outs = llm.generate(prompt_token_ids=[p1, p2], sampling_params=greedy(4))
        assert [o.request_id for o in outs] == [1, 2]
        assert [o.token_ids for o in outs] == [w1[:4], w2[:4]]


def test_add_requests_refuses_an_empty_batch_natively():
    with LLM(CKPT, max_model_len=64) as llm:
        n, handle = llm._engine._n, llm._engine.handle
        args = (n.ffi.new("int32_t*[]", 1), n.ffi.new("int64_t[]", 1), n.ffi.new("pe_sampling_params[]", 1),
                n.ffi.new("uint64_t[]", 1))  # fmt: skip
        assert n.lib.pe_engine_add_requests(handle, 0, *args) == n.lib.PE_ERR_INVALID_ARGUMENT
        assert n.last_error() == "n_requests must be >= 1, got 0"
        assert llm.generate(prompt_token_ids=[]) == []
        assert llm.stats()["steps"] == 0
