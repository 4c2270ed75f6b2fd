"""Decodes keep streaming through a long prefill (engine option max_step_ms), on the CPU with the
embedded default model. Bounds are relative to step costs measured in the same test (event times
from the engine), never absolute times: the machine may be slow or shared."""

import random
import statistics
import time

import pytest

from pyengine import LLM, SamplingParams

LONG = 3072  # 12 chunks of 256
CHUNK = 256


def ids(n, seed):
    r = random.Random(seed)
    return [r.randrange(500) for _ in range(n)]


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def p99(gaps):
    """p99 of (seconds, step that ended it) gaps, those of the slowest step left out: one stall of
    the engine thread (another process on a shared 2-core machine) is not the scheduler's doing."""
    worst_step = max(gaps)[1]
    s = sorted(g for g, step in gaps if step != worst_step)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def median(gaps):
    return statistics.median(g for g, _ in gaps)


class Run:
    """One engine; every prompt distinct (prefix cache off)."""

    def __init__(self, **kw):
        self.llm = LLM(None, max_batch=6, max_model_len=LONG + 2048, chunked_prefill_size=CHUNK,
                       prefix_cache=False, **kw)  # fmt: skip
        self.seed = 0
        self.submit(16, 16).result()  # a prefill and decode steps: the step-cost model gets ready

    def submit(self, n_prompt, max_tokens):
        self.seed += 1
        return self.llm.submit(prompt_token_ids=ids(n_prompt, self.seed), sampling_params=greedy(max_tokens))

    def first_token_time(self, n_prompt) -> tuple[float, float]:
        """(submit time, first token time) of an n_prompt request that makes one token."""
        t0 = time.monotonic()
        stream = self.submit(n_prompt, 1)
        times = [t for ev in stream for t in ev.token_times]
        return t0, times[0]

    def decoders_during_long_prefill(self, n_decoders, solo_tokens=12) -> dict:
        """n requests decode, then the long prompt arrives: their gaps between steps that give them
        tokens while it prefills (a speculative step gives one several, at one time)."""
        streams = [self.submit(16, 1 << 20) for _ in range(n_decoders)]
        iters = [iter(s) for s in streams]
        solo = []
        for it in iters:
            times = []
            while len(times) < solo_tokens:
                ev = next(it)
                times += [t for i, t in enumerate(ev.token_times) if i == 0 or ev.token_steps[i] != ev.token_steps[i - 1]]
            solo.append(times)
        solo_gap = statistics.median(b - a for ts in solo for a, b in zip(ts[2:], ts[3:]))
        t_long, long_first = self.first_token_time(LONG)
        for s in streams:
            s.cancel()
        gaps = []  # (seconds, step that ended it)
        for it in iters:
            during = [(t, step) for ev in it for t, step in zip(ev.token_times, ev.token_steps)
                      if t_long <= t <= long_first]  # fmt: skip
            during = [d for i, d in enumerate(during) if i == 0 or d[1] != during[i - 1][1]]  # a step's first
            gaps += [(b - a, step) for (a, _), (b, step) in zip(during, during[1:])]
        return {"solo_gap": solo_gap, "gaps": gaps, "prefill_s": long_first - t_long}

    def close(self):
        self.llm.close()


@pytest.fixture(scope="module")
def unpaced():
    """The same experiments with pacing off: the step costs the bounds are relative to."""
    run = Run(max_step_ms=-1)
    try:
        t0, first = run.first_token_time(LONG)
        out = {"alone_s": first - t0, "by_decoders": {n: run.decoders_during_long_prefill(n) for n in (1, 4)}}
        out["chunk_s"] = out["alone_s"] / (LONG / CHUNK)
        yield out
    finally:
        run.close()


@pytest.mark.slow
def test_a_step_limit_bounds_the_decoders_gaps_during_a_long_prefill(unpaced):
    # A limit of the measured decode step (4 decoding) plus a fifth of a measured full chunk. The
    # tail bound is twice the limit: a step runs over when the machine is busier than the cost
    # model has seen (another process), and CI shares its two cores with nothing but the suite.
    limit = unpaced["by_decoders"][4]["solo_gap"] + 0.2 * unpaced["chunk_s"]
    run = Run(max_step_ms=limit * 1e3)
    try:
        t0, first = run.first_token_time(LONG)  # alone: full chunks, which the cost model learns
        alone_s = first - t0
        for n in (1, 4):
            paced, off = run.decoders_during_long_prefill(n), unpaced["by_decoders"][n]
            assert len(paced["gaps"]) >= 20, paced
            assert median(paced["gaps"]) <= 1.25 * limit, (n, paced["gaps"], limit)
            assert p99(paced["gaps"]) <= 2.0 * limit, (n, paced["gaps"], limit)
            assert p99(off["gaps"]) > 2.0 * limit, (n, off["gaps"], limit)  # the bound bites unpaced
            assert paced["prefill_s"] <= 2.0 * alone_s, (n, paced["prefill_s"], alone_s)  # it keeps going
        assert run.llm.stats()["paced_steps"] >= 20
    finally:
        run.close()


@pytest.mark.slow
def test_speculative_verify_steps_are_paced_as_decode_rows(unpaced):
    """Verify chunks count as decode rows and a speculating engine times each step with its
    proposer's turn: a limit of the measured speculative step (4 decoding, MTP k = 2) plus a fifth
    of a full chunk bounds their gaps between steps as it does plain decoding's."""
    spec = {"speculative_algorithm": "mtp", "speculative_num_draft_tokens": 2}
    probe = Run(max_step_ms=-1, **spec)
    try:
        off = probe.decoders_during_long_prefill(4)
    finally:
        probe.close()
    limit = off["solo_gap"] + 0.2 * unpaced["chunk_s"]
    run = Run(max_step_ms=limit * 1e3, **spec)
    try:
        run.first_token_time(LONG)  # alone: full chunks, which the cost model learns
        paced = run.decoders_during_long_prefill(4)
        assert len(paced["gaps"]) >= 20, paced
        assert median(paced["gaps"]) <= 1.25 * limit, (paced["gaps"], limit)
        assert p99(paced["gaps"]) <= 2.0 * limit, (paced["gaps"], limit)
        assert p99(off["gaps"]) > 2.0 * limit, (off["gaps"], limit)  # the bound bites unpaced
        st = run.llm.stats()
        assert st["paced_steps"] >= 20 and st["spec_verifies"] > 0 and st["spec_propose_seconds"] > 0
    finally:
        run.close()


@pytest.mark.slow
def test_the_derived_limit_keeps_most_of_the_prefill_rate_and_cuts_the_gaps(unpaced):
    run = Run()  # max_step_ms 0: derived from the cost model, 80 % of the full-chunk prefill rate
    try:
        t0, first = run.first_token_time(LONG)
        alone_s = first - t0
        paced, off = run.decoders_during_long_prefill(1), unpaced["by_decoders"][1]
        # Aimed at 80 %; a shared 2-core machine's timing noise gets the rest of the margin.
        assert alone_s / paced["prefill_s"] >= 0.6, (alone_s, paced["prefill_s"])
        assert p99(paced["gaps"]) <= 0.5 * p99(off["gaps"]), (p99(paced["gaps"]), p99(off["gaps"]))
        assert median(paced["gaps"]) <= 0.5 * unpaced["chunk_s"]
        st = run.llm.stats()
        assert st["max_step_ms"] == 0.0 and st["cost_model_ready"] == 1
    finally:
        run.close()


@pytest.mark.slow
def test_a_short_request_gets_its_first_token_within_2_percent_of_a_long_prefill():
    # Chunks of 16: the short request waits for the step in flight (a full chunk, 1/256 of the
    # prefill) and then one step with its prompt and one block of the long one (measured: 0.7-1.0 %).
    long_n = 4096
    with LLM(None, max_batch=3, max_model_len=long_n + 512, chunked_prefill_size=16, prefix_cache=False) as llm:
        llm.generate(prompt_token_ids=[ids(16, 1)], sampling_params=greedy(16))
        start = llm.stats()["steps"]
        t_long = time.monotonic()
        long = llm.submit(prompt_token_ids=ids(long_n, 2), sampling_params=greedy(1))
        while llm.stats()["steps"] < start + 20:  # inside the long prefill (256 steps)
            time.sleep(0.0005)
        t_short = time.monotonic()
        short = llm.submit(prompt_token_ids=ids(16, 3), sampling_params=greedy(2))
        short_first = [t for ev in short for t in ev.token_times][0]
        long_first = [t for ev in long for t in ev.token_times][0]
        ratio = (short_first - t_short) / (long_first - t_long)
        assert ratio <= 0.02, ratio


@pytest.mark.slow
def test_pacing_at_tensor_parallel_2_cuts_the_long_prefill_and_decodes_every_step():
    # Rank 0 schedules and times whole steps, all-reduces included: the same pacing, in steps.
    long_n = 1536
    with LLM(None, tensor_parallel_size=2, num_threads=1, max_batch=3, max_model_len=long_n + 512,
             chunked_prefill_size=CHUNK, prefix_cache=False) as llm:  # fmt: skip
        llm.generate(prompt_token_ids=[ids(16, 1)], sampling_params=greedy(16))
        llm.generate(prompt_token_ids=[ids(CHUNK * 2, 2)], sampling_params=greedy(1))  # full chunks
        decoder = llm.submit(prompt_token_ids=ids(16, 3), sampling_params=greedy(1 << 20))
        it = iter(decoder)
        next(it)
        long = llm.submit(prompt_token_ids=ids(long_n, 4), sampling_params=greedy(1))
        long_step = [s for ev in long for s in ev.token_steps][0]
        decoder.cancel()
        steps = [s for ev in it for s in ev.token_steps]
        during = [s for s in steps if s <= long_step]
        assert during == list(range(during[0], long_step + 1))  # a token every step
        assert len(during) > 1.5 * long_n / CHUNK  # the prefill went in cut chunks
        assert llm.stats()["paced_steps"] >= len(during) - 2
