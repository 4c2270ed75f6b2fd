"""The same requests over pyengine.LLM in this process (no HTTP): `--model DIR` without `--base_url`.

Chunks are the stream's events as this thread receives them (each with its exact token count);
the reasoning is split from the answer as the server splits it.
"""

from __future__ import annotations

import os
import time

from ..reasoning import ReasoningParser, prompt_opens_reasoning
from .client import Cancel, ChatRequest, Client, EndpointError, Handle, StreamResult


class InProcessClient(Client):
    def __init__(self, model: str | None = None, engine_kwargs: dict | None = None, label: str | None = None):
        from ..llm import LLM

        try:
            self.llm = LLM(model, **(engine_kwargs or {}))
        except (ImportError, OSError, ValueError, RuntimeError, MemoryError) as exc:
            raise EndpointError(f"the engine failed to load: {exc}") from exc
        self.model = self.llm.model_name
        self.label = label or f"in-process:{os.path.relpath(self.llm.model_path)}"
        self.max_model_len = self.llm.max_model_len

    def stats(self) -> dict | None:
        return self.llm.stats()

    def close(self) -> None:
        self.llm.close()

    def start(self, request: ChatRequest) -> Handle:
        from ..sampling_params import SamplingParams

        kwargs = {} if request.thinking is None else {"enable_thinking": request.thinking}
        prompt = self.llm.apply_chat_template(request.messages, **kwargs)
        sp = SamplingParams(max_tokens=request.max_tokens, temperature=request.temperature,
                            seed=request.seed, ignore_eos=request.ignore_eos)  # fmt: skip
        return Handle(lambda result, cancel: self._stream(prompt, sp, result, cancel), "inprocess-request")

    def _stream(self, prompt: str, sp, result: StreamResult, cancel: Cancel) -> None:
        result.t_send = time.perf_counter()
        stream = self.llm.submit(prompt=prompt, sampling_params=sp)
        cancel.on_cancel(stream.cancel)
        parser = ReasoningParser(prompt_opens_reasoning(prompt))
        content, reasoning = [], []
        for ev in stream:
            now = time.perf_counter()
            thought, text = parser.feed(ev.text)
            if ev.finished:
                t2, c2 = parser.finish()
                thought, text = thought + t2, text + c2
            if ev.token_ids:
                result.chunk_times.append(now)
                result.chunk_tokens.append(len(ev.token_ids))
            content.append(text)
            reasoning.append(thought)
            if ev.finished:
                result.prompt_tokens, result.cached_tokens = ev.prompt_tokens, ev.cached_tokens
                result.completion_tokens = ev.completion_tokens
                if ev.finish_reason == "error":
                    result.error = ev.error or "the engine failed this request"
                elif ev.finish_reason != "cancelled":
                    result.finish_reason = ev.finish_reason
        result.content, result.reasoning = "".join(content), "".join(reasoning)
