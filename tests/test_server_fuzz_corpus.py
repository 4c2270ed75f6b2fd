"""A hostile client's corpus against a live server: every input is answered with a 4xx in
OpenAI's error format (never a 5xx, never an HTML page), and the engine is idle afterwards.

Raw bodies are sent as bytes where JSON libraries would refuse to write them (lone surrogates,
NaN, invalid UTF-8); gunicorn's own limits (request line, header size and count) are hit with
raw sockets too."""
import json
import socket

import pytest
from server_process import API_KEY, api_server
from server_process import API_MODEL as MODEL

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    srv = api_server()
    srv.baseline = srv.wait_idle()
    return srv


def check_openai_error(resp, status: int | tuple = 400, param=None, code=None):
    statuses = status if isinstance(status, tuple) else (status,)
    assert resp.status_code in statuses, (resp.status_code, resp.text[:500])
    assert resp.headers["Content-Type"].startswith("application/json"), resp.headers
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def raw_post(server, path: str, body: bytes):
    return server.post(path, data=body, timeout=30, headers={"Content-Type": "application/json"})


def chat_body(**fields) -> dict:
    return {"model": MODEL, "messages": MSGS, "max_tokens": 2, **fields}


@pytest.mark.parametrize("raw, param", [
    (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages"),
    (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
     "messages"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["\\ud800"]}', "stop"),
    (b'{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}', "model"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "\\ud800": 1}', None),
])
def test_lone_surrogates_are_400(server, raw, param):
    err = check_openai_error(raw_post(server, CHAT, raw), 400, code="invalid_unicode")
    if param is not None:
        assert err["param"] == param
    # A surrogate pair is one valid character: served.
    ok = raw_post(server, CHAT, b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], '
                                b'"max_tokens": 2}')
    assert ok.status_code == 200, ok.text


def test_completions_prompt_with_a_lone_surrogate_is_400(server):
    check_openai_error(raw_post(server, "/v1/completions", b'{"prompt": "x\\udc00", '
                                                           b'"max_tokens": 2}'),
                       400, param="prompt", code="invalid_unicode")


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',      # invalid UTF-8
    b'{"messages": [{"role": "user", "content": "\xc3"}]}',          # truncated sequence
    b'\xef\xbb\xbf{"messages": []}',                                  # a BOM
    b'{"temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"temperature": Infinity, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"top_p": -Infinity, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"seed": 1' + b"0" * 5000 + b', "messages": [{"role": "user", "content": "hi"}]}',
    b"[" * 30000 + b"]" * 30000,
    b'{"messages": ',
])
def test_malformed_json_is_400(server, raw):
    check_openai_error(raw_post(server, CHAT, raw), 400)


@pytest.mark.parametrize("field, literal", [
    ("max_tokens", "1" + "0" * 30),
    ("max_tokens", "1e400"),              # parses as infinity
    ("temperature", "1e400"),
    ("temperature", "1e308"),             # finite in Python, infinite as the engine's float32
    ("top_p", "1e-50"),                   # positive, but 0 as a float32
    ("repetition_penalty", "1e-320"),
    ("presence_penalty", "-1e300"),
    ("n", "1" + "0" * 20),
    ("top_k", str(2 ** 40)),
    ("stop_token_ids", f"[{2 ** 40}]"),
    ("seed", "1.5"),
])
def test_huge_and_tiny_numbers_are_400(server, field, literal):
    body = json.dumps(chat_body())[:-1] + f', "{field}": {literal}}}'
    check_openai_error(raw_post(server, CHAT, body.encode()), 400, param=field)


def test_any_integer_seed_is_taken(server):
    body = json.dumps(chat_body())[:-1] + f', "seed": {10 ** 40}}}'
    assert raw_post(server, CHAT, body.encode()).status_code == 200


@pytest.mark.parametrize("fields, param", [
    ({"stop": [f"s{i}" for i in range(1000)]}, "stop"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"messages": [{"role": None, "content": "x"}]}, "messages"),
    ({"messages": [{"content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 257}]},
     "messages"),
    ({"messages": [{"role": "user", "content": "x", "name": 5}]}, "messages"),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": "call"}]}, "messages"),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": [
        {"function": {"name": 5, "arguments": "{}"}}]}]}, "messages"),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": [
        {"function": {"name": "f", "arguments": 7}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": {"text": "x"}}]}, "messages"),
    ({"tools": [5]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]},
     "tools"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
    ({"response_format": {"type": 5}}, "response_format"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"enable_thinking": "maybe"}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"enable_thinking": 1}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"no_such_variable": True}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"eos_token": "x"}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ({"reasoning_effort": "high"}, "reasoning_effort"),   # the test template has no such variable
    ({"reasoning_effort": 3}, "reasoning_effort"),
    ({"logit_bias": {"5": 100}}, "logit_bias"),
    ({"logit_bias": "x"}, "logit_bias"),
    ({"echo": 1}, None),
])
def test_bad_fields_are_400(server, fields, param):
    path = "/v1/completions" if "echo" in fields else CHAT
    body = chat_body(**fields) if path == CHAT else {"prompt": "a", "max_tokens": 2, **fields}
    err = check_openai_error(server.post(path, json=body, timeout=30), 400, param=param)
    # No Python internals in the message (a signature, a type name from a traceback).
    for leak in ("positional", "keyword argument", "Traceback", "NoneType", "render()"):
        assert leak not in err["message"], err


def test_more_than_2048_messages_is_400(server):
    messages = [{"role": "user", "content": ""}] * 2049
    body = json.dumps(chat_body(messages=messages), separators=(",", ":")).encode()
    check_openai_error(raw_post(server, CHAT, body), 400, param="messages")


def test_completions_counts_are_checked_before_tokenizing(server):
    check_openai_error(server.post("/v1/completions", json={"prompt": ["a"] * 17}, timeout=30),
                       400, param="prompt")
    check_openai_error(server.post("/v1/completions", json={"prompt": ["a"] * 5, "n": 4},
                                   timeout=30), 400, param="prompt")
    check_openai_error(server.post("/v1/completions", json={"prompt": [[1, 2], []]}, timeout=30),
                       400, param="prompt")
    check_openai_error(server.post("/v1/completions", json={"prompt": [5] * 600}, timeout=30),
                       400, code="context_length_exceeded")


def raw_request(server, head: bytes) -> tuple[int, dict, bytes]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head)
        data = b""
        while True:
            part = s.recv(65536)
            if not part:
                break
            data += part
    status_line, _, rest = data.partition(b"\r\n")
    head_block, _, body = rest.partition(b"\r\n\r\n")
    headers = dict(line.decode("latin-1").split(": ", 1) for line in head_block.split(b"\r\n"))
    return int(status_line.split()[1]), {k.lower(): v for k, v in headers.items()}, body


def check_raw_error(status, headers, body, expect: int):
    assert status == expect, (status, body[:300])
    assert headers["content-type"].startswith("application/json"), headers
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]


def test_over_long_url_is_414_json(server):
    url = "/v1/models?" + "q=" + "x" * 20000
    check_raw_error(*raw_request(server, f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode()), 414)


def test_over_long_header_is_431_json(server):
    head = (f"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: {'y' * 40000}\r\n"
            f"Authorization: Bearer {API_KEY}\r\n\r\n").encode()
    check_raw_error(*raw_request(server, head), 431)


def test_too_many_headers_is_431_json(server):
    many = "".join(f"X-H{i}: v\r\n" for i in range(300))
    head = f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{many}\r\n".encode()
    check_raw_error(*raw_request(server, head), 431)


AUTH = f"Authorization: Bearer {API_KEY}\r\n".encode()


@pytest.mark.parametrize("head", [
    b"NOT A REQUEST LINE\r\n\r\n",
    b"GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nBad Header Name: v\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH +
    b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH +
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH +
    b"Content-Length: 5\r\nContent-Length: 7\r\n\r\n{}",
])
def test_malformed_http_is_400_json(server, head):
    check_raw_error(*raw_request(server, head), 400)


def test_server_is_healthy_and_idle_after_the_corpus(server):
    assert server.get("/health").status_code == 200
    resp = server.post(CHAT, json=chat_body(max_tokens=3, ignore_eos=True), timeout=60)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
    stats = server.wait_idle()
    for pool in ("gdn_slots_free", "kv_pages_free"):
        assert stats[pool] == server.baseline[pool], (pool, stats, server.baseline)
