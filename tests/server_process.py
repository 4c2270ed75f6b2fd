"""Run `pyengine serve` as a real gunicorn process on loopback for the server tests.

`get_server(...)` starts one server per distinct configuration per pytest process and reuses
it across test files; all are stopped at exit. The server's log goes to tests/artifacts/ so a
failure can be read after the run.
"""
import atexit
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

import pyengine
import webapp

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "tests" / "artifacts"
# Small random-weight Qwen3.5 checkpoints written by tools/; text layout first (fastest load).
CHECKPOINT_PREFERENCE = ("ckpt_text_bf16", "ckpt_text", "ckpt_")
START_TIMEOUT_S = 180

_servers: dict[tuple, "ServerProcess"] = {}


def find_checkpoint() -> Path | None:
    data = REPO / "tests" / "data"
    candidates = sorted(p for p in data.glob("ckpt_*") if (p / "config.json").is_file())
    for prefix in CHECKPOINT_PREFERENCE:
        for path in candidates:
            if path.name.startswith(prefix):
                return path
    return None


def _serve_command() -> list[str]:
    """`python -m pyengine serve` once the CLI exists; the serve module itself until then."""
    if importlib.util.find_spec("pyengine.__main__") is not None:
        return ["pyengine", "serve"]
    return ["pyengine.serve"]


def server_env() -> dict:
    """The environment for a child Python that must import the same pyengine and webapp as
    this test process (installed or from the source tree, whichever pytest uses)."""
    roots = []
    for module in (pyengine, webapp):
        root = str(Path(module.__file__).resolve().parents[1])
        if root not in roots:
            roots.append(root)
    if os.environ.get("PYTHONPATH"):
        roots.append(os.environ["PYTHONPATH"])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(roots))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, name: str, args: list[str], api_key: str | None):
        self.api_key = api_key
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.log_path = ARTIFACTS / f"server_{name}.log"
        cmd = [sys.executable, "-m", *_serve_command(), *args, "--port", str(self.port)]
        if api_key:
            cmd += ["--api_key", api_key]
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop())
        # cwd: a folder without a pyengine/ in it, so `-m` imports what server_env() names.
        self.proc = subprocess.Popen(cmd, cwd=ARTIFACTS, env=server_env(), stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_tail(self, n: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready after {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.url + path, headers=self.headers, timeout=30, **kw)

    def post(self, path: str, **kw) -> requests.Response:
        kw.setdefault("timeout", 120)
        return requests.post(self.url + path, headers={**self.headers, **kw.pop("headers", {})},
                             **kw)

    def stats(self) -> dict:
        resp = self.get("/v1/stats")
        resp.raise_for_status()
        return resp.json()

    def wait_idle(self, timeout_s: float = 20.0) -> dict:
        """Stats once no request is running or waiting (fails the test after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            if stats["running"] == 0 and stats["waiting"] == 0:
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"engine still busy after {timeout_s} s: {stats}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def get_server(name: str, *extra_args: str, api_key: str | None = None, embedded_model: bool = False) -> ServerProcess:
    """A running server for this configuration; `name` names its log file. embedded_model: serve
    the package's default model (no model argument) instead of a random test checkpoint."""
    key = (name, extra_args, api_key, embedded_model)
    server = _servers.get(key)
    if server is None or server.proc.poll() is not None:
        checkpoint = find_checkpoint()
        if checkpoint is None and not embedded_model:
            raise RuntimeError("no test checkpoint under tests/data/ckpt_* (see tools/)")
        model = [] if embedded_model else [str(checkpoint)]
        server = ServerProcess(name, [*model, *extra_args], api_key)
        _servers[key] = server
    return server


# The two configurations the server tests share (each started once per pytest process).
API_KEY = "sk-test-0123456789"
API_MODEL = "tiny-qwen"


def api_server() -> ServerProcess:
    """API key on, small context and body limit, prefix cache on (the default)."""
    return get_server("api", "--max_model_len", "512", "--max_batch", "4",
                      "--max_body_bytes", "65536", "--served_model_name", API_MODEL,
                      api_key=API_KEY)


def browser_server() -> ServerProcess:
    """The embedded chat model, prefix cache off (freed requests return every page): real text in
    the screenshots, and ~300-450 tokens/s on two cores, so a long answer lasts seconds and a stop
    click or a client disconnect always lands mid-generation."""
    return get_server("browser", "--max_model_len", "8192", "--max_batch", "4", "--prefix_cache", "off",
                      "--threads", "1", embedded_model=True)


def agent_server() -> ServerProcess:
    """The embedded chat model (a real model: tool calls, JSON, a 4K-token prompt), prefill
    chunks of 256 tokens so a long prompt reports its progress many times."""
    return get_server("agent", "--max_model_len", "8192", "--max_batch", "8",
                      "--chunked_prefill_size", "256", embedded_model=True)


@atexit.register
def _stop_all() -> None:
    for server in _servers.values():
        server.stop()
