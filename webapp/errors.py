"""Errors in the OpenAI format: {"error": {"message", "type", "param", "code"}}.

Every failure a client can cause becomes an `APIError` with the right HTTP status; the handlers
registered here also turn Flask/werkzeug errors (404, 405, 413, ...) and unexpected exceptions
into the same shape, so no response body is ever an HTML error page.
"""
import logging

from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger("webapp")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type_: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": _writable(self.message), "type": self.type,
                          "param": _writable(self.param), "code": self.code}}


def _writable(text: str | None) -> str | None:
    """Client text echoed in an error may hold lone surrogates, which UTF-8 cannot write."""
    if text is None or text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def error_response(err: APIError):
    return jsonify(err.body()), err.status


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(APIError, error_response)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        status = exc.code or 500
        message = {
            404: "Not found: no such endpoint",
            405: "Method not allowed for this endpoint",
            413: "Request body too large",
        }.get(status, exc.description or exc.name)
        if status == 413:
            limit = app.config.get("MAX_CONTENT_LENGTH")
            message = f"Request body too large: the limit is {limit} bytes (--max_body_bytes)"
        code = "request_too_large" if status == 413 else None
        body, status = error_response(APIError(status, message, code=code))
        allow = getattr(exc, "valid_methods", None)  # a 405 names the methods it allows
        return body, status, {"Allow": ", ".join(sorted(allow))} if allow else {}

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error while serving a request")
        return error_response(APIError(500, f"Internal error: {type(exc).__name__}: {exc}"))
