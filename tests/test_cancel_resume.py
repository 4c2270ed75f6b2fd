"""A prompt cancelled mid-prefill is resumable: what it computed stays in the prefix cache, with
the GDN state at the last block boundary it reached, so sending it again prefills only the rest.
Also the progress events that tell how far a prefill got (one per computed chunk).

The snapshot interval is set far beyond the prompt, so none of the regular snapshots (every
N blocks) helps: only the cancel path can make the resend cheap. Chunks of 96 tokens end on a
block boundary (the live state is copied at the cancel); chunks of 99 end inside a block (the
chunk snapshots its last boundary while it runs)."""

import os
import random

import pytest
from test_prefix_cache import assert_same

from pyengine import LLM, SamplingParams

CKPT = os.path.join(os.path.dirname(__file__), "data", "ckpt_text_bf16")
PAGE = 16
N_PROMPT = 1500
SP = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=5)


def prompt_ids(seed: int, n: int = N_PROMPT) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(500) for _ in range(n)]


def engine(chunk: int, **kw) -> LLM:
    return LLM(CKPT, max_batch=2, max_model_len=2048, chunked_prefill_size=chunk,
               snapshot_interval_pages=1000, **kw)  # fmt: skip


def cancel_after_half(llm: LLM, prompt: list[int]) -> int:
    """Submits `prompt`, cancels it once a progress event says half of it is computed; returns
    how far the prefill had got by the last progress event before the end."""
    stream = llm.submit(prompt_token_ids=prompt, sampling_params=SP, return_progress=True)
    processed, cancelled = 0, False
    for ev in stream:
        if ev.prompt_progress is not None:
            processed = ev.prompt_progress["processed"]
            if processed >= len(prompt) // 2 and not cancelled:
                stream.cancel()
                cancelled = True
        assert not ev.token_ids, "the prompt finished before the cancel"
        if ev.finished:
            assert ev.finish_reason == "cancelled"
    return processed


@pytest.mark.parametrize("chunk", [96, 99])
def test_resend_after_cancel_prefills_only_the_rest(chunk):
    prompt = prompt_ids(chunk)
    with engine(chunk) as llm, LLM(CKPT, max_batch=2, max_model_len=2048, prefix_cache=False) as ref:
        reached = cancel_after_half(llm, prompt)
        assert len(prompt) // 2 <= reached < len(prompt)
        before = llm.stats()["prompt_tokens"]
        out = llm.generate(prompt_token_ids=[prompt], sampling_params=SP)[0]
        computed = llm.stats()["prompt_tokens"] - before
        # Resumed from the last block boundary the cancelled prefill reached.
        assert computed == len(prompt) - reached // PAGE * PAGE
        assert computed <= len(prompt) // 2 + PAGE
        assert out.cached_tokens == reached // PAGE * PAGE
        assert_same(out, ref.generate(prompt_token_ids=[prompt], sampling_params=SP)[0])


def test_progress_events_one_per_chunk():
    prompt = prompt_ids(7, 1000)
    with engine(256) as llm:
        stream = llm.submit(prompt_token_ids=prompt, sampling_params=SP, return_progress=True)
        progress = [ev.prompt_progress for ev in stream if ev.prompt_progress is not None]
        assert [p["processed"] for p in progress] == [256, 512, 768, 1000]
        assert all(p["total"] == 1000 and p["cache"] == 0 for p in progress)
        times = [p["time_ms"] for p in progress]
        assert times == sorted(times) and times[0] > 0
        # The same prompt again: served from the cache up to its last full block but one token.
        stream = llm.submit(prompt_token_ids=prompt, sampling_params=SP, return_progress=True)
        progress = [ev.prompt_progress for ev in stream if ev.prompt_progress is not None]
        assert progress == [dict(progress[0], total=1000, cache=992, processed=1000)]
        # Without return_progress no progress event reaches the stream.
        stream = llm.submit(prompt_token_ids=prompt_ids(8, 600), sampling_params=SP)
        assert all(ev.prompt_progress is None for ev in stream)


def test_a_late_reader_still_gets_one_progress_event_per_chunk():
    """The stream merges the raw events already queued when it is read, but never two progress
    events: a reader that wakes after several chunks still sees each chunk's progress."""
    import queue

    from pyengine.engine import RawEvent
    from pyengine.stream import RequestStream

    q = queue.SimpleQueue()
    for done in (256, 512, 768):
        q.put(RawEvent(None, None, None, None, False, done // 256, 1.0, 1000, 0, prompt_computed=done))
    q.put(RawEvent(5, None, None, None, False, 4, 1.0, 1000, 0, prompt_computed=1000))
    q.put(RawEvent(None, None, None, "length", True, 4, 1.0, 1000, 0))
    stream = RequestStream(None, None, 1, q, None, [1] * 1000, SP)
    events = list(stream)
    assert [e.prompt_progress["processed"] for e in events if e.prompt_progress] == [256, 512, 768, 1000]
    assert [t for e in events for t in e.token_ids] == [5] and events[-1].finished
