"""Overlapped steps (engine option overlap_schedule): the next decode step is queued before the
current one's tokens are read. On the CPU the model samples at once, so these tests drive the
same engine paths CUDA takes (fed tokens, a request stopping with a step in flight, cancels,
prefix-cache snapshots planned ahead) and compare every output with the one-step-at-a-time engine."""

import os
import random
import threading
import time

import numpy as np
import pytest

from pyengine import LLM, SamplingParams

CKPT = os.path.join(os.path.dirname(__file__), "data", "ckpt_text_bf16")
POOL_KEYS = ("kv_pages_free", "gdn_slots_free", "snapshot_slots_used", "running", "waiting")


def ids(n, seed):
    r = random.Random(seed)
    return [r.randrange(500) for _ in range(n)]


def engine(overlap, **kw):
    kw.setdefault("max_batch", 4)
    kw.setdefault("max_model_len", 512)
    kw.setdefault("chunked_prefill_size", 32)
    # Full prefill chunks: step pacing cuts them by measured times, so the chunk boundaries (and
    # with them the fp32 rounding these comparisons bound) would differ from run to run.
    kw.setdefault("max_step_ms", -1)
    return LLM(CKPT, overlap_schedule=overlap, **kw)


def outputs(outs):
    return [(o.token_ids, o.finish_reason, [[t[2] for t in e["top"]] for e in (o.logprobs or [])]) for o in outs]


def assert_same(a, b, tol=1e-5):
    for (ta, ra, la), (tb, rb, lb) in zip(a, b):
        assert ta == tb and ra == rb
        if la:
            assert np.abs(np.array(la) - np.array(lb)).max() < tol


PROMPTS = [ids(n, n) for n in (5, 37, 90, 150)]


def mixed_params(stops=None):
    cases = [(20, 0.0), (33, 0.9), (7, 0.0), (40, 1.0)]
    return [SamplingParams(max_tokens=m, temperature=t, seed=7 + i, logprobs=3, ignore_eos=True,
                           stop_token_ids=stops[i] if stops else None)
            for i, (m, t) in enumerate(cases)]  # fmt: skip


def test_outputs_equal_one_step_at_a_time():
    with engine(False) as llm:
        ref = outputs(llm.generate(prompt_token_ids=PROMPTS, sampling_params=mixed_params()))
        assert llm.stats()["overlapped_steps"] == 0
    with engine(True) as llm:
        base = llm.stats()
        got = outputs(llm.generate(prompt_token_ids=PROMPTS, sampling_params=mixed_params()))
        after = llm.stats()
    assert_same(got, ref)
    # 40 tokens of the longest request: every decode step after the prefill ones overlaps.
    assert after["overlapped_steps"] >= 30 and after["steps"] == 48
    assert after["overlap_dropped_tokens"] == 0  # every request ended by length: known ahead
    for key in ("kv_pages_free", "gdn_slots_free", "running", "waiting"):
        assert after[key] == base[key], key


def test_requests_that_stop_on_a_sampled_token_with_a_step_in_flight():
    # Stop ids taken from each request's own continuation: the request ends on a sampled token
    # while the step after it is already queued (its extra token must be dropped).
    with engine(False) as llm:
        free = outputs(llm.generate(prompt_token_ids=PROMPTS, sampling_params=mixed_params()))
    stops = [[toks[len(toks) // 2]] for toks, _, _ in free]
    with engine(False) as llm:
        ref = outputs(llm.generate(prompt_token_ids=PROMPTS, sampling_params=mixed_params(stops)))
    assert [r for _, r, _ in ref].count("stop") >= 3
    with engine(True, prefix_cache=False) as llm:
        base = llm.stats()
        got = outputs(llm.generate(prompt_token_ids=PROMPTS, sampling_params=mixed_params(stops)))
        # Then the same engine keeps serving: slots and pages came back and hold no stale state.
        again = outputs(llm.generate(prompt_token_ids=PROMPTS, sampling_params=mixed_params(stops)))
        after = llm.stats()
    # A stopped request's extra step changes the batch shape of that step: fp32 rounding only.
    assert_same(got, ref, 1e-4)
    assert_same(again, ref, 1e-4)
    assert after["overlap_dropped_tokens"] >= 2 * 3  # a stop with the next step queued, both runs
    for key in POOL_KEYS:
        assert after[key] == base[key], key


def test_decode_snapshots_of_overlapped_steps_serve_the_next_turn():
    sp = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=5)
    p1 = ids(100, 1)
    with engine(True, max_batch=2, max_model_len=1024, chunked_prefill_size=64) as llm, \
         engine(False, max_batch=2, max_model_len=1024, chunked_prefill_size=64, prefix_cache=False) as ref:  # fmt: skip
        turn1 = llm.generate(prompt_token_ids=[p1], sampling_params=sp)[0]
        p2 = p1 + turn1.token_ids + ids(30, 2)
        before = llm.stats()["prefix_cache_hit_tokens"]
        turn2 = llm.generate(prompt_token_ids=[p2], sampling_params=sp)[0]
        hit = llm.stats()["prefix_cache_hit_tokens"] - before
        want = ref.generate(prompt_token_ids=[p2], sampling_params=sp)[0]
    # Turn 1 computed 100 + 39 tokens: its decode snapshot at 128 (taken in an overlapped step).
    assert hit == 128
    assert turn2.token_ids == want.token_ids
    lp = np.array([[t[2] for t in e["top"]] for e in turn2.logprobs])
    lp_ref = np.array([[t[2] for t in e["top"]] for e in want.logprobs])
    assert np.abs(lp - lp_ref).max() < 1e-3  # chunk boundaries differ (fp32 rounding)


def test_a_request_arriving_during_overlapped_decode_is_admitted_and_correct():
    sp_long = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    sp_short = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    with engine(False) as llm:
        ref_long = llm.generate(prompt_token_ids=[PROMPTS[1]], sampling_params=sp_long)[0].token_ids
        ref_short = llm.generate(prompt_token_ids=[PROMPTS[3]], sampling_params=sp_short)[0].token_ids
    with engine(True) as llm:
        long_stream = llm.submit(prompt_token_ids=PROMPTS[1], sampling_params=sp_long)
        while llm.stats()["generated_tokens"] < 10:
            time.sleep(0.001)
        short = llm.generate(prompt_token_ids=[PROMPTS[3]], sampling_params=sp_short)[0].token_ids
        long = [t for ev in long_stream for t in ev.token_ids]
    assert long == ref_long and short == ref_short


def test_random_cancels_with_overlap_end_every_request_and_return_the_pools():
    rng = random.Random(11)
    with engine(True, max_batch=6) as llm:
        base = llm.stats()
        streams = []
        for i in range(120):
            sp = SamplingParams(max_tokens=rng.randint(1, 24), temperature=rng.choice([0.0, 0.8]), seed=i,
                                stop_token_ids=[rng.randrange(500)])  # fmt: skip
            streams.append(llm.submit(prompt_token_ids=ids(rng.randint(1, 120), 300 + i), sampling_params=sp))
        to_cancel = rng.sample(streams, 40)
        threading.Thread(target=lambda: [s.cancel() or time.sleep(0.002) for s in to_cancel]).start()
        reasons = []
        for s in streams:
            tokens, last = [], None
            for ev in s:
                tokens += ev.token_ids
                last = ev
            assert last is not None and last.finished and last.finish_reason in ("length", "stop", "cancelled")
            assert len(tokens) <= s.sampling_params.max_tokens
            reasons.append(last.finish_reason)
        assert reasons.count("cancelled") >= 1 and reasons.count("length") >= 1
        time.sleep(0.05)
        after = llm.stats()
    for key in ("gdn_slots_free", "running", "waiting"):
        assert after[key] == base[key], key
    assert after["kv_pages_free"] == base["kv_pages_free"]  # pages held only by the cache count as free


def test_overlap_schedule_out_of_range_is_refused_with_its_name():
    from pyengine._native import native

    n = native()
    p = n.lib.pe_engine_default_params()
    assert p.overlap_schedule == -1  # auto
    p.overlap_schedule = 2
    with engine(False) as llm:
        out = n.ffi.new("pe_engine**")
        rc = n.lib.pe_engine_create(llm._model.handle, n.ffi.new("pe_engine_params*", p), out)
    assert rc != 0 and "overlap_schedule" in n.last_error()


@pytest.mark.parametrize("flag, want", [("auto", None), ("on", True), ("off", False)])
def test_cli_flag_maps_to_the_engine_option(flag, want):
    import argparse

    from pyengine.cli import add_engine_arguments, engine_kwargs

    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    assert engine_kwargs(p.parse_args(["--overlap_schedule", flag]))["overlap_schedule"] is want


@pytest.mark.parametrize("penalty", [{"repetition_penalty": 1.3}, {"presence_penalty": 0.8},
                                     {"frequency_penalty": 0.6}])  # fmt: skip
def test_penalties_run_one_step_at_a_time(penalty):
    # A penalty reads the token history on the host: a step needs its predecessor's token first.
    params = [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, **penalty) for _ in PROMPTS[:2]]
    with engine(False) as llm:
        ref = outputs(llm.generate(prompt_token_ids=PROMPTS[:2], sampling_params=params))
    with engine(True) as llm:
        got = outputs(llm.generate(prompt_token_ids=PROMPTS[:2], sampling_params=params))
        assert llm.stats()["overlapped_steps"] == 0
    assert_same(got, ref)
