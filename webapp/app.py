"""The Flask app factory: one engine per app, i.e. one per gunicorn worker process.

`create_app(llm)` serves an engine built by the caller (in-process use, tests, notebooks);
`create_app(llm_factory=...)` returns at once and builds the engine in a background thread, so
/health can answer 503 while the model loads. The OpenAI routes live in webapp/routes.py; this
file has the service endpoints (health, models, capacity, stats, metrics, the chat page) and the
request guards (API key, body size).
"""
import hmac
import logging
import os
import threading
import time
from collections.abc import Callable

from flask import Flask, Response, current_app, jsonify, request, send_from_directory

from webapp.disconnect import DisconnectWatcher
from webapp.errors import APIError, register_error_handlers
from webapp.metrics import CONTENT_TYPE, ServerMetrics

log = logging.getLogger("webapp")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")


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

    @property
    def model_name(self) -> str:
        if self._served_model_name:
            return self._served_model_name
        return self.engine.get().model_name


def state() -> ServerState:
    return current_app.extensions["pyengine"]


def create_app(llm=None, *, llm_factory: Callable | None = None,
               served_model_name: str | None = None, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               on_load_error: Callable[[BaseException], None] | None = None) -> Flask:
    app = Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.json.sort_keys = False
    app.json.ensure_ascii = False
    engine = EngineHolder(llm, llm_factory, on_load_error)
    app.extensions["pyengine"] = ServerState(engine, served_model_name, api_key or None)
    register_error_handlers(app)
    app.before_request(_guard)
    app.after_request(_count)

    from webapp.routes import api
    app.register_blueprint(api)
    _add_service_routes(app)
    return app


def _guard():
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    if request.content_length is not None and request.content_length > limit:
        raise APIError(413, f"Request body too large: {request.content_length} bytes, the limit "
                       f"is {limit} bytes (--max_body_bytes)", code="request_too_large")
    key = state().api_key
    if key and request.path.startswith("/v1/"):
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                  key.encode()):
            what = "Missing" if not header else "Incorrect"
            raise APIError(401, f"{what} API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")


def _count(response: Response) -> Response:
    rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
    state().metrics.http_requests.labels(route=rule, status=str(response.status_code)).inc()
    return response


def _add_service_routes(app: Flask) -> None:
    @app.get("/health")
    def health():
        engine = state().engine
        if engine.ready:
            return jsonify(status="ok")
        if engine.error:
            return jsonify(status="error", error=engine.error), 503
        return jsonify(status="loading"), 503

    @app.get("/metrics")
    def metrics():
        return Response(state().metrics.render(), content_type=CONTENT_TYPE)

    def model_card() -> dict:
        st = state()
        llm = st.engine.get()
        return {"id": st.model_name, "object": "model", "created": st.started_at,
                "owned_by": "pyengine", "root": llm.model_name,
                "max_model_len": llm.max_model_len}

    @app.get("/v1/models")
    def models():
        return jsonify(object="list", data=[model_card()])

    @app.get("/v1/models/<path:model_id>")
    def model(model_id):
        card = model_card()
        if model_id != card["id"]:
            raise APIError(404, f"The model '{model_id}' does not exist", param="model",
                           code="model_not_found")
        return jsonify(card)

    @app.get("/v1/capacity")
    def capacity():
        st = state()
        llm = st.engine.get()
        stats = llm.stats()
        pools = {k: stats.get(k) for k in ("kv_pages_total", "kv_pages_free", "gdn_slots_total",
                                           "gdn_slots_free", "running", "waiting")}
        return jsonify(model=st.model_name, max_model_len=llm.max_model_len,
                       plan=stats.get("plan") or {}, pools=pools)

    @app.get("/v1/stats")
    def stats():
        return jsonify(state().engine.get().stats())

    @app.get("/")
    def index():
        return send_from_directory(STATIC_DIR, "index.html")

    @app.get("/favicon.ico")  # asked for by browsers and tools that do not read the page's <link>
    def favicon():
        return send_from_directory(STATIC_DIR, "favicon.svg", mimetype="image/svg+xml")

    @app.get("/static/<path:name>")
    def static_file(name):
        return send_from_directory(STATIC_DIR, name)
