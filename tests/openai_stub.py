"""A tiny OpenAI-compatible server, independent of pyengine, for the measuring tools' tests.

Standard library only (http.server). It streams chat completions as SSE: a role chunk, then
one chunk per "token" (a word chosen from the prompt's hash, so T = 0 answers repeat), then a
usage chunk and `data: [DONE]`. Its timing is set by a JSON config, so a test knows what the
tools must measure:
  prefill_s_per_kchar  seconds of "prefill" per 1,000 prompt characters before the first token
  token_delay_s        seconds between tokens
  accept               per-position acceptance rates to report as usage.spec_accept_per_position
                       (null: report none, like a server without speculative decoding)
  corrupt_when_concurrent  change a word of every answer produced while another stream runs
  usage                false: send no usage chunk (clients must count chunks)

  python tests/openai_stub.py --config cfg.json --port_file port.txt
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
MODEL = "stub-model"


class Stub:
    def __init__(self, config: dict):
        self.config = config
        self.active = 0
        self.lock = threading.Lock()


def make_handler(stub: Stub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _json(self, status: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/v1/models":
                return self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            self._json(404, {"error": {"message": "not found"}})

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                return self._json(404, {"error": {"message": "not found"}})
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body.get("model") != MODEL:
                return self._json(404, {"error": {"message": f"no model {body.get('model')!r}"}})
            prompt = json.dumps(body["messages"])
            with stub.lock:
                stub.active += 1
            try:
                self._stream(prompt, int(body.get("max_tokens") or 16), body.get("stream_options") or {})
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client cancelled
            finally:
                with stub.lock:
                    stub.active -= 1

        def _send(self, obj) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        def _stream(self, prompt: str, max_tokens: int, options: dict) -> None:
            cfg = stub.config
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            head = {"id": "stub-1", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
            self._send({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            time.sleep(cfg.get("prefill_s_per_kchar", 0.0) * len(prompt) / 1000)
            seed = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
            for i in range(max_tokens):
                word = WORDS[(seed >> (3 * (i % 80))) % len(WORDS)]
                if cfg.get("corrupt_when_concurrent") and stub.active > 1:
                    word = "WRONG"
                last = i == max_tokens - 1
                self._send({**head, "choices": [{"index": 0, "delta": {"content": word + " "},
                                                 "finish_reason": "length" if last else None}]})
                if not last:
                    time.sleep(cfg.get("token_delay_s", 0.0))
            if options.get("include_usage") and cfg.get("usage", True):
                usage = {"prompt_tokens": len(prompt) // 4, "completion_tokens": max_tokens,
                         "total_tokens": len(prompt) // 4 + max_tokens}
                if cfg.get("accept") is not None:
                    usage["spec_accept_per_position"] = cfg["accept"]
                self._send({**head, "choices": [], "usage": usage})
            self._send("[DONE]")

    return Handler


class StubProcess:
    """The stub in a child process (tests): `with StubProcess(config, tmp_path) as stub: stub.base_url`."""

    def __init__(self, config: dict, folder):
        self.config_path = os.path.join(folder, "stub_config.json")
        self.port_file = os.path.join(folder, "stub_port")
        with open(self.config_path, "w") as f:
            json.dump(config, f)
        if os.path.exists(self.port_file):
            os.remove(self.port_file)
        self.proc = subprocess.Popen([sys.executable, __file__, "--config", self.config_path,
                                      "--port_file", self.port_file])
        deadline = time.monotonic() + 20
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the OpenAI stub did not start")
            time.sleep(0.02)
        with open(self.port_file) as f:
            self.base_url = f"http://127.0.0.1:{f.read().strip()}/v1"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--port_file", required=True)
    args = parser.parse_args()
    with open(args.config) as f:
        stub = Stub(json.load(f))
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(stub))
    server.daemon_threads = True
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(args.port_file + ".tmp", args.port_file)  # readers never see a partial file
    server.serve_forever()


if __name__ == "__main__":
    main()
