"""A client for any OpenAI-compatible `/v1` endpoint: streamed chat completions over SSE.

Only the standard library (http.client), one connection per request: a request is cancelled
by shutting its socket down, which is what a user closing a client does and what servers
(pyengine, vLLM, llama.cpp) detect as a disconnect.

Besides the standard fields it sends `ignore_eos` and, when asked, `chat_template_kwargs`
(vLLM's and SGLang's extensions, also read by pyengine); `stream_options.include_usage` asks for
the token counts.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse

from .client import Cancel, ChatRequest, Client, EndpointError, Handle, StreamResult

_CONNECT_TIMEOUT_S = 10.0
_READ_TIMEOUT_S = 600.0  # one SSE chunk: a long prefill may keep the stream silent this long


class HttpClient(Client):
    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None):
        url = urllib.parse.urlsplit(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise EndpointError(f"--base_url must be an http(s) URL ending in /v1, got {base_url!r}")
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname, url.port
        self._path = url.path  # e.g. /v1
        self.label = base_url
        self._api_key = api_key
        card = self._model_card(model)
        self.model = model or card.get("id")
        if not self.model:
            raise EndpointError(f"{base_url}/models lists no model; give --model")
        self.max_model_len = card.get("max_model_len") or card.get("context_length")

    # ---- plain requests ----
    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def get_json(self, path: str) -> dict:
        conn = self._connection(_CONNECT_TIMEOUT_S)
        try:
            conn.request("GET", self._path + path, headers=self._headers())
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise EndpointError(f"GET {self.label}{path}: HTTP {resp.status} {body[:200]!r}")
            return json.loads(body)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise EndpointError(f"GET {self.label}{path} failed: {exc}") from None
        finally:
            conn.close()

    def _model_card(self, model: str | None) -> dict:
        data = self.get_json("/models").get("data") or []
        cards = [c for c in data if isinstance(c, dict)]
        if model is not None:
            cards = [c for c in cards if c.get("id") == model] or [{"id": model}]
        return cards[0] if cards else {}

    def stats(self) -> dict | None:
        try:
            return self.get_json("/stats")
        except EndpointError:
            return None  # not pyengine, or no stats route: the commands report n/a

    # ---- streamed chat ----
    def body(self, request: ChatRequest) -> dict:
        body = {
            "model": self.model, "messages": request.messages, "max_tokens": request.max_tokens,
            "temperature": request.temperature, "stream": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        if request.seed is not None:
            body["seed"] = request.seed
        if request.ignore_eos:
            body["ignore_eos"] = True
        if request.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": request.thinking}
        return body

    def start(self, request: ChatRequest) -> Handle:
        payload = json.dumps(self.body(request)).encode()
        return Handle(lambda result, cancel: self._stream(payload, result, cancel), "http-request")

    def _stream(self, payload: bytes, result: StreamResult, cancel: Cancel) -> None:
        conn = self._connection(_READ_TIMEOUT_S)
        try:
            conn.connect()
            cancel.on_cancel(lambda: _shutdown(conn))
            result.t_send = time.perf_counter()
            conn.request("POST", self._path + "/chat/completions", body=payload, headers=self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {_error_message(resp.read())}"
                return
            _read_events(resp, result, cancel)
        finally:
            conn.close()


def _shutdown(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _error_message(body: bytes) -> str:
    try:
        err = json.loads(body).get("error")
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return body[:300].decode(errors="replace")


def _read_events(resp, result: StreamResult, cancel: Cancel) -> None:
    """Parse `data: {...}` lines until `data: [DONE]` or the end of the stream."""
    content, reasoning = [], []
    while not cancel.is_set():
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        now = time.perf_counter()
        chunk = json.loads(data)
        if chunk.get("error"):
            result.error = _error_message(data)
            continue
        if chunk.get("usage"):
            _take_usage(result, chunk["usage"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            # reasoning_content: vLLM / SGLang / pyengine; reasoning: newer vLLM and OpenRouter
            thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
            if text or thought:
                result.chunk_times.append(now)
                result.chunk_tokens.append(0)
                content.append(text)
                reasoning.append(thought)
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
    result.content, result.reasoning = "".join(content), "".join(reasoning)
    if result.finish_reason is None and result.error is None and not cancel.is_set():
        result.error = "the stream ended without a finish_reason"


def _take_usage(result: StreamResult, usage: dict) -> None:
    result.usage = usage
    result.completion_tokens = usage.get("completion_tokens")
    result.prompt_tokens = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    result.cached_tokens = details.get("cached_tokens")
