"""A client that hangs up cancels its request in the engine; pages and slots come back.

The server runs with the prefix cache off, so a freed request returns every KV page: the
baseline comparison is exact. It serves the embedded default model (~300-450 tokens/s on two
cores): a 3,000-token answer lasts seconds, far longer than the disconnects take to be noticed
(the random test checkpoints now decode 3,000 tokens in about a second, which raced them).
"""
import json
import time

import pytest
import requests
from server_process import browser_server

LONG = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0}
CHAT = [{"role": "user", "content": "Tell me a very long story."}]


@pytest.fixture(scope="module")
def server():
    return browser_server()  # prefix cache off, the embedded model


def cancelled_count(server) -> float:
    for line in requests.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith('pyengine_request_finished_total{finish_reason="cancelled"}'):
            return float(line.split()[-1])
    return 0.0


def read_events(lines, n: int) -> list[dict]:
    """The next n SSE data events from resp.iter_lines() (kept open by the caller: dropping
    that iterator makes urllib3 close the connection)."""
    events = []
    for line in lines:
        if line.startswith(b"data: {"):
            events.append(json.loads(line[6:]))
            if len(events) == n:
                return events
    raise AssertionError(f"stream ended after {len(events)} events")


def assert_back_to_baseline(server, base: dict, n_streams: int = 1) -> dict:
    after = server.wait_idle(timeout_s=10)
    for key in ("kv_pages_free", "gdn_slots_free"):
        assert after[key] == base[key], (key, base, after)
    # Cancelled early: fewer tokens than the 3000 per stream asked for (all would take several seconds).
    generated = after["generated_tokens"] - base["generated_tokens"]
    assert 0 < generated < n_streams * LONG["max_tokens"], (base, after)
    return after


def test_dropping_a_stream_cancels_the_request(server):
    base = server.wait_idle()
    cancelled = cancelled_count(server)
    resp = requests.post(server.url + "/v1/chat/completions", stream=True, timeout=30,
                         json={"messages": CHAT, "stream": True, **LONG})
    assert resp.status_code == 200
    lines = resp.iter_lines()
    events = read_events(lines, 6)
    assert all(e["choices"][0]["finish_reason"] is None for e in events)
    busy = server.stats()
    assert busy["running"] + busy["waiting"] == 1, (busy, events)
    assert busy["kv_pages_free"] < base["kv_pages_free"]
    resp.close()  # the client hangs up mid-stream
    assert_back_to_baseline(server, base)
    assert cancelled_count(server) == cancelled + 1


def test_dropping_an_n2_completion_stream_cancels_both(server):
    base = server.wait_idle()
    cancelled = cancelled_count(server)
    resp = requests.post(server.url + "/v1/completions", stream=True, timeout=30,
                         json={"prompt": "Once upon a time", "stream": True, "n": 2, "seed": 5,
                               **LONG})
    lines = resp.iter_lines()
    read_events(lines, 8)
    assert server.stats()["running"] + server.stats()["waiting"] == 2
    resp.close()
    assert_back_to_baseline(server, base, n_streams=2)
    assert cancelled_count(server) == cancelled + 2


def test_non_streaming_client_timeout_cancels_the_request(server):
    # No write happens until the answer is complete, so only the disconnect watcher can
    # notice this client leaving.
    base = server.wait_idle()
    cancelled = cancelled_count(server)
    t0 = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(server.url + "/v1/completions", timeout=(5, 0.5),
                      json={"prompt": "The history of the world", **LONG})
    busy = server.stats()
    assert busy["running"] + busy["waiting"] in (0, 1)
    assert_back_to_baseline(server, base)
    assert time.monotonic() - t0 < 10
    assert cancelled_count(server) == cancelled + 1


def test_server_answers_normally_after_disconnects(server):
    r = requests.post(server.url + "/v1/completions", timeout=60,
                      json={"prompt": "Hello", "max_tokens": 7, "ignore_eos": True,
                            "temperature": 0})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 7
    assert r.json()["choices"][0]["finish_reason"] == "length"
