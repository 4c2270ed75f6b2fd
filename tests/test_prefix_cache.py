"""Prefix cache for the hybrid model: KV blocks + GDN snapshots, compared with cache-less runs."""

import os
import random

import numpy as np

from pyengine import LLM, SamplingParams

CKPT = os.path.join(os.path.dirname(__file__), "data", "ckpt_text_bf16")
PAGE = 16


def ids(n, seed):
    r = random.Random(seed)
    return [r.randrange(500) for _ in range(n)]


SP = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=5)


def run(llm, prompt):
    before = llm.stats()["prefix_cache_hit_tokens"]
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=SP)[0]
    return out, llm.stats()["prefix_cache_hit_tokens"] - before


def assert_same(out, ref):
    assert out.token_ids == ref.token_ids
    lp = np.array([[t[2] for t in e["top"]] for e in out.logprobs])
    lp_ref = np.array([[t[2] for t in e["top"]] for e in ref.logprobs])
    # Chunk boundaries differ (fp32 rounding, ~1e-4); a wrong snapshot moves logprobs by > 0.1.
    assert np.abs(lp - lp_ref).max() < 1e-3


def test_second_turn_prefills_only_new_tokens():
    p1 = ids(100, 1)
    with LLM(CKPT, max_batch=2, max_model_len=1024, chunked_prefill_size=64) as llm, \
         LLM(CKPT, max_batch=2, max_model_len=1024, chunked_prefill_size=64, prefix_cache=False) as ref:  # fmt: skip
        turn1, hit1 = run(llm, p1)
        assert hit1 == 0
        p2 = p1 + turn1.token_ids + ids(30, 2)
        prompt_before = llm.stats()["prompt_tokens"]
        turn2, hit2 = run(llm, p2)
        computed_in_turn1 = len(p1) + len(turn1.token_ids) - 1  # the last token is never fed
        assert hit2 == computed_in_turn1 // PAGE * PAGE == 112
        assert turn2.cached_tokens == hit2
        assert llm.stats()["prompt_tokens"] - prompt_before == len(p2) - hit2
        assert_same(turn2, ref.generate(prompt_token_ids=[p2], sampling_params=SP)[0])


def test_interleaved_sessions_never_mix():
    sessions = {name: ids(40 + 13 * i, 10 + i) for i, name in enumerate("ABC")}
    order = ["A", "B", "A", "C", "B", "A", "C", "B"]
    with LLM(CKPT, max_batch=2, max_model_len=2048, chunked_prefill_size=48) as llm, \
         LLM(CKPT, max_batch=2, max_model_len=2048, prefix_cache=False) as ref:  # fmt: skip
        hits = 0
        for turn, name in enumerate(order):
            prompt = sessions[name]
            out, hit = run(llm, prompt)
            assert_same(out, ref.generate(prompt_token_ids=[prompt], sampling_params=SP)[0])
            hits += hit
            sessions[name] = prompt + out.token_ids + ids(9, 100 + turn)
        assert hits > 0


def test_shared_system_prompt_hits_across_sessions():
    system = ids(64, 42)
    with LLM(CKPT, max_batch=2, max_model_len=1024, snapshot_interval_pages=2) as llm, \
         LLM(CKPT, max_batch=2, max_model_len=1024, prefix_cache=False) as ref:  # fmt: skip
        run(llm, system + ids(20, 1))
        out, hit = run(llm, system + ids(25, 2))
        assert hit == 64
        assert_same(out, ref.generate(prompt_token_ids=[system + ids(25, 2)], sampling_params=SP)[0])


def test_eviction_under_memory_pressure_keeps_outputs_correct():
    # One GDN snapshot slot and ~35 KV pages: every few turns evicts snapshots and blocks.
    budget = 33792 + 40 * 8192
    sessions = {i: ids(60 + 7 * i, 200 + i) for i in range(5)}
    with LLM(CKPT, max_batch=1, max_model_len=512, kv_cache_bytes=budget) as llm, \
         LLM(CKPT, max_batch=1, max_model_len=512, prefix_cache=False) as ref:  # fmt: skip
        plan = llm.stats()["plan"]
        assert plan["snapshot_slots"] == 1 and plan["kv_pages"] < 40
        rng = random.Random(3)
        for turn in range(12):
            i = rng.randrange(5)
            out, hit = run(llm, sessions[i])
            assert_same(out, ref.generate(prompt_token_ids=[sessions[i]], sampling_params=SP)[0])
            sessions[i] = (sessions[i] + out.token_ids + ids(5, turn))[-300:]
        s = llm.stats()
        assert s["kv_pages_free"] == s["kv_pages_total"] and s["gdn_slots_free"] == s["gdn_slots_total"]
