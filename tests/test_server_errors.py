"""Every client error gets an OpenAI-format error with the right status, and afterwards the
server still answers correctly with nothing left allocated in the engine."""
import json
import socket

import openai
import pytest
import requests
from server_process import API_KEY, api_server
from server_process import API_MODEL as MODEL

CHAT_URL = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    srv = api_server()
    srv.baseline = srv.wait_idle()
    return srv


def check_error(resp: requests.Response, status: int, param=None, code=None, says=None):
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    if says is not None:
        assert says in err["message"], err
    return err


def test_malformed_json(server):
    check_error(server.post(CHAT_URL, data=b'{"model": "x", "messages": [', timeout=10,
                            headers={"Content-Type": "application/json"}), 400,
                code="invalid_json")
    check_error(server.post(CHAT_URL, data=b"", timeout=10), 400, says="empty")
    check_error(server.post(CHAT_URL, json=[1, 2], timeout=10), 400, says="JSON object")


@pytest.mark.parametrize("field, value, param", [
    ("messages", "hi", "messages"),
    ("messages", [], "messages"),
    ("messages", [{"role": "wizard", "content": "x"}], "messages"),
    ("messages", [{"role": "user", "content": 5}], "messages"),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
     "messages"),
    ("temperature", "hot", "temperature"),
    ("max_tokens", True, "max_tokens"),
    ("max_tokens", 2.5, "max_tokens"),
    ("stream", "yes", "stream"),
    ("n", "2", "n"),
    ("stop", [1, 2], "stop"),
    ("stop_token_ids", ["a"], "stop_token_ids"),
    ("seed", "abc", "seed"),
    ("chat_template_kwargs", "enable_thinking", "chat_template_kwargs"),
    ("model", 42, "model"),
])
def test_wrong_types(server, field, value, param):
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 4, field: value}
    check_error(server.post(CHAT_URL, json=body, timeout=10), 400, param=param)


@pytest.mark.parametrize("extra, says", [
    ({"n": 0}, "'n'"),
    ({"n": 1000}, "'n'"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 5}, "top_p"),
    ({"top_p": 0}, "top_p"),
    ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 9}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"1": 5}}, "logit_bias"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"best_of": 3}, "best_of"),
    ({"stop": ""}, "stop"),
])
def test_unsupported_values(server, extra, says):
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 4, **extra}
    err = check_error(server.post(CHAT_URL, json=body, timeout=10), 400, says=says)
    name = next(iter(extra))
    if name not in ("stream_options", "best_of", "logprobs", "top_logprobs"):
        assert err["param"] == name, err


def test_completions_bad_prompts_and_options(server):
    for prompt in (None, 3, [], [[]], ["a", 1], [-1, 5], ""):
        check_error(server.post("/v1/completions", json={"model": MODEL, "prompt": prompt},
                                timeout=10), 400, param="prompt")
    for extra in ({"echo": True}, {"suffix": "x"}, {"logprobs": 99}, {"logprobs": True}):
        check_error(server.post("/v1/completions", json={"model": MODEL, "prompt": "a", **extra},
                                timeout=10), 400)
    # A token id outside the vocabulary is the engine's to reject, still as a 400.
    check_error(server.post("/v1/completions", json={"model": MODEL, "prompt": [10 ** 9]},
                            timeout=10), 400)


def test_unknown_model_is_404(server):
    check_error(server.post(CHAT_URL, json={"model": "gpt-17", "messages": MSGS}, timeout=10),
                404, param="model", code="model_not_found")


def test_prompt_longer_than_context(server):
    long_prompt = "one two three four five six seven eight nine ten " * 200
    check_error(server.post(CHAT_URL, json={"model": MODEL, "messages": [
        {"role": "user", "content": long_prompt}]}, timeout=30), 400,
        code="context_length_exceeded", says="512")
    check_error(server.post("/v1/completions", json={"model": MODEL, "prompt": long_prompt},
                            timeout=30), 400, code="context_length_exceeded")


def test_max_tokens_beyond_context(server):
    check_error(server.post(CHAT_URL, json={"model": MODEL, "messages": MSGS, "max_tokens": 600},
                            timeout=10), 400, param="max_tokens", code="context_length_exceeded")
    check_error(server.post(CHAT_URL, json={"model": MODEL, "messages": MSGS,
                                            "max_completion_tokens": 10 ** 9}, timeout=10),
                400, param="max_tokens")


def test_oversized_body_is_413(server):
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 70000}]})
    check_error(server.post(CHAT_URL, data=body, timeout=10,
                            headers={"Content-Type": "application/json"}), 413,
                code="request_too_large", says="65536")

    def chunks():  # no Content-Length: the limit must hold for a chunked body too
        for _ in range(40):
            yield b" " * 4096
        yield b'{"model": "tiny-qwen"}'
    check_error(server.post(CHAT_URL, data=chunks(), timeout=10,
                            headers={"Content-Type": "application/json"}), 413)


def test_api_key_required(server):
    url = server.url + CHAT_URL
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 2}
    check_error(requests.post(url, json=body, timeout=10), 401, code="invalid_api_key",
                says="Missing")
    check_error(requests.post(url, json=body, timeout=10,
                              headers={"Authorization": "Bearer wrong"}), 401, says="Incorrect")
    check_error(requests.get(server.url + "/v1/models", timeout=10,
                             headers={"Authorization": "Basic " + API_KEY}), 401)
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert requests.get(server.url + "/health", timeout=10).status_code == 200  # not guarded


def test_unknown_route_and_method(server):
    check_error(server.get("/v1/nothing"), 404)
    check_error(server.get(CHAT_URL), 405)


def test_garbage_on_the_socket_does_not_hurt(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"\x00\xffNOT HTTP AT ALL\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 400 ")  # gunicorn refuses it, the worker lives
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\n\r\n{\"mod")
    # (the second client hangs up half-way through its body)


def test_server_still_serves_and_engine_is_idle_afterwards(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=5, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    stats = server.wait_idle()
    assert stats["gdn_slots_free"] == server.baseline["gdn_slots_free"], stats
    assert server.get("/health").status_code == 200
