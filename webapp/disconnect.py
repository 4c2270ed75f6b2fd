"""Notice a client that hung up while its request is still being computed.

A streaming response learns of a closed connection only when a write fails, i.e. at the next
token; during a long prefill, or for a non-streaming request, no write happens for a long time.
So one watcher thread per app peeks at the sockets of in-flight requests a few times a second:
a socket that reads as end-of-file (or reset) means the client is gone, and the request's
cancel function runs, which frees its engine resources at the next chunk or step boundary.

Design decision: a peek (MSG_PEEK | MSG_DONTWAIT) consumes nothing, so gunicorn's own reads of
a keep-alive connection are unaffected. A client that half-closes its side after sending the
request would look gone; HTTP clients do not do that.
"""
import errno
import itertools
import logging
import select
import socket
import threading
import time
from collections.abc import Callable

log = logging.getLogger("webapp")

_GONE_ERRNOS = {errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN, errno.EBADF, errno.ETIMEDOUT}


def client_is_gone(sock: socket.socket) -> bool:
    try:
        # poll first: on a socket with a timeout, recv() would wait for that timeout.
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        if not poller.poll(0):
            return False
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False  # nothing to read: the client is waiting for our answer
    except OSError as exc:
        return exc.errno in _GONE_ERRNOS
    except ValueError:  # a closed socket (fileno -1)
        return True
    return data == b""


def socket_from_environ(environ: dict) -> socket.socket | None:
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    return sock if isinstance(sock, socket.socket) else None


class DisconnectWatcher:
    def __init__(self, interval_s: float = 0.2):
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[socket.socket, Callable[[], None]]] = {}
        self._ids = itertools.count()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def watch(self, sock: socket.socket | None, on_gone: Callable[[], None]) -> int | None:
        """Call on_gone (once) if the client of `sock` disconnects; returns a handle."""
        if sock is None:
            return None
        with self._lock:
            handle = next(self._ids)
            self._watched[handle] = (sock, on_gone)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="disconnect-watcher",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()
        return handle

    def unwatch(self, handle: int | None) -> None:
        """After this returns the socket is never touched again (it may be closed and reused)."""
        if handle is None:
            return
        with self._lock:
            self._watched.pop(handle, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._watched:
                    self._wake.wait()
                gone = [(h, fn) for h, (sock, fn) in self._watched.items() if client_is_gone(sock)]
                for handle, _ in gone:
                    del self._watched[handle]
            for _, on_gone in gone:
                try:
                    on_gone()
                except Exception:  # a failing cancel must not stop the watcher
                    log.exception("cancelling a disconnected request failed")
            time.sleep(self._interval_s)
