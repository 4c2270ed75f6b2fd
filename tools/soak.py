"""Soak test of a running `pyengine serve`: N mixed requests at concurrency C, a share of them
cancelled by the client, then the verdict: errors, lost requests, pools and RSS before/after.

    python tools/soak.py --url http://127.0.0.1:8000 --requests 1000 --concurrency 16 --cancel 0.1
    python tools/soak.py --start --requests 1000 --concurrency 16     # serves the embedded model

The mix: chat and completions, streamed and not, n = 1 or 2, string or token-id prompts, greedy
or sampled, stop strings, logprobs, 1-64 new tokens. A cancelled request is a stream the client
closes after a few chunks or a non-streamed request it stops waiting for (the server notices
the closed socket). Verdict:
- errors: any non-2xx answer, error event, bad body or connection failure;
- lost: a request that was not cancelled and did not end properly (every choice with a finish
  reason, and `data: [DONE]` for streams), plus any difference between the completions sent
  and the finished completions the server counted (pyengine_request_finished);
- pools: /v1/stats once the engine is idle (KV pages, GDN slots free; nothing running/waiting)
  against the same before the run;
- RSS: the worker's process_resident_memory_bytes after a warm-up, and at the end.
Exit status 0 only when errors = lost = 0 and the pools are back at their baseline.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

WORDS = ("alpha beta gamma delta sum of numbers what is the capital story code python loop "
         "add seven three nine eleven river mountain").split()


def metric(text: str, name: str) -> float:
    """A Prometheus sample's value, summed over its label sets."""
    pattern = rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$"
    return sum(float(m) for m in re.findall(pattern, text, re.M))


class Client:
    def __init__(self, url: str, api_key: str | None):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def get(self, path: str):
        resp = requests.get(self.url + path, headers=self.headers, timeout=30)
        resp.raise_for_status()
        return resp

    def stats(self) -> dict:
        return self.get("/v1/stats").json()

    def metrics(self) -> str:
        return self.get("/metrics").text

    def wait_idle(self, timeout_s: float = 120) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            if stats["running"] == 0 and stats["waiting"] == 0:
                return stats
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine not idle after {timeout_s} s: {stats}")
            time.sleep(0.1)


def make_request(rng: random.Random, model: str, cancel_share: float) -> dict:
    chat = rng.random() < 0.6
    n = 2 if rng.random() < 0.15 else 1
    body = {"model": model, "max_tokens": rng.randint(1, 64), "n": n,
            "temperature": rng.choice([0.0, 0.8]), "seed": rng.randint(0, 10 ** 6),
            "stream": rng.random() < 0.5}
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
    if chat:
        body["messages"] = [{"role": "user", "content": words}]
        if rng.random() < 0.5:
            body["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
        if rng.random() < 0.2:
            body["logprobs"], body["top_logprobs"] = True, rng.randint(0, 3)
    else:
        body["prompt"] = words if rng.random() < 0.7 else [rng.randint(1, 200)
                                                           for _ in range(rng.randint(1, 30))]
        if rng.random() < 0.2:
            body["logprobs"] = rng.randint(0, 3)
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(WORDS)]
    if rng.random() < 0.3:
        body["ignore_eos"] = True
    return {"path": "/v1/chat/completions" if chat else "/v1/completions", "body": body,
            "cancel": rng.random() < cancel_share, "cancel_after": rng.randint(1, 4)}


def run_one(client: Client, spec: dict) -> dict:
    """Sends one request; returns {"outcome": ok | cancelled | error, "why": ...}."""
    body, n = spec["body"], spec["body"]["n"]
    try:
        if body["stream"]:
            return _stream(client, spec, n)
        if spec["cancel"]:
            try:  # give up waiting after a moment: the server sees the closed socket
                requests.post(client.url + spec["path"], json=body, headers=client.headers,
                              timeout=(10, 0.05 * spec["cancel_after"]))
            except requests.exceptions.ReadTimeout:
                return {"outcome": "cancelled"}
            return {"outcome": "ok"}  # finished before the client gave up
        resp = requests.post(client.url + spec["path"], json=body, headers=client.headers,
                             timeout=300)
        if resp.status_code != 200:
            return {"outcome": "error", "why": f"{resp.status_code} {resp.text[:200]}"}
        choices = resp.json().get("choices", [])
        if len(choices) != n or any(c.get("finish_reason") not in ("stop", "length")
                                    for c in choices):
            return {"outcome": "lost", "why": f"choices {choices!r:.200}"}
        return {"outcome": "ok"}
    except requests.RequestException as exc:
        return {"outcome": "error", "why": f"{type(exc).__name__}: {exc}"}


def _stream(client: Client, spec: dict, n: int) -> dict:
    finished, chunks, done = set(), 0, False
    with requests.post(client.url + spec["path"], json=spec["body"], headers=client.headers,
                       stream=True, timeout=300) as resp:
        if resp.status_code != 200:
            return {"outcome": "error", "why": f"{resp.status_code} {resp.text[:200]}"}
        for line in resp.iter_lines():
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                return {"outcome": "error", "why": f"error event {event['error']}"}
            chunks += 1
            for c in event.get("choices", []):
                if c.get("finish_reason"):
                    finished.add(c["index"])
            if spec["cancel"] and chunks >= spec["cancel_after"]:
                return {"outcome": "cancelled"}  # leaving the block closes the connection
    if done and len(finished) == n:
        return {"outcome": "ok"}
    return {"outcome": "lost", "why": f"done={done} finished={sorted(finished)} of {n}"}


def soak(url: str, api_key: str | None = None, n_requests: int = 1000, concurrency: int = 16,
         cancel_share: float = 0.1, seed: int = 0, warmup: int = 32, log=print) -> dict:
    client = Client(url, api_key)
    model = client.get("/v1/models").json()["data"][0]["id"]
    rng = random.Random(seed)
    warm = [make_request(rng, model, 0.0) for _ in range(warmup)]
    specs = [make_request(rng, model, cancel_share) for _ in range(n_requests)]
    rss_start = metric(client.metrics(), "process_resident_memory_bytes")
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda s: run_one(client, s), warm))
    base = client.wait_idle()
    text = client.metrics()
    rss_before = metric(text, "process_resident_memory_bytes")
    finished_before = metric(text, "pyengine_request_finished_total")
    t0 = time.monotonic()
    done = [0]
    lock = threading.Lock()

    def go(spec):
        result = run_one(client, spec)
        with lock:
            done[0] += 1
            if done[0] % max(1, n_requests // 10) == 0:
                log(f"  {done[0]}/{n_requests} requests, {time.monotonic() - t0:.0f} s")
        return result

    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(go, specs))
    elapsed = time.monotonic() - t0
    after = client.wait_idle()
    text = client.metrics()
    rss_after = metric(text, "process_resident_memory_bytes")
    finished_delta = metric(text, "pyengine_request_finished_total") - finished_before
    sent_choices = sum(s["body"]["n"] for s in specs)
    outcomes = {k: sum(r["outcome"] == k for r in results)
                for k in ("ok", "cancelled", "error", "lost")}
    pools = {k: (base[k], after[k]) for k in ("kv_pages_free", "gdn_slots_free", "running",
                                               "waiting")}
    report = {
        "requests": n_requests, "concurrency": concurrency, "cancel_share": cancel_share,
        "seconds": round(elapsed, 1), "outcomes": outcomes,
        "errors": outcomes["error"],
        "lost": outcomes["lost"] + abs(int(finished_delta) - sent_choices),
        "server_finished_completions": int(finished_delta), "sent_completions": sent_choices,
        "pools_before_after": pools,
        "pools_at_baseline": all(a == b for a, b in pools.values()),
        "rss_start_mb": round(rss_start / 1e6, 1), "rss_before_mb": round(rss_before / 1e6, 1),
        "rss_after_mb": round(rss_after / 1e6, 1),
        "rss_growth_mb": round((rss_after - rss_before) / 1e6, 1),
        "problems": [r["why"] for r in results if r["outcome"] in ("error", "lost")][:10],
    }
    return report


def _start_server(extra: list[str]) -> tuple[subprocess.Popen, str]:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "pyengine", "serve", *extra, "--port",
                             str(port), "--access_log", "off"], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except requests.ConnectionError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        time.sleep(0.3)
    raise RuntimeError("the server did not start")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running server (else --start)")
    p.add_argument("--start", action="store_true",
                   help="start `pyengine serve` (args after --serve_args) for the run")
    p.add_argument("--serve_args", nargs=argparse.REMAINDER, default=[],
                   help="arguments of the started server (e.g. a model directory, --max_batch 16)")
    p.add_argument("--api_key", default=os.environ.get("PYENGINE_API_KEY"))
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--cancel", type=float, default=0.1, help="share of requests cancelled")
    p.add_argument("--warmup", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the report here too")
    args = p.parse_args(argv)
    if not args.url and not args.start:
        p.error("give --url or --start")
    proc = None
    url = args.url
    if args.start:
        proc, url = _start_server(args.serve_args)
    try:
        report = soak(url, args.api_key, args.requests, args.concurrency, args.cancel,
                      args.seed, args.warmup)
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    ok = report["errors"] == 0 and report["lost"] == 0 and report["pools_at_baseline"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
