"""`pyengine serve`: the OpenAI-compatible server under gunicorn.

gunicorn runs in-process through its Python API (a BaseApplication subclass, no shell-out).
Design decision: the app is loaded in each worker after the fork (no preload), so every worker
process owns one engine and no CUDA context or engine thread crosses a fork. The default is one
worker (webapp/worker.py: gthread with OpenAI-format errors for gunicorn's own refusals and the
shutdown semantics of SIGTERM / SIGINT) with enough threads for `max_batch` concurrent streams
plus service requests; more workers mean more engines, each with its own memory.

The CLI (pyengine/cli.py) calls `main(argv)`; tests build a parser with `add_serve_arguments`.
Flag errors, a bad model directory, a missing GPU and a port that cannot be bound are each
reported in one line before gunicorn starts.
"""
import argparse
import errno
import logging
import os
import socket
import subprocess
import sys

from pyengine.cli_args import (Parser, add_engine_arguments, byte_size, check_model_dir, engine_kwargs,
                               fail, port_number, positive_int)  # fmt: skip

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
_ON_OFF = ("on", "off")  # the engine flags' spelling too


def llm_kwargs(args: argparse.Namespace) -> dict:
    """LLM(...) keyword arguments from the engine flags (the same flags as `pyengine generate`)."""
    return {"device": args.device, **engine_kwargs(args)}


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    from webapp.app import DEFAULT_MAX_BODY_BYTES
    parser.add_argument("model", nargs="?", default=None,
                        help="model directory (config.json, safetensors, tokenizer)")
    g = parser.add_argument_group("server")
    g.add_argument("--host", default=DEFAULT_HOST, help=f"address (default: {DEFAULT_HOST})")
    g.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    g.add_argument("--api_key", default=os.environ.get("PYENGINE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (or $PYENGINE_API_KEY)")
    g.add_argument("--served_model_name", default=None,
                   help="model id clients send (default: the model directory's name)")
    g.add_argument("--max_body_bytes", type=byte_size, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"largest request body (default: {DEFAULT_MAX_BODY_BYTES})")
    g.add_argument("--workers", type=positive_int, default=1,
                   help="worker processes, each with its own engine (default: 1)")
    g.add_argument("--http_threads", type=positive_int, default=None,
                   help="request threads per worker (default: 2 x max_batch + 4); "
                        "--threads is the engine's CPU threads")
    g.add_argument("--timeout", type=positive_int, default=120,
                   help="seconds a silent worker may take before gunicorn restarts it")
    g.add_argument("--graceful_timeout", type=positive_int, default=10,
                   help="on SIGTERM, seconds until the worker is stopped; requests still in "
                        "flight 2 s before are cut with a 503 / an error event (default: 10)")
    g.add_argument("--log_level", default="info", choices=("debug", "info", "warning", "error"),
                   help="server log detail (default: info)")
    g.add_argument("--access_log", choices=_ON_OFF, default="on",
                   help="log one line per request to stderr (default: on)")
    add_engine_arguments(parser.add_argument_group("engine"))


def bind_problem(host: str, port: int) -> str | None:
    """Why gunicorn could not listen on host:port (None: it can), found by binding a socket
    the way gunicorn does; gunicorn itself would retry for seconds and then say less."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        return f"--host {host!r}: {exc.strerror}"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            hint = {errno.EADDRINUSE: "another program is listening there; choose another --port",
                    errno.EACCES: "ports below 1024 need privileges; choose --port 1024 or above",
                    errno.EADDRNOTAVAIL: "no network interface of this machine has that address"}
            reason = f"{exc.strerror} ({hint[exc.errno]})" if exc.errno in hint else exc.strerror
            return f"cannot listen on {host}:{port}: {reason}"
    return None


def cuda_problem_in_child() -> str | None:
    """cli_args.cuda_problem() asked in a child process: probing the GPU here would initialize
    CUDA in the arbiter, and gunicorn's forked workers cannot use a CUDA inherited that way."""
    import pyengine

    root = os.path.dirname(os.path.dirname(os.path.abspath(pyengine.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    code = "from pyengine.cli_args import cuda_problem; print(cuda_problem() or '')"
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           timeout=300, check=False)  # fmt: skip
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"--device cuda: the GPU check failed: {last}"
    return probe.stdout.strip() or None


def gunicorn_options(args: argparse.Namespace) -> dict:
    threads = args.http_threads or 2 * args.max_batch + 4
    return {
        "bind": f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}",
        "workers": args.workers, "worker_class": "webapp.worker.ServeWorker",
        "threads": threads, "timeout": args.timeout,
        "graceful_timeout": args.graceful_timeout, "keepalive": 5,
        "loglevel": args.log_level, "errorlog": "-",
        "accesslog": "-" if args.access_log == "on" else None,
        "preload_app": False, "worker_exit": _worker_exit,
        # The body limit is enforced by the app (413 in OpenAI format); gunicorn refuses longer
        # request lines (414), more or longer headers (431), answered as OpenAI errors by the
        # worker class. The header limit is lifted a little so long Authorization headers pass.
        "limit_request_line": 8190, "limit_request_fields": 100,
        "limit_request_field_size": 16384,
        # gunicorn >= 24 opens a control socket at a fixed per-user path; several servers
        # (tests, one per model) would fight over it, and nothing here uses it.
        "control_socket_disable": True,
    }


def make_app(args: argparse.Namespace):
    """Runs in each worker: the app answers /health at once and loads the engine behind it."""
    from webapp.app import create_app

    def build_llm():
        from pyengine import LLM
        return LLM(args.model, **llm_kwargs(args))

    def load_failed(exc: BaseException) -> None:
        # Exit code 3 is gunicorn's WORKER_BOOT_ERROR: the arbiter stops instead of
        # restarting a worker that would fail the same way.
        logging.getLogger("webapp").error("model failed to load; stopping the server")
        sys.stderr.flush()
        os._exit(3)

    name = args.served_model_name or (os.path.basename(os.path.normpath(args.model))
                                      if args.model else None)
    return create_app(llm_factory=build_llm, served_model_name=name, api_key=args.api_key,
                      max_body_bytes=args.max_body_bytes, on_load_error=load_failed)


def _worker_exit(server, worker) -> None:
    app = getattr(worker, "wsgi", None)
    server_state = getattr(app, "extensions", {}).get("pyengine")
    if server_state is not None:
        server_state.engine.close()


def _application_class():
    from gunicorn.app.base import BaseApplication

    class ServeApplication(BaseApplication):
        def __init__(self, args: argparse.Namespace):
            self.args = args
            super().__init__()

        def load_config(self):
            for key, value in gunicorn_options(self.args).items():
                if value is not None and key in self.cfg.settings:
                    self.cfg.set(key, value)

        def load(self):
            return make_app(self.args)

    return ServeApplication


def run(args: argparse.Namespace) -> int:
    problem = check_model_dir(args.model) or bind_problem(args.host, args.port)
    if problem is None and args.device == "cuda":
        problem = cuda_problem_in_child()
    if problem:
        return fail("pyengine serve", problem)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    _application_class()(args).run()  # returns only when the arbiter stops
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="pyengine serve", description="OpenAI-compatible server and web chat")
    add_serve_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
