"""The OpenAPI 3.1 description of the server, served at /openapi.json.

Written by hand from what the routes check (webapp/params.py, webapp/chat_input.py,
SamplingParams), so a request the spec calls invalid is refused with a 4xx. Once the model is
loaded the spec also states what depends on it (its id, the context length, the vocabulary, the
chat template's variables); what no schema can say (the prompt's length in tokens, prompts x n)
is a documented 400. tests/test_openapi.py keeps the paths equal to the app's routes and runs
schemathesis against a live server.
"""
from dataclasses import dataclass

from pyengine.chat_template import REASONING_EFFORTS
from pyengine.sampling_params import FLOAT32_MAX, FLOAT32_TINY
from webapp.chat_input import MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS, ROLES
from webapp.params import MAX_N, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS

INT32_MAX = 2**31 - 1
# Sampling numbers reach the engine as float32: a positive value below the smallest float32 is 0
# there, one above the largest is infinite (SamplingParams refuses both).
REF = "#/components/schemas/"


@dataclass(frozen=True)
class ModelFacts:
    """What the spec states about the served model."""
    name: str
    max_model_len: int
    vocab_size: int
    template_variables: frozenset[str] | None  # None: no chat template

    @classmethod
    def of(cls, name: str, llm) -> "ModelFacts":
        return cls(name, llm.max_model_len, llm.config.vocab_size, llm.chat_template_variables)


def _ref(name: str) -> dict:
    return {"$ref": REF + name}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


_INT = {"type": "integer"}
_BOOL = _nullable({"type": "boolean"})
_STR = {"type": "string"}


def _number(**bounds) -> dict:
    if bounds.pop("positive", False):
        bounds["minimum"] = FLOAT32_TINY
    bounds.setdefault("maximum", FLOAT32_MAX)
    return _nullable({"type": "number", **bounds})


_SAMPLING = {
    "n": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_N}),
    "max_tokens": _nullable({"type": "integer", "minimum": 1,
                             "description": "at most the context left after the prompt (else "
                                            "400 context_length_exceeded)"}),
    "temperature": _number(minimum=0),
    "top_p": _number(positive=True, maximum=1),
    "top_k": _nullable({"type": "integer", "maximum": INT32_MAX,
                        "description": "0 or negative: off"}),
    "min_p": _number(minimum=0, maximum=1),
    "presence_penalty": _number(minimum=-2, maximum=2),
    "frequency_penalty": _number(minimum=-2, maximum=2),
    "repetition_penalty": _number(positive=True),
    "seed": _nullable(_INT),
    "stop": _nullable({"anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "maxItems": MAX_STOP_STRINGS,
         "items": {"type": "string", "minLength": 1}}]}),
    "stop_token_ids": _nullable({"type": "array", "items": {
        "type": "integer", "minimum": 0, "maximum": INT32_MAX}}),
    "stream": _BOOL,
    "stream_options": _nullable({"type": "object", "description": "only with stream: true",
                                 "properties": {"include_usage": _BOOL}}),
    "ignore_eos": _BOOL,
    "speculative": _BOOL,
    "skip_special_tokens": _BOOL,
    "include_stop_str_in_output": _BOOL,
    "return_tokens_as_token_ids": _BOOL,
    "logit_bias": _nullable({"type": "object", "maxProperties": 0,
                             "description": "not supported: only {} or null"}),
    "model": _nullable({"type": "string", "description": "the served model's id (else 404)"}),
}

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": _STR}}
_TOOL_CALL = {"type": "object", "required": ["function"], "properties": {
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": _STR, "arguments": {"type": ["string", "object"]}}}}}
_MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": sorted(ROLES)},
    "content": _nullable({"anyOf": [_STR, {"type": "array", "maxItems": MAX_CONTENT_PARTS,
                                           "items": _TEXT_PART}]}),
    "name": _nullable(_STR),
    "tool_call_id": _nullable(_STR),
    "reasoning_content": _nullable(_STR),
    "tool_calls": _nullable({"type": "array", "items": _TOOL_CALL}),
}}
_TOOL = {"type": "object", "required": ["function"], "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "minLength": 1}, "description": _STR,
        "parameters": {"type": "object"}}}}}

def _max_tokens(model: ModelFacts | None) -> dict:
    bounds = {"minimum": 1}
    if model is not None:
        bounds["maximum"] = model.max_model_len - 1
    return _nullable({"type": "integer", **bounds, "description": "at most the context left "
                      "after the prompt (else 400 context_length_exceeded)"})


def _template_kwargs(model: ModelFacts | None) -> dict:
    known = {"enable_thinking": {"type": "boolean"},
             "reasoning_effort": {"enum": list(REASONING_EFFORTS)}}
    if model is None or model.template_variables is None:
        return _nullable({"type": "object", "properties": {"enable_thinking": known[
            "enable_thinking"]}, "description": "variables of the model's chat template; a name "
            "the template does not read is a 400"})
    return _nullable({"type": "object", "additionalProperties": False,
                      "properties": {v: known.get(v, {}) for v in sorted(
                          model.template_variables)},
                      "description": "variables of the model's chat template"})


# Fields valid only beside another (JSON Schema if/then).
_NEEDS = [("stream_options", {"type": "object"}, "stream"),
          ("top_logprobs", {"type": "integer"}, "logprobs")]


def _needs(pairs) -> list[dict]:
    return [{"if": {"required": [field], "properties": {field: when}},
             "then": {"required": [needed], "properties": {needed: {"const": True}}}}
            for field, when, needed in pairs]


def _chat_request(model: ModelFacts | None) -> dict:
    props = {
        **_SAMPLING,
        "max_tokens": _max_tokens(model),
        "messages": {"type": "array", "minItems": 1, "maxItems": MAX_MESSAGES,
                     "items": _MESSAGE},
        "max_completion_tokens": _max_tokens(model),
        "logprobs": _BOOL,
        "top_logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS,
                                   "description": "only with logprobs: true"}),
        "tools": _nullable({"type": "array", "maxItems": MAX_TOOLS, "items": _TOOL}),
        "tool_choice": {"enum": ["auto", "none", None]},
        "response_format": _nullable({"type": "object",
                                      "properties": {"type": {"const": "text"}}}),
        "chat_template_kwargs": _template_kwargs(model),
    }
    if model is None or "reasoning_effort" in (model.template_variables or ()):
        props["reasoning_effort"] = _nullable({
            "enum": list(REASONING_EFFORTS),
            "description": "a 400 when the model's chat template has no reasoning_effort"})
    return {"type": "object", "required": ["messages"], "properties": props,
            "allOf": _needs(_NEEDS)}


def _completion_request(model: ModelFacts | None) -> dict:
    token = {"type": "integer", "minimum": 0}
    if model is not None:
        token["maximum"] = model.vocab_size - 1
    ids = {"type": "array", "minItems": 1, "items": token}
    if model is not None:
        ids["maxItems"] = model.max_model_len - 1
    return {"type": "object", "required": ["prompt"], "allOf": _needs(_NEEDS[:1]),
            "properties": {
                **_SAMPLING,
                "max_tokens": _max_tokens(model),
                "prompt": {"anyOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "maxItems": MAX_N,
                     "items": {"type": "string", "minLength": 1}},
                    ids,
                    {"type": "array", "minItems": 1, "maxItems": MAX_N, "items": ids}],
                    "description": f"prompts x n may not exceed {MAX_N}"},
                "logprobs": _nullable({"type": "integer", "minimum": 0,
                                       "maximum": MAX_TOP_LOGPROBS}),
                "echo": _nullable({"const": False}),
                "suffix": _nullable({"const": ""})}}


_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
          "properties": {"prompt_tokens": _INT, "completion_tokens": _INT,
                         "total_tokens": _INT,
                         "prompt_tokens_details": {"type": "object", "properties": {
                             "cached_tokens": _INT}},
                         "spec_drafted_per_position": {"type": "array", "items": _INT},
                         "spec_accepted_per_position": {"type": "array", "items": _INT},
                         "spec_accept_per_position": {"type": "array", "items": {"type": "number"}},
                         "spec_mean_accepted_length": {"type": "number"}}}
_FINISH = _nullable({"enum": ["stop", "length"]})
_HEAD = {"id": _STR, "created": _INT, "model": _STR}
_CHAT_RESPONSE = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {**_HEAD, "object": {"const": "chat.completion"}, "usage": _USAGE,
                   "choices": {"type": "array", "items": {
                       "type": "object", "required": ["index", "message", "finish_reason"],
                       "properties": {"index": _INT, "finish_reason": _FINISH,
                                      "logprobs": _nullable({"type": "object"}),
                                      "message": {
                                          "type": "object", "required": ["role", "content"],
                                          "properties": {
                                              "role": {"const": "assistant"},
                                              "content": _STR, "reasoning_content": _STR}}}}}},
}
_COMPLETION_RESPONSE = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {**_HEAD, "object": {"const": "text_completion"}, "usage": _USAGE,
                   "choices": {"type": "array", "items": {
                       "type": "object", "required": ["index", "text", "finish_reason"],
                       "properties": {"index": _INT, "text": _STR, "finish_reason": _FINISH,
                                      "logprobs": _nullable({"type": "object"})}}}},
}
_ERROR = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "additionalProperties": False,
        "properties": {"message": _STR, "type": _STR, "param": _nullable(_STR),
                       "code": _nullable(_STR)}}},
}
_MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by", "max_model_len"],
          "properties": {"id": _STR, "object": {"const": "model"}, "created": _INT,
                         "owned_by": _STR, "root": _STR, "max_model_len": _INT}}

_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {
    "type": "string", "description": "a JSON chunk, an error object, or [DONE] (the last)"}}}

_ERROR_TEXT = {
    400: "invalid request (the error's param names the field)",
    401: "missing or wrong API key",
    404: "no such model or route",
    405: "method not allowed",
    413: "request body over --max_body_bytes",
    503: "model loading, load failed, or shutting down (cut requests too)",
}


def _errors(*statuses: int) -> dict:
    return {str(s): {"description": _ERROR_TEXT[s],
                     "content": {"application/json": {"schema": _ref("Error")}}}
            for s in statuses}


def _json(schema: dict, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _generation(request: str, response: str, summary: str) -> dict:
    return {"post": {
        "summary": summary, "security": [{"bearer": []}],
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {
            "200": {"description": "the completion, or with stream: true server-sent events "
                                   "ending in data: [DONE] (an error event first when a "
                                   "shutdown cuts the stream)",
                    "content": {"application/json": {"schema": _ref(response)},
                                "text/event-stream": {"schema": _SSE_EVENT}}},
            **_errors(400, 401, 404, 413, 503)}}}


def _get(summary: str, ok: dict, *errors: int, secured: bool = True) -> dict:
    op = {"summary": summary, "responses": {"200": ok, **_errors(*errors)}}
    if secured:
        op["security"] = [{"bearer": []}]
    return {"get": op}


def _path_parameter(name: str, example: str | None) -> dict:
    param = {"name": name, "in": "path", "required": True, "schema": _STR}
    if example:
        param["example"] = example
    return param


def openapi_spec(model: ModelFacts | None = None) -> dict:
    """The spec; with the served model's facts once it is loaded."""
    obj = {"type": "object"}
    model_name = model.name if model is not None else None
    return {
        "openapi": "3.1.0",
        "info": {"title": "pyengine", "version": "0.1.0",
                 "description": "OpenAI-compatible API of pyengine serve. Every error body is "
                                "OpenAI's {\"error\": {message, type, param, code}}."},
        "paths": {
            "/v1/chat/completions": _generation("ChatCompletionRequest", "ChatCompletion",
                                                "Chat completion"),
            "/v1/completions": _generation("CompletionRequest", "Completion",
                                           "Text completion"),
            "/v1/models": _get("The served model", _json({
                "type": "object", "required": ["object", "data"],
                "properties": {"object": {"const": "list"},
                               "data": {"type": "array", "items": _ref("Model")}}}),
                401, 503),
            "/v1/models/{model_id}": {**_get("One model", _json(_ref("Model")), 401, 404, 503),
                                      "parameters": [_path_parameter("model_id", model_name)]},
            "/v1/capacity": _get("Memory plan and pools", _json({
                "type": "object", "required": ["model", "max_model_len", "plan", "pools"],
                "properties": {"model": _STR, "max_model_len": _INT, "plan": obj,
                               "pools": obj}}), 401, 503),
            "/v1/stats": _get("Engine counters", _json(obj), 401, 503),
            "/health": {"get": {"summary": "ok once the model is loaded", "responses": {
                "200": _json({"type": "object", "required": ["status"],
                              "properties": {"status": {"const": "ok"}}}),
                "503": _json({"type": "object", "required": ["status"], "properties": {
                    "status": {"enum": ["loading", "error", "stopping"]}, "error": _STR}},
                    "loading, failed or shutting down")}}},
            "/metrics": _get("Prometheus metrics", {
                "description": "OK", "content": {"text/plain": {"schema": _STR}}},
                secured=False),
            "/openapi.json": _get("This document", _json(obj), secured=False),
            "/": _get("The chat page", {"description": "OK",
                                        "content": {"text/html": {"schema": _STR}}},
                      secured=False),
            "/favicon.ico": _get("The chat page's icon", {"description": "OK",
                                                          "content": {"image/svg+xml": {"schema": _STR}}},
                                 secured=False),
            "/static/{name}": {**_get("The chat page's files", {
                "description": "OK", "content": {t: {"schema": _STR} for t in (
                    "text/javascript", "text/css", "text/html", "image/svg+xml")}}, 404, secured=False),
                "parameters": [_path_parameter("name", "chat.js")]},
        },
        "components": {
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "needed on /v1 when the server has --api_key"}},
            "schemas": {"ChatCompletionRequest": _chat_request(model),
                        "CompletionRequest": _completion_request(model),
                        "ChatCompletion": _CHAT_RESPONSE, "Completion": _COMPLETION_RESPONSE,
                        "Model": _MODEL, "Error": _ERROR},
        },
    }
