"""The gunicorn worker `pyengine serve` runs: gthread, plus OpenAI-format errors for what gunicorn
refuses before the app sees a request, and the server's shutdown semantics.

Shutdown (SIGTERM or SIGINT to the gunicorn arbiter, which passes them on as SIGTERM / SIGQUIT):
- SIGTERM, graceful: the worker stops accepting connections and new generation requests (503
  `server_shutting_down`; /health answers 503 "stopping"). Requests in flight may finish for
  `--graceful_timeout` minus CUT_MARGIN_S seconds; then the rest are cut: a non-streamed one
  answers 503 with an OpenAI error body, a stream gets an error event and `data: [DONE]`. The
  margin lets those answers go out before the arbiter kills the worker at `--graceful_timeout`.
- SIGINT / SIGQUIT, quick: the same cut at once, then the worker exits.
In both cases the engine is freed last (worker_exit in pyengine/serve.py).
"""
import ctypes
import ctypes.util
import json
import logging
import threading

from gunicorn import util
from gunicorn.http import errors as http_errors
from gunicorn.workers.gthread import ThreadWorker

log = logging.getLogger("webapp")

CUT_MARGIN_S = 2.0
# Large allocations (request bodies, parsed prompts, tokenizer buffers) are mapped and unmapped
# one by one at and above this size, so their memory returns to the system when freed; glibc
# otherwise raises the threshold after the first large free and keeps such memory in its heaps.
MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3

# gunicorn's own refusals, as HTTP status and reason; any other parse error is a 400.
_STATUS = [
    ("LimitRequestLine", 414, "URI Too Long", "request_line_too_long"),
    ("LimitRequestHeaders", 431, "Request Header Fields Too Large", "headers_too_large"),
    ("ExpectationFailed", 417, "Expectation Failed", None),
    ("ForbiddenProxyRequest", 403, "Forbidden", None),
]


def _client_error(exc: BaseException) -> tuple[int, str, str | None] | None:
    response_side = tuple(getattr(http_errors, n) for n in (
        "InvalidResponseHeader", "InvalidResponseHeaderName") if hasattr(http_errors, n))
    if response_side and isinstance(exc, response_side):
        return None  # the app sent a bad header: a server error
    for name, status, reason, code in _STATUS:
        cls = getattr(http_errors, name, None)
        if cls is not None and isinstance(exc, cls):
            return status, reason, code
    if isinstance(exc, http_errors.ParseException):
        return 400, "Bad Request", "invalid_http_request"
    return None


def error_bytes(status: int, reason: str, message: str, code: str | None,
                type_: str = "invalid_request_error") -> bytes:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None,
                                 "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


def return_large_allocations() -> bool:
    """Fix glibc's mmap threshold (see MMAP_THRESHOLD_BYTES); False where there is no glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


class ServeWorker(ThreadWorker):
    def init_process(self):
        return_large_allocations()
        super().init_process()

    def _server_state(self):
        app = getattr(self, "wsgi", None)
        return getattr(app, "extensions", {}).get("pyengine")

    def _cut(self) -> None:
        server = self._server_state()
        if server is not None:
            n = server.cut_all()
            if n:
                self.log.info("shutdown: cut %d request(s) in flight", n)

    def handle_exit(self, sig, frame):  # SIGTERM
        super().handle_exit(sig, frame)
        server = self._server_state()
        if server is not None:
            server.drain()
        delay = max(0.0, self.cfg.graceful_timeout - CUT_MARGIN_S)
        timer = threading.Timer(delay, self._cut)
        timer.daemon = True
        timer.start()

    def handle_quit(self, sig, frame):  # SIGINT, SIGQUIT
        self._cut()
        super().handle_quit(sig, frame)  # exits; the request threads finish their answers first

    def handle_error(self, req, client, addr, exc):
        known = _client_error(exc)
        if known is None:
            self.log.exception("Error handling request")
            status, reason, code, type_ = 500, "Internal Server Error", None, "server_error"
            message = "Internal error while reading the request"
        else:
            status, reason, code = known
            type_ = "invalid_request_error"
            message = f"{reason}: {exc}"
            self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
        try:
            util.write_nonblock(client, error_bytes(status, reason, message, code, type_))
        except Exception:  # the client may be gone
            self.log.debug("Failed to send error message.")
