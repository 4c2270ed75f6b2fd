"""What one app (one gunicorn worker) holds: its engine, metrics, live requests, shutdown state.

Kept apart from the app factory so the route modules and the factory both import it and
neither imports the other.
"""
import logging
import threading
import time
from collections.abc import Callable

from flask import current_app

from webapp.disconnect import DisconnectWatcher
from webapp.errors import APIError
from webapp.metrics import ServerMetrics

log = logging.getLogger("webapp")


class EngineHolder:
    """The app's engine, or why there is none yet (loading) or at all (load failed)."""

    def __init__(self, llm=None, llm_factory: Callable | None = None,
                 on_load_error: Callable[[BaseException], None] | None = None):
        self._llm = llm
        self.error: str | None = None
        self.loaded_at = time.time() if llm is not None else None
        if llm is None:
            if llm_factory is None:
                raise ValueError("create_app needs an LLM or an llm_factory")
            threading.Thread(target=self._load, args=(llm_factory, on_load_error),
                             name="engine-loader", daemon=True).start()

    def _load(self, factory, on_load_error) -> None:
        t0 = time.time()
        try:
            self._llm = factory()
        except BaseException as exc:  # noqa: BLE001 (any failure: reported, never raised)
            self.error = f"{type(exc).__name__}: {exc}"
            log.error("loading the model failed: %s", self.error)
            if on_load_error is not None:
                on_load_error(exc)
            return
        self.loaded_at = time.time()
        log.info("model loaded in %.1f s", self.loaded_at - t0)

    @property
    def ready(self) -> bool:
        return self._llm is not None

    def get(self):
        if self._llm is None:
            if self.error:
                raise APIError(503, f"The model failed to load: {self.error}")
            raise APIError(503, "The model is still loading; retry shortly", code="model_loading")
        return self._llm

    def stats(self) -> dict | None:
        return self._llm.stats() if self._llm is not None else None

    def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.close()


class ServerState:
    def __init__(self, engine: EngineHolder, served_model_name: str | None, api_key: str | None):
        self.engine = engine
        self._served_model_name = served_model_name
        self.api_key = api_key
        self.metrics = ServerMetrics(engine.stats)
        self.watcher = DisconnectWatcher()
        self.started_at = int(time.time())
        # Shutdown: `draining` refuses new generation requests; `cut_all` cancels the ones in
        # flight, which then answer 503 (non-streamed) or end with an error event (streams).
        self.draining = False
        self._live: set = set()
        self._live_lock = threading.Lock()

    @property
    def model_name(self) -> str:
        if self._served_model_name:
            return self._served_model_name
        return self.engine.get().model_name

    def check_accepting(self) -> None:
        if self.draining:
            raise shutting_down()

    def add_live(self, generation) -> None:
        with self._live_lock:
            if self.draining:
                raise shutting_down()
            self._live.add(generation)

    def remove_live(self, generation) -> None:
        with self._live_lock:
            self._live.discard(generation)

    def live_count(self) -> int:
        with self._live_lock:
            return len(self._live)

    def drain(self) -> None:
        self.draining = True

    def cut_all(self) -> int:
        """Cancel every request in flight (shutdown); returns how many there were."""
        with self._live_lock:
            self.draining = True
            live = list(self._live)
        for generation in live:
            generation.cancel(by_server=True)
        return len(live)


def shutting_down() -> APIError:
    return APIError(503, "The server is shutting down and takes no new requests",
                    code="server_shutting_down")


def state() -> ServerState:
    return current_app.extensions["pyengine"]
