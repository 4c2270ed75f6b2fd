"""The engine streams behind one HTTP request: submit, merge, observe, always clean up.

A request with n choices (or several completion prompts) owns several engine streams. This
class submits them, yields their events merged in arrival order, feeds the metrics, and
guarantees that every stream it submitted is finished or cancelled when the request ends for
any reason: normal end, an exception, a closed generator (client gone mid-stream), or the
disconnect watcher noticing a hung-up client before the next write.
"""
import logging
import queue
import threading
import time

from webapp.disconnect import DisconnectWatcher
from webapp.errors import bad_request
from webapp.metrics import ServerMetrics

log = logging.getLogger("webapp")


class Generation:
    def __init__(self, llm, metrics: ServerMetrics, watcher: DisconnectWatcher, sock=None):
        self.llm = llm
        self.metrics = metrics
        self.watcher = watcher
        self.sock = sock
        self.t_start = time.monotonic()
        self.streams = []
        self._finished: set[int] = set()
        self._last_time: dict[int, float] = {}
        self._lock = threading.Lock()

    def submit(self, prompt_ids: list[int], params, return_progress: bool = False) -> None:
        try:
            stream = self.llm.submit(prompt_token_ids=prompt_ids, sampling_params=params,
                                     return_progress=return_progress)
        except ValueError as exc:
            self.cancel()
            raise bad_request(str(exc))
        except BaseException:
            self.cancel()
            raise
        with self._lock:
            self.streams.append(stream)
        self.metrics.prompt_tokens.inc(len(prompt_ids))

    def cancel(self) -> None:
        """Cancel every stream that has not finished; safe from any thread, idempotent."""
        with self._lock:
            pending = [s for i, s in enumerate(self.streams) if i not in self._finished]
        for stream in pending:
            try:
                stream.cancel()
            except Exception:
                log.exception("stream.cancel() failed")

    def events(self):
        """Yield (choice_index, event) until every stream has finished."""
        handle = self.watcher.watch(self.sock, self.cancel)
        try:
            for index, ev in self._merged():
                self._observe(index, ev)
                yield index, ev
        finally:
            self.watcher.unwatch(handle)
            self.cancel()
            self._count_abandoned()

    def _count_abandoned(self) -> None:
        """Streams whose final event nobody read (client gone) count as cancelled."""
        with self._lock:
            abandoned = [i for i in range(len(self.streams)) if i not in self._finished]
            self._finished.update(abandoned)
        if abandoned:
            self.metrics.finished.labels(finish_reason="cancelled").inc(len(abandoned))

    def _merged(self):
        if len(self.streams) == 1:
            for ev in self.streams[0]:
                yield 0, ev
            return
        events: queue.Queue = queue.Queue()

        def pump(index, stream):
            try:
                for ev in stream:
                    events.put((index, ev))
            except BaseException as exc:  # noqa: BLE001 (re-raised in the request thread)
                events.put((index, exc))
            finally:
                events.put((index, None))

        for index, stream in enumerate(self.streams):
            threading.Thread(target=pump, args=(index, stream), daemon=True,
                             name=f"stream-pump-{index}").start()
        remaining = len(self.streams)
        while remaining:
            index, item = events.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item

    def _observe(self, index: int, ev) -> None:
        now = time.monotonic()
        n_new = len(ev.token_ids or ())
        if n_new:
            last = self._last_time.get(index)
            if last is None:
                self.metrics.ttft.observe(now - self.t_start)
            else:
                per_token = (now - last) / n_new
                for _ in range(n_new):
                    self.metrics.itl.observe(per_token)
            self._last_time[index] = now
            self.metrics.generation_tokens.inc(n_new)
        if ev.finished:
            with self._lock:
                self._finished.add(index)
            self.metrics.finished.labels(finish_reason=ev.finish_reason or "unknown").inc()
            self.metrics.e2e.observe(now - self.t_start)
