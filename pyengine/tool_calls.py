"""Qwen3.5 tool calls: parse the model's XML-like calls into OpenAI `tool_calls`, in one piece
or while they stream.

The model writes (after any reasoning, which is never parsed here)

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

once per call. A VALUE is raw text for string parameters and JSON otherwise; it is converted
by the tool's JSON schema. Streaming emits, per call, one delta with the id and the name when
the function opens, then argument fragments: "{", each finished parameter as `"P": value`
(", " between them), "}" when the function closes, so the fragments joined are exactly the
`arguments` string of the non-streamed response (json.dumps of the converted values).
"""

from __future__ import annotations

import ast
import json
import math
import re
import uuid
from dataclasses import dataclass, field

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
FUNCTION_END = "</function>"
PARAMETER_END = "</parameter>"
_FUNCTION_HEAD = re.compile(r"<function=([^>\n]*)>\n?")
_PARAMETER_HEAD = re.compile(r"<parameter=([^>\n]*)>\n?")


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _parameter_schemas(tools: list[dict] | None) -> dict[str, dict]:
    """function name -> {parameter name -> its JSON schema}."""
    out: dict[str, dict] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters") or {}
            props = params.get("properties") if isinstance(params, dict) else None
            out[fn["name"]] = props if isinstance(props, dict) else {}
    return out


def _types(schema) -> list[str]:
    if not isinstance(schema, dict):
        return []
    t = schema.get("type")
    types = t if isinstance(t, list) else [t] if isinstance(t, str) else []
    if not types and "enum" in schema:
        types = sorted({type(v).__name__ for v in schema["enum"]})
        types = ["string" if t == "str" else t for t in types]
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            types += _types(sub)
    return types


def convert_value(raw: str, schema) -> object:
    """A parameter's text as the value its schema asks for; text that does not parse as that
    type stays the string the model wrote."""
    types = set(_types(schema))
    text = raw.strip()
    if types == {"string"}:
        return raw
    if not types:
        return _json_or_text(raw)
    if "null" in types and text.lower() in ("null", "none"):
        return None
    if "integer" in types and re.fullmatch(r"-?\d+", text):
        return int(text)
    if "number" in types:
        try:
            value = float(text)
            if math.isfinite(value):
                return int(text) if re.fullmatch(r"-?\d+", text) else value
        except ValueError:
            pass
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if types & {"object", "array"}:
        for loads in (json.loads, ast.literal_eval):
            try:
                value = loads(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                continue
            if isinstance(value, (dict, list)):
                return value
    return raw if "string" in types else _json_or_text(raw)


def _json_or_text(raw: str) -> object:
    try:
        return json.loads(raw.strip())
    except (ValueError, RecursionError):
        return raw


@dataclass
class ToolCallDelta:
    """One streamed piece of tool call `index`: the opening (id and name) or an argument
    fragment."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class _Call:
    id: str
    name: str
    args: dict = field(default_factory=dict)
    fragments: list[str] = field(default_factory=list)
    closed: bool = False


class ToolCallParser:
    """Feed the answer text (after the reasoning) chunk by chunk; feed() and finish() return
    (content text, [ToolCallDelta]). The text before the first call is content (text between and
    after calls is dropped); an unfinished call at the end keeps the parameters it finished."""

    def __init__(self, tools: list[dict] | None, max_calls: int | None = None):
        self._schemas = _parameter_schemas(tools)
        self._max_calls = max_calls  # parallel_tool_calls false: 1 (later calls are dropped)
        self._buf = ""
        self._in_call = False  # between <tool_call> and </tool_call>
        self._calls: list[_Call] = []

    @property
    def calls(self) -> list[dict]:
        """The calls so far in OpenAI's shape."""
        return [{"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": "".join(c.fragments)}}
                for c in self._calls[: self._max_calls]]  # fmt: skip

    def _emit(self, deltas: list[ToolCallDelta], delta: ToolCallDelta) -> None:
        if self._max_calls is None or delta.index < self._max_calls:
            deltas.append(delta)

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while self._step(content, deltas, final=False):
            pass
        return "".join(content), deltas

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while self._step(content, deltas, final=True):
            pass
        if self._calls and not self._calls[-1].closed and self._in_call:
            self._close(deltas)
        self._buf = ""
        return "".join(content), deltas

    # One parsing step; True when it consumed something (call again).
    def _step(self, content: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        buf = self._buf
        if not buf:
            return False
        if not self._in_call:
            start = buf.find(TOOL_CALL_START)
            if start < 0:
                # Held back: a possible opening tag, and the whitespace that would precede it.
                head = buf if final else buf[: len(buf) - _partial_suffix(buf, TOOL_CALL_START)]
                head = head if final else head.rstrip()
                if not self._calls:  # text after the calls is not part of the answer
                    content.append(head)
                self._buf = buf[len(head):]
                return False
            # The whitespace before a call (the template's "\n\n") is not content.
            if not self._calls:
                content.append(buf[:start].rstrip())
            self._buf = buf[start + len(TOOL_CALL_START):]
            self._in_call = True
            return True
        body = buf.lstrip("\n")
        call = self._calls[-1] if self._calls and not self._calls[-1].closed else None
        if call is None:
            if body.startswith(TOOL_CALL_END):
                self._buf = body[len(TOOL_CALL_END):]
                self._in_call = False
                return True
            m = _FUNCTION_HEAD.match(body)
            if m is None or (not final and m.end() == len(body) and not body.endswith("\n")):
                maybe_call = _could_open(body) or (self._calls and TOOL_CALL_END.startswith(body))
                if final or not maybe_call:
                    self._in_call = False
                    if not self._calls and not (final and maybe_call):  # not a call: content
                        content.append(TOOL_CALL_START + buf)
                    self._buf = ""
                return False
            call = _Call(new_call_id(), m.group(1).strip())
            self._calls.append(call)
            self._emit(deltas, ToolCallDelta(len(self._calls) - 1, id=call.id, name=call.name))
            self._buf = body[m.end():]
            return True
        if body.startswith(FUNCTION_END):
            self._close(deltas)
            self._buf = body[len(FUNCTION_END):]
            return True
        if body.startswith(TOOL_CALL_END):  # </function> missing
            self._close(deltas)
            return True
        m = _PARAMETER_HEAD.match(body)
        if m is None:
            if final or (body and not any(t.startswith(body[: len(t)]) for t in
                                          ("<parameter=", FUNCTION_END, TOOL_CALL_END))):  # fmt: skip
                self._buf = ""  # stray text inside a call: dropped
            return False
        end = body.find(PARAMETER_END, m.end())
        if end < 0:
            # Unfinished value: wait (at the end, a value that the next tag cut off counts).
            nxt = min((i for i in (body.find("<parameter=", m.end()), body.find(FUNCTION_END, m.end()))
                       if i >= 0), default=-1)  # fmt: skip
            if nxt < 0 and not final:
                return False
            end = nxt if nxt >= 0 else len(body)
            tail = 0
        else:
            tail = len(PARAMETER_END)
        raw = body[m.end():end]
        raw = raw[:-1] if raw.endswith("\n") else raw
        name = m.group(1).strip()
        self._add_argument(call, name, raw, deltas)
        self._buf = body[end + tail:]
        return True

    def _add_argument(self, call: _Call, name: str, raw: str, deltas: list[ToolCallDelta]) -> None:
        value = convert_value(raw, self._schemas.get(call.name, {}).get(name))
        piece = ("{" if not call.args else ", ") + json.dumps(name, ensure_ascii=False) + ": " + \
            json.dumps(value, ensure_ascii=False)
        call.args[name] = value
        call.fragments.append(piece)
        self._emit(deltas, ToolCallDelta(self._calls.index(call), arguments=piece))

    def _close(self, deltas: list[ToolCallDelta]) -> None:
        call = self._calls[-1]
        piece = "}" if call.args else "{}"
        call.fragments.append(piece)
        call.closed = True
        self._emit(deltas, ToolCallDelta(len(self._calls) - 1, arguments=piece))


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _could_open(body: str) -> bool:
    """Whether `body` (after <tool_call>) may still become "<function=NAME>\\n"."""
    head = "<function="
    if len(body) < len(head):
        return head.startswith(body)
    return body.startswith(head) and "\n" not in body[len(head):].split(">", 1)[0]


def parse_tool_calls(text: str, tools: list[dict] | None,
                     max_calls: int | None = None) -> tuple[str, list[dict]]:  # fmt: skip
    """(content, tool_calls) of a whole answer; the same as streaming it through a parser."""
    parser = ToolCallParser(tools, max_calls)
    c1, _ = parser.feed(text)
    c2, _ = parser.finish()
    return c1 + c2, parser.calls


def messages_for_template(messages) -> list:
    """OpenAI messages as chat templates read them: an assistant tool call's `arguments` comes
    as a JSON string and the templates iterate it as a mapping."""
    out = []
    for msg in messages:
        calls = msg.get("tool_calls") if isinstance(msg, dict) else None
        if isinstance(calls, list) and calls:
            fixed = []
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        args = json.loads(fn["arguments"] or "{}")
                    except ValueError:
                        raise ValueError(f"tool call arguments are not valid JSON: {fn['arguments'][:80]!r}") from None
                    if not isinstance(args, dict):
                        raise ValueError("tool call arguments must be a JSON object")
                    call = {**call, "function": {**fn, "arguments": args}}
                fixed.append(call)
            msg = {**msg, "tool_calls": fixed}
        out.append(msg)
    return out
