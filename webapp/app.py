"""The Flask app factory: one engine per app, i.e. one per gunicorn worker process.

`create_app(llm)` serves an engine built by the caller (in-process use, tests, notebooks);
`create_app(llm_factory=...)` returns at once and builds the engine in a background thread, so
/health can answer 503 while the model loads. The OpenAI routes live in webapp/routes.py, the
engine holder and per-app state in webapp/state.py; this file has the service endpoints
(health, models, capacity, stats, metrics, the OpenAPI spec, the chat page) and the request
guards (API key, body size).
"""
import hmac
import os
from collections.abc import Callable

from flask import Flask, Response, current_app, jsonify, request, send_from_directory

from webapp.errors import APIError, register_error_handlers
from webapp.metrics import CONTENT_TYPE
from webapp.openapi import ModelFacts, openapi_spec
from webapp.routes import api
from webapp.state import EngineHolder, ServerState, state

# A request body is refused by its Content-Length before it is read. 4 MiB holds a full 262K-token
# context of prose or code (~1 MB) or of CJK text with every character JSON-escaped (~2.3 MB);
# reading and parsing a body costs ~15 ms per MB under the GIL, which is what the limit bounds.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")


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
        if state().draining:
            return jsonify(status="stopping"), 503
        if engine.ready:
            return jsonify(status="ok")
        if engine.error:
            return jsonify(status="error", error=engine.error), 503
        return jsonify(status="loading"), 503

    @app.get("/openapi.json")
    def openapi():
        st = state()
        facts = ModelFacts.of(st.model_name, st.engine.get()) if st.engine.ready else None
        return jsonify(openapi_spec(facts))

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
