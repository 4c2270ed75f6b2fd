"""Per-request streams: raw engine events -> token ids, text deltas, stop strings, logprobs."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from .engine import RawEvent, speculative_summary
from .sampling_params import SamplingParams
from .stop_strings import StopStringMatcher
from .tokenizer import Tokenizer


@dataclass
class StreamEvent:
    token_ids: list[int]
    text: str
    logprobs: list[dict] | None
    finished: bool
    finish_reason: str | None
    step: int
    time: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    token_steps: list[int] = field(default_factory=list)  # engine step of each token
    token_times: list[float] = field(default_factory=list)  # monotonic time of each token
    # While the prompt prefills (return_progress): llama.cpp's {total, cache, processed, time_ms},
    # processed counting cached tokens, time_ms since the request was submitted.
    prompt_progress: dict | None = None
    # The finished event: speculative acceptance of this request (engine.speculative_summary).
    speculative: dict | None = None


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[dict] | None = None
    cached_tokens: int = 0
    error: str | None = None
    # LLM.chat with tools: the answer split into reasoning, content and OpenAI tool_calls.
    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[dict] | None = None
    speculative: dict | None = None  # acceptance per draft position, mean accepted length


class RequestStream:
    """Iterate to receive StreamEvents; the last one has finished=True. cancel() is thread-safe."""

    def __init__(self, engine, tokenizer: Tokenizer | None, request_id: int, events: queue.SimpleQueue,
                 prompt: str | None, prompt_token_ids: list[int], sp: SamplingParams):  # fmt: skip
        self._engine = engine
        self._tokenizer = tokenizer
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sp
        self._events = events
        self._detok = tokenizer.detokenizer(sp.skip_special_tokens, prompt_token_ids) if tokenizer else None
        self._stops = StopStringMatcher(sp.stop, sp.include_stop_str_in_output) if sp.stop else None
        self._cancel_lock = threading.Lock()
        self._cancelled = False
        self._done = False
        self._held: RawEvent | None = None  # a progress event kept for the next StreamEvent
        self._n_tokens = 0
        self._t_submit = time.monotonic()

    def cancel(self) -> None:
        with self._cancel_lock:
            if self._cancelled or self._done:
                return
            self._cancelled = True
        self._engine.cancel(self.request_id)

    def __iter__(self):
        return self

    def __next__(self) -> StreamEvent:
        if self._done:
            raise StopIteration
        raws = [self._held or self._events.get()]
        self._held = None
        # Merge whatever else is already there, but one progress event per StreamEvent: each
        # prefill chunk's progress reaches the caller, however late it reads.
        while not raws[-1].finished:
            try:
                ev = self._events.get_nowait()
            except queue.Empty:
                break
            if ev.prompt_computed is not None and any(r.prompt_computed is not None for r in raws):
                self._held = ev
                break
            raws.append(ev)
        return self._merge(raws)

    def _merge(self, raws: list[RawEvent]) -> StreamEvent:
        # A stop-string match ends the stream (finished below), so this never runs after one.
        tokens = [r.token for r in raws if r.token is not None]
        last = raws[-1]
        text = self._detok.add(tokens) if self._detok and tokens else ""
        finished, reason = last.finished, last.finish_reason
        if finished and self._detok:
            text += self._detok.flush()
        if self._stops:
            text, matched = self._stops.feed(text)
            if matched is not None:
                if not finished:
                    self.cancel()  # the engine's cancelled event is never read
                finished, reason = True, "stop"
            elif finished:
                text += self._stops.flush()
        logprobs = None
        if self.sampling_params.logprobs is not None and tokens:
            logprobs = [self._logprob_entry(r) for r in raws if r.token is not None]
        self._n_tokens += len(tokens)
        if finished:
            self._done = True
        progress = next((r for r in reversed(raws) if r.prompt_computed is not None), None)
        return StreamEvent(
            token_ids=tokens, text=text, logprobs=logprobs, finished=finished,
            finish_reason=reason, step=last.step, time=last.time,
            prompt_tokens=len(self.prompt_token_ids), cached_tokens=last.cached_tokens,
            completion_tokens=self._n_tokens, error=last.error,
            token_steps=[r.step for r in raws if r.token is not None][: len(tokens)],
            token_times=[r.time for r in raws if r.token is not None][: len(tokens)],
            prompt_progress=None if progress is None else self._progress(progress),
            speculative=speculative_summary(last.spec_drafted, last.spec_accepted)
            if finished and last.spec_drafted is not None else None,
        )  # fmt: skip

    def _progress(self, r: RawEvent) -> dict:
        return {"total": r.prompt_tokens, "cache": r.cached_tokens, "processed": r.prompt_computed,
                "time_ms": round(max(0.0, r.time - self._t_submit) * 1000.0, 1)}

    def _logprob_entry(self, r: RawEvent) -> dict:
        tok = self._tokenizer
        name = (lambda i: tok.decode([i], skip_special_tokens=False)) if tok else (lambda i: None)
        return {
            "token_id": r.token,
            "token": name(r.token),
            "logprob": r.logprob,
            "top": [(i, name(i), lp) for i, lp in (r.top or [])],
        }

    def result(self) -> RequestOutput:
        """Consumes the stream and returns the whole output."""
        out = RequestOutput(self.request_id, self.prompt, self.prompt_token_ids)
        logprobs: list[dict] = []
        for ev in self:
            out.text += ev.text
            out.token_ids += ev.token_ids
            if ev.logprobs:
                logprobs += ev.logprobs
            if ev.finished:
                out.finish_reason = ev.finish_reason
                out.cached_tokens = ev.cached_tokens
                out.error = ev.error
                out.speculative = ev.speculative
        out.logprobs = logprobs if self.sampling_params.logprobs is not None else None
        return out
