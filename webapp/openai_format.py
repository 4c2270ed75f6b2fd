"""Shapes of OpenAI responses and stream chunks, built from engine events.

Engine logprob entries are {"token_id", "token", "logprob", "top": [(id, token, logprob), ...]};
the chat API wants {"token", "logprob", "bytes", "top_logprobs": [...]}, the legacy completions
API wants parallel arrays plus text offsets. Logprobs of -inf (a token the filters removed) are
written as -9999.0 because JSON has no infinity.
"""
import math
import time
import uuid

from pyengine.reasoning import ReasoningParser
from pyengine.tool_calls import ToolCallParser

LOGPROB_FLOOR = -9999.0


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _logprob(value) -> float:
    value = float(value)
    return value if math.isfinite(value) and value > LOGPROB_FLOOR else LOGPROB_FLOOR


def _token_entry(token: str, logprob) -> dict:
    return {"token": token, "logprob": _logprob(logprob), "bytes": list(token.encode("utf-8"))}


def _name(token_id: int, token: str, as_ids: bool) -> str:
    # vLLM's `return_tokens_as_token_ids`: byte-level pieces that are not valid UTF-8 on their
    # own all print as U+FFFD, so a client that needs exact tokens asks for their ids.
    return f"token_id:{token_id}" if as_ids else token


def chat_logprobs(entries, top_n: int, as_ids: bool = False) -> list[dict]:
    out = []
    for e in entries or ():
        item = _token_entry(_name(e["token_id"], e["token"], as_ids), e["logprob"])
        item["top_logprobs"] = [_token_entry(_name(i, tok, as_ids), lp)
                                for i, tok, lp in (e.get("top") or ())[:top_n]]
        out.append(item)
    return out


def completion_logprobs(entries, top_n: int, text_offset: int,
                        as_ids: bool = False) -> tuple[dict, int]:
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for e in entries or ():
        tokens.append(_name(e["token_id"], e["token"], as_ids))
        token_logprobs.append(_logprob(e["logprob"]))
        tops.append({_name(i, tok, as_ids): _logprob(lp)
                     for i, tok, lp in (e.get("top") or ())[:top_n]})
        offsets.append(text_offset)
        text_offset += len(e["token"])
    return ({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops,
             "text_offset": offsets}, text_offset)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int,
          speculative: list[dict | None] | None = None) -> dict:
    """OpenAI's usage; with speculative decoding also the choices' drafts and accepted drafts per
    draft position, their rates and the mean accepted length (spec_* fields, as vLLM-style bench
    tools read them)."""
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens,
           "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    spec = [s for s in speculative or () if s and s.get("spec_drafted_per_position")]
    if spec:
        k = max(len(s["spec_drafted_per_position"]) for s in spec)
        drafted = [sum(s["spec_drafted_per_position"][i] for s in spec if i < len(s["spec_drafted_per_position"]))
                   for i in range(k)]
        accepted = [sum(s["spec_accepted_per_position"][i] for s in spec if i < len(s["spec_accepted_per_position"]))
                    for i in range(k)]
        out["spec_drafted_per_position"] = drafted
        out["spec_accepted_per_position"] = accepted
        out["spec_accept_per_position"] = [a / d if d else 0.0 for a, d in zip(accepted, drafted)]
        out["spec_mean_accepted_length"] = (sum(accepted) + drafted[0]) / drafted[0]
    return out


def error_chunk(message: str, type_: str = "server_error", code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


class ChoiceState:
    """What one choice has produced so far (text, reasoning, logprobs, counts). With `tools`, the
    answer's tool calls are parsed out of the content: add() leaves their stream deltas in
    `tool_deltas` (OpenAI's shape), and `tool_calls` has them whole."""

    def __init__(self, starts_in_reasoning: bool = False, split_reasoning: bool = True,
                 tools: list | None = None, parallel_tool_calls: bool = True):
        self.parser = ReasoningParser(starts_in_reasoning) if split_reasoning else None
        self.tool_parser = ToolCallParser(tools, None if parallel_tool_calls else 1) \
            if tools else None
        self.tool_deltas: list[dict] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.logprobs: list = []
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.speculative = None  # the finished event's acceptance counts (speculative decoding)
        self.finish_reason = None
        self.error = None
        self.text_offset = 0

    def add(self, ev) -> tuple[str, str]:
        """Take one event; return the (reasoning, content) text it adds."""
        text = ev.text or ""
        if self.parser is None:
            reasoning, content = "", text
        else:
            reasoning, content = self.parser.feed(text)
            if ev.finished:
                r2, c2 = self.parser.finish()
                reasoning, content = reasoning + r2, content + c2
        if self.tool_parser is not None:
            content = self._split_tool_calls(content, ev.finished)
        self.reasoning.append(reasoning)
        self.content.append(content)
        self.completion_tokens += len(ev.token_ids or ())
        if ev.logprobs:
            self.logprobs.extend(ev.logprobs)
        if ev.finished:
            self.finish_reason = ev.finish_reason
            if ev.finish_reason == "stop" and self.tool_calls:
                self.finish_reason = "tool_calls"
            self.error = ev.error if ev.finish_reason == "error" else None
            self.completion_tokens = ev.completion_tokens or self.completion_tokens
            self.cached_tokens = ev.cached_tokens or 0
            self.speculative = getattr(ev, "speculative", None)
        return reasoning, content

    def _split_tool_calls(self, content: str, finished: bool) -> str:
        content, deltas = self.tool_parser.feed(content)
        if finished:
            c2, d2 = self.tool_parser.finish()
            content, deltas = content + c2, deltas + d2
        self.tool_deltas = []
        for d in deltas:
            if d.name is not None:
                self.tool_deltas.append({"index": d.index, "id": d.id, "type": "function",
                                         "function": {"name": d.name, "arguments": d.arguments}})
            else:
                self.tool_deltas.append({"index": d.index, "function": {"arguments": d.arguments}})
        return content

    @property
    def tool_calls(self) -> list[dict]:
        return self.tool_parser.calls if self.tool_parser is not None else []

    def message(self) -> dict:
        """The non-streamed assistant message."""
        content = "".join(self.content)
        message = {"role": "assistant", "content": content}
        if self.tool_calls:
            message["content"] = content or None
            message["tool_calls"] = self.tool_calls
        reasoning = self.reasoning_text()
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return message

    def reasoning_text(self) -> str | None:
        if self.parser is None or not self.parser.saw_reasoning:
            return None
        return "".join(self.reasoning)


class ResponseMeta:
    def __init__(self, prefix: str, model: str):
        self.id = new_id(prefix)
        self.created = int(time.time())
        self.model = model

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}
