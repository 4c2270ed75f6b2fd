"""Limits before work: huge prompts are refused fast, without stalling other streams or keeping
memory (the embedded model and its real tokenizer, default limits, as `pyengine serve` runs).

Each test streams one long answer, fires ten huge requests at once from raw sockets, and checks
every refusal's time, the stream's longest gap between tokens during the burst, and the
worker's resident memory (process_resident_memory_bytes from /metrics) before and after. The
measured numbers are printed (pytest -s)."""
import json
import random
import re
import socket
import threading
import time

import pytest
import requests
from server_process import browser_server

N_BURST = 10


@pytest.fixture(scope="module")
def server():
    return browser_server()


def rss_bytes(server) -> float:
    text = requests.get(server.url + "/metrics", timeout=30).text
    return float(re.search(r"^process_resident_memory_bytes (\S+)$", text, re.M).group(1))


def post_raw(port: int, body: bytes) -> tuple[float, int, dict]:
    """(seconds from connect to the whole answer, status, JSON body) of one POST."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        try:
            s.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused by its Content-Length: the server answered and closed
        data = b""
        while True:
            try:
                part = s.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            data += part
    elapsed = time.monotonic() - t0
    head, _, payload = data.partition(b"\r\n\r\n")
    return elapsed, int(head.split()[1]), json.loads(payload)


class Stream:
    """A long streamed answer in a thread, recording when each chunk arrives."""

    def __init__(self, server):
        self.times: list[float] = []
        self._stop = threading.Event()
        self._resp = requests.post(server.url + "/v1/chat/completions", stream=True, timeout=120,
                                   json={"messages": [{"role": "user", "content": "Tell a story"}],
                                         "max_tokens": 6000, "ignore_eos": True, "stream": True})
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while len(self.times) < 20:
            assert time.monotonic() < deadline, "the stream did not start"
            time.sleep(0.05)

    def _read(self):
        try:
            for line in self._resp.iter_lines():
                if line.startswith(b"data: {"):
                    self.times.append(time.monotonic())
                if self._stop.is_set():
                    break
        except (requests.RequestException, AttributeError, OSError):
            pass  # closed by close(): the connection is gone under the reader

    def longest_gap(self, t0: float, t1: float) -> float:
        times = list(self.times)
        gaps = [b - a for a, b in zip(times, times[1:]) if b >= t0 and a <= t1]
        assert gaps and times[-1] > t1, "the stream ended during the burst"
        return max(gaps)

    def close(self):
        self._stop.set()
        self._resp.close()


def burst(server, body: bytes, label: str) -> dict:
    """Ten requests with `body` at once beside a stream; the measured numbers."""
    server.wait_idle()
    rss_before = rss_bytes(server)
    stream = Stream(server)
    results = [None] * N_BURST
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, post_raw(server.port,
                                                                                    body)))
               for i in range(N_BURST)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t1 = time.monotonic()
    time.sleep(1.0)  # the stream goes on after the burst
    gap = stream.longest_gap(t0, t1)
    stream.close()
    server.wait_idle()
    rss_after = rss_bytes(server)
    out = {"times": sorted(r[0] for r in results), "statuses": {r[1] for r in results},
           "codes": {r[2]["error"]["code"] for r in results}, "gap": gap,
           "rss_before_mb": rss_before / 1e6, "rss_after_mb": rss_after / 1e6}
    print(f"\n{label}: {len(body) / 1e6:.1f} MB bodies x {N_BURST}: refused in "
          f"{out['times'][0]:.3f}-{out['times'][-1]:.3f} s, statuses {out['statuses']} "
          f"{out['codes']}; stream's longest gap {gap:.3f} s; RSS {out['rss_before_mb']:.0f} -> "
          f"{out['rss_after_mb']:.0f} MB")
    return out


def chat_body(content: str) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}]},
                      ensure_ascii=False).encode()


def test_ten_10mb_prompts_at_once(server):
    out = burst(server, chat_body("a" * 10_000_000), "10 MB prompts")
    assert out["statuses"] == {413} and out["codes"] == {"request_too_large"}
    assert out["times"][-1] < 0.5
    assert out["gap"] < 1.0
    assert abs(out["rss_after_mb"] - out["rss_before_mb"]) < 100


def test_ten_prompts_at_the_body_limit_are_refused_by_characters(server):
    # 3.9 MB of text under the 4 MiB body limit: read and parsed, then refused by its length in
    # characters, with neither rendering nor tokenizing.
    out = burst(server, chat_body("word " * 780_000), "3.9 MB prompts")
    assert out["statuses"] == {400} and out["codes"] == {"context_length_exceeded"}
    assert out["times"][-1] < 2.0
    assert out["gap"] < 1.0
    assert abs(out["rss_after_mb"] - out["rss_before_mb"]) < 100


def test_ten_prompts_refused_by_counting_tokens(server):
    # 300,000 CJK characters pass the character bound (8,191 tokens x 45 characters) but are
    # ~3 tokens each: refused after tokenizing the first piece, not all 300,000 characters.
    rng = random.Random(0)
    text = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(300_000))
    out = burst(server, chat_body(text), "300K-character CJK prompts")
    assert out["statuses"] == {400} and out["codes"] == {"context_length_exceeded"}
    assert out["times"][-1] < 2.0
    assert out["gap"] < 1.0
    assert abs(out["rss_after_mb"] - out["rss_before_mb"]) < 100
