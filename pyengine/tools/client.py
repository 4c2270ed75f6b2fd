"""One streamed chat request, as a client sees it, and the interface both clients implement.

Times are `time.perf_counter()` on the client: the moment the request was sent, and the moment
each chunk that carried output text arrived. A chunk may carry several tokens (servers merge
tokens that are ready together), so inter-token latencies are measured between chunks, as
vLLM's and SGLang's serving benchmarks do; `completion_tokens` is the server's own count when
it reports usage (or the exact count in-process), the number of chunks otherwise.
"""

from __future__ import annotations

import abc
import threading
import time
from dataclasses import dataclass, field


class EndpointError(RuntimeError):
    """The endpoint or engine cannot be used at all (unreachable, no model, failed to load)."""


@dataclass
class ChatRequest:
    messages: list[dict]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    thinking: bool | None = None  # None: the server's default; else chat_template_kwargs


@dataclass
class StreamResult:
    t_send: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # arrival of each output chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens per chunk (0: unknown)
    t_end: float = 0.0
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None  # the server's usage count (None: not reported)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    usage: dict | None = None  # the whole usage object, for extra fields (speculative stats)
    error: str | None = None
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cancelled

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.t_send if self.chunk_times else None

    @property
    def n_tokens(self) -> int:
        """Tokens generated: the server's count, else tokens counted per chunk, else chunks."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        if self.chunk_tokens and all(self.chunk_tokens):
            return sum(self.chunk_tokens)
        return len(self.chunk_times)

    @property
    def output(self) -> str:
        """Reasoning and answer together: what a T = 0 rerun must reproduce."""
        return f"{self.reasoning}\n</think>\n{self.content}" if self.reasoning else self.content


class Cancel:
    """Set once by Handle.cancel(); a runner registers how to interrupt its blocking read."""

    def __init__(self):
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._interrupt = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def on_cancel(self, interrupt) -> None:
        with self._lock:
            self._interrupt = interrupt
            if not self._event.is_set():
                return
        interrupt()  # cancelled before the runner got this far

    def set(self) -> None:
        with self._lock:
            self._event.set()
            interrupt = self._interrupt
        if interrupt is not None:
            interrupt()


class Handle:
    """A request running in its own thread: runner(result, cancel) fills the StreamResult."""

    def __init__(self, runner, name: str):
        self.result = StreamResult()
        self._cancel = Cancel()
        self._thread = threading.Thread(target=self._run, args=(runner,), name=name, daemon=True)
        self._thread.start()

    def _run(self, runner) -> None:
        try:
            runner(self.result, self._cancel)
        except Exception as exc:  # noqa: BLE001 (every failure is a measured error)
            if not self._cancel.is_set():
                self.result.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.result.t_end = time.perf_counter()
            if self._cancel.is_set() and self.result.finish_reason is None:
                self.result.cancelled = True

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> StreamResult:
        self._thread.join(timeout)
        return self.result


class Client(abc.ABC):
    """What the commands need of an endpoint. Subclasses: HttpClient, InProcessClient."""

    label: str
    model: str
    max_model_len: int | None = None

    @abc.abstractmethod
    def start(self, request: ChatRequest) -> Handle:
        """Sends the request; returns at once with a handle to wait on or cancel."""

    def stats(self) -> dict | None:
        """The server's engine statistics (pyengine's /v1/stats), None where there are none."""
        return None

    def describe(self) -> dict:
        return {"endpoint": self.label, "model": self.model, "max_model_len": self.max_model_len}

    def close(self) -> None:
        pass

    def run(self, request: ChatRequest) -> StreamResult:
        return self.start(request).wait()

    def run_together(self, requests: list[ChatRequest]) -> list[StreamResult]:
        handles = [self.start(r) for r in requests]
        return [h.wait() for h in handles]
