"""The app factory in-process with the real engine: /health while loading, load failure,
and create_app(llm) for callers that already hold an LLM."""
import threading
import time

import pytest
from server_process import find_checkpoint

from webapp import create_app


@pytest.fixture(scope="module")
def checkpoint():
    path = find_checkpoint()
    if path is None:
        pytest.fail("no test checkpoint under tests/data/ckpt_*")
    return str(path)


def wait_until(predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_health_is_503_while_loading_then_200(checkpoint):
    from pyengine import LLM
    release = threading.Event()
    built = []

    def factory():
        release.wait(30)
        built.append(LLM(checkpoint, max_model_len=256, max_batch=2))
        return built[0]

    app = create_app(llm_factory=factory, served_model_name="m")
    client = app.test_client()
    try:
        resp = client.get("/health")
        assert (resp.status_code, resp.json) == (503, {"status": "loading"})
        resp = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert resp.status_code == 503
        assert resp.json["error"]["code"] == "model_loading"
        metrics = client.get("/metrics").get_data(as_text=True)
        assert "pyengine_engine_ready 0.0" in metrics
        release.set()
        wait_until(lambda: client.get("/health").status_code == 200)
        resp = client.post("/v1/completions", json={"model": "m", "prompt": "hi",
                                                     "max_tokens": 3, "ignore_eos": True})
        assert resp.status_code == 200 and resp.json["usage"]["completion_tokens"] == 3
        assert "pyengine_engine_ready 1.0" in client.get("/metrics").get_data(as_text=True)
    finally:
        release.set()
        wait_until(lambda: built)
        built[0].close()


def test_load_failure_is_reported(tmp_path):
    failures = []

    def factory():
        from pyengine import LLM
        return LLM(str(tmp_path))  # no config.json: the loader must say so

    app = create_app(llm_factory=factory, served_model_name="m", on_load_error=failures.append)
    client = app.test_client()
    wait_until(lambda: failures)
    resp = client.get("/health")
    assert resp.status_code == 503 and resp.json["status"] == "error"
    assert "config.json" in resp.json["error"]
    resp = client.get("/v1/models")
    assert resp.status_code == 503 and "failed to load" in resp.json["error"]["message"]


def test_create_app_with_a_built_llm(checkpoint):
    from pyengine import LLM
    with LLM(checkpoint, max_model_len=256, max_batch=2) as llm:
        app = create_app(llm, api_key="k", max_body_bytes=1000)
        client = app.test_client()
        auth = {"Authorization": "Bearer k"}
        models = client.get("/v1/models", headers=auth).json["data"]
        assert [m["id"] for m in models] == [llm.model_name]
        resp = client.post("/v1/chat/completions", headers=auth, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}})
        assert resp.status_code == 200 and resp.json["usage"]["completion_tokens"] == 4
        resp = client.post("/v1/completions", headers=auth, data="x" * 2000)
        assert resp.status_code == 413
        page = client.get("/")
        assert page.status_code == 200 and b"<title>pyengine chat</title>" in page.data
        assert client.get("/static/chat.js").status_code == 200
