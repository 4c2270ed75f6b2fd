"""The engine streams behind one HTTP request: submit, merge, observe, always clean up.

A request with n choices (or several completion prompts) owns several engine streams. This
class submits them, yields their events merged in arrival order, feeds the metrics, and
guarantees that every stream it submitted is finished or cancelled when the request ends for
any reason: normal end, an exception, a closed generator (client gone mid-stream), or the
disconnect watcher noticing a hung-up client before the next write. While it runs it is listed
in the server state, so a shutdown can cut it (`cancel(by_server=True)`); `cut_by_server` then
tells the routes to answer 503 / an error event instead of a "cancelled" finish.
"""
import logging
import queue
import threading
import time

from webapp.errors import bad_request

log = logging.getLogger("webapp")


class Generation:
    def __init__(self, llm, server_state, sock=None):
        self.llm = llm
        self.server = server_state
        self.metrics = server_state.metrics
        self.watcher = server_state.watcher
        self.sock = sock
        self.cut_by_server = False
        self.t_start = time.monotonic()
        self.streams = []
        self._finished: set[int] = set()
        self._last_time: dict[int, float] = {}
        self._lock = threading.Lock()

    def submit(self, prompt_ids: list[int], params, return_progress: bool = False) -> None:
        if not self.streams:
            self.server.add_live(self)
        try:
            stream = self.llm.submit(prompt_token_ids=prompt_ids, sampling_params=params,
                                     return_progress=return_progress)
        except ValueError as exc:
            self.close()
            raise bad_request(str(exc))
        except BaseException:
            self.close()
            raise
        with self._lock:
            self.streams.append(stream)
            cut = self.cut_by_server
        if cut:  # a shutdown cut this request while it was being submitted
            stream.cancel()
        self.metrics.prompt_tokens.inc(len(prompt_ids))

    def cancel(self, by_server: bool = False) -> None:
        """Cancel every stream that has not finished; safe from any thread, idempotent."""
        with self._lock:
            if by_server:
                self.cut_by_server = True
            pending = [s for i, s in enumerate(self.streams) if i not in self._finished]
        for stream in pending:
            try:
                stream.cancel()
            except Exception:
                log.exception("stream.cancel() failed")

    def close(self) -> None:
        """The response is done with (sent, failed or never started): cancel and unlist."""
        self.cancel()
        self.server.remove_live(self)

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
            self.server.remove_live(self)  # after the count: a shutdown waits for this

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
