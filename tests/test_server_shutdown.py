"""Shutdown semantics (webapp/worker.py): requests a shutdown cuts answer 503 with an OpenAI
error (non-streamed) or end with an error event and [DONE] (streams), never 200 "cancelled".

SIGTERM gives requests in flight --graceful_timeout - 2 s to finish before the cut; SIGINT cuts
at once. Each live test runs its own server of the embedded model (~300 tokens/s here, so a
6,000-token answer is still running when the cut comes)."""
import json
import os
import signal
import threading
import time

import pytest
import requests
from server_process import ServerProcess, find_checkpoint

LONG = {"messages": [{"role": "user", "content": "Tell a long story"}], "max_tokens": 6000,
        "ignore_eos": True}


def start_requests(url: str) -> dict:
    """One non-streamed and one streamed long request, in threads; their results land in the
    returned dict ("plain": (status, body), "stream": [data lines], "*_at": arrival time)."""
    out: dict = {"stream": []}

    def plain():
        r = requests.post(url + "/v1/chat/completions", json=LONG, timeout=120)
        out["plain"] = (r.status_code, r.json())
        out["plain_at"] = time.monotonic()

    def stream():
        with requests.post(url + "/v1/chat/completions", json={**LONG, "stream": True},
                           stream=True, timeout=120) as r:
            out["stream_status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    out["stream"].append(line[6:].decode())
        out["stream_at"] = time.monotonic()

    out["threads"] = [threading.Thread(target=f, daemon=True) for f in (plain, stream)]
    for t in out["threads"]:
        t.start()
    return out


def wait_running(server: ServerProcess, n: int) -> None:
    deadline = time.monotonic() + 60
    while server.stats()["running"] < n:
        assert time.monotonic() < deadline, "requests did not start"
        time.sleep(0.05)
    time.sleep(0.5)  # both are generating


def check_cut(out: dict) -> None:
    status, body = out["plain"]
    assert status == 503, body
    assert body["error"]["code"] == "server_shutting_down"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    events = out["stream"]
    assert out["stream_status"] == 200 and events[-1] == "[DONE]", events[-3:]
    last = json.loads(events[-2])
    assert last["error"]["code"] == "server_shutting_down", last
    finishes = [c.get("finish_reason") for e in events[:-1]
                for c in json.loads(e).get("choices", [])]
    assert "cancelled" not in finishes and len(events) > 5


@pytest.mark.slow
def test_sigterm_lets_requests_run_then_cuts_them_before_the_worker_stops():
    server = ServerProcess("shutdown_term", ["--graceful_timeout", "5", "--max_batch", "2",
                                             "--threads", "1"], api_key=None)
    try:
        out = start_requests(server.url)
        wait_running(server, 2)
        t_signal = time.monotonic()
        os.killpg(server.proc.pid, signal.SIGTERM)
        for t in out["threads"]:
            t.join(30)
        check_cut(out)
        # Cut at graceful_timeout - 2 s = 3 s: the requests ran on until then.
        for key in ("plain_at", "stream_at"):
            assert 2.5 < out[key] - t_signal < 5.0, out[key] - t_signal
        assert server.proc.wait(timeout=30) == 0
        log = server.log_path.read_text()
        assert "cut 2 request(s) in flight" in log, server.log_tail()
    finally:
        server.stop()


@pytest.mark.slow
def test_sigint_cuts_requests_at_once():
    server = ServerProcess("shutdown_int", ["--graceful_timeout", "20", "--max_batch", "2",
                                            "--threads", "1"], api_key=None)
    try:
        out = start_requests(server.url)
        wait_running(server, 2)
        t_signal = time.monotonic()
        os.killpg(server.proc.pid, signal.SIGINT)
        for t in out["threads"]:
            t.join(30)
        check_cut(out)
        for key in ("plain_at", "stream_at"):
            assert out[key] - t_signal < 2.0, out[key] - t_signal
        server.proc.wait(timeout=30)
    finally:
        server.stop()


def test_drain_refuses_new_requests_and_cut_answers_503_in_process():
    from pyengine import LLM
    from webapp import create_app
    with LLM(str(find_checkpoint()), max_model_len=4096, max_batch=2) as llm:
        app = create_app(llm)
        client = app.test_client()
        server_state = app.extensions["pyengine"]
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000,
                "ignore_eos": True}
        result = {}
        thread = threading.Thread(target=lambda: result.update(
            resp=client.post("/v1/chat/completions", json=body)))
        thread.start()
        deadline = time.monotonic() + 30
        while server_state.live_count() == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert server_state.cut_all() == 1
        thread.join(30)
        resp = result["resp"]
        assert resp.status_code == 503 and resp.json["error"]["code"] == "server_shutting_down"
        again = client.post("/v1/chat/completions", json=body)
        assert again.status_code == 503 and again.json["error"]["code"] == "server_shutting_down"
        health = client.get("/health")
        assert health.status_code == 503 and health.json == {"status": "stopping"}
        assert server_state.live_count() == 0
