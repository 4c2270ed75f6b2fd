"""Read and check the fields of an OpenAI request body; build the engine's SamplingParams.

Every check names the field in the error (`param`), so a client sees which value was wrong.
Type checks are strict (a bool is not a number, a string is not a list); value ranges that the
engine knows best are left to SamplingParams, whose ValueError becomes a 400 as well.
"""
import json
import math
import re
from dataclasses import dataclass, field

from flask import current_app, request

from webapp.errors import APIError, bad_request

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16

_ABSENT = object()
# A JSON escape of a UTF-16 surrogate: pairs decode to one character, a lone one stays a
# surrogate, which is no Unicode character (no tokenizer or UTF-8 writer takes it).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _read_body() -> bytes:
    try:
        return _read_limited_body()
    except APIError:
        raise
    except Exception as exc:  # the server's parser of a bad chunked body, a client gone
        raise bad_request(f"The request body could not be read: {type(exc).__name__}: {exc}",
                          code="invalid_body")


def _read_limited_body() -> bytes:
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    if request.content_length is not None:  # the guard already refused one above the limit
        return request.get_data(cache=True)
    # Chunked upload: werkzeug would cut it at the limit silently; read it and refuse instead.
    stream, parts, size = request.environ["wsgi.input"], [], 0
    while True:
        part = stream.read(min(65536, limit + 1 - size))
        if not part:
            return b"".join(parts)
        parts.append(part)
        size += len(part)
        if size > limit:
            raise APIError(413, f"Request body too large: the limit is {limit} bytes "
                           "(--max_body_bytes)", code="request_too_large")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _lone_surrogate(value, path: str) -> str | None:
    """The path of the first string (or key) holding a lone surrogate, else None."""
    if isinstance(value, str):
        return path if not value.isascii() and _SURROGATE.search(value) else None
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]"
        found = _lone_surrogate(key, where) if isinstance(key, str) else None
        found = found or _lone_surrogate(item, where)
        if found:
            return found
    return None


def json_body() -> dict:
    raw = _read_body()
    if not raw:
        raise bad_request("The request body is empty; expected a JSON object")
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        why = "it is not UTF-8" if isinstance(exc, UnicodeDecodeError) else \
            "it nests too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise bad_request(f"The request body is not valid JSON: {why}", code="invalid_json")
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw):
        try:
            where = _lone_surrogate(body, "")
        except RecursionError:
            where = ".(deeply nested)"
        if where:
            raise bad_request(f"'{where[1:]}' holds a lone UTF-16 surrogate (\\ud800-\\udfff "
                              "without its pair), which is not a Unicode character",
                              param=where[1:].split(".")[0].split("[")[0], code="invalid_unicode")
    return body


def _get(body: dict, name: str, kinds: tuple, what: str, default):
    value = body.get(name, _ABSENT)
    if value is _ABSENT or value is None:
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise bad_request(f"'{name}' must be {what}, got a boolean", param=name)
    if not isinstance(value, kinds):
        raise bad_request(f"'{name}' must be {what}, got {type(value).__name__}", param=name)
    return value


def get_int(body, name, default=None, lo=None, hi=None):
    value = _get(body, name, (int,), "an integer", default)
    if value is not None and ((lo is not None and value < lo) or (hi is not None and value > hi)):
        bounds = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise bad_request(f"'{name}' must be {bounds}, got {value}", param=name)
    return value


def get_number(body, name, default=None):
    value = _get(body, name, (int, float), "a number", default)
    if value is not None and not math.isfinite(value):
        raise bad_request(f"'{name}' must be a finite number", param=name)
    return float(value) if value is not None else None


def get_bool(body, name, default=False):
    return _get(body, name, (bool,), "true or false", default)


def get_str(body, name, default=None):
    return _get(body, name, (str,), "a string", default)


def get_dict(body, name, default=None):
    return _get(body, name, (dict,), "a JSON object", default)


def get_list(body, name, default=None):
    return _get(body, name, (list,), "an array", default)


def _stop_strings(body) -> list[str] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("'stop' must be a string or an array of strings", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"'stop' has {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed",
                          param="stop")
    if any(s == "" for s in stop):
        raise bad_request("'stop' strings must not be empty", param="stop")
    return stop or None


def _token_ids(body, name) -> list[int] | None:
    ids = get_list(body, name)
    if ids is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                   for i in ids):
        raise bad_request(f"'{name}' must be an array of non-negative integers", param=name)
    return ids or None


@dataclass
class SamplingRequest:
    """The sampling fields of one request, before the prompt length is known."""
    n: int
    max_tokens: int | None
    seed: int | None
    stream: bool
    include_usage: bool
    logprobs: int | None  # number of top alternatives; None = no logprobs
    tokens_as_ids: bool = False
    engine_kwargs: dict = field(default_factory=dict)
    return_progress: bool = False  # llama.cpp's: prompt_progress chunks while the prompt prefills
    # max_tokens given beside max_completion_tokens (which wins): still checked against the context
    shadowed_max_tokens: int | None = None


def parse_sampling(body: dict, chat: bool) -> SamplingRequest:
    if get_dict(body, "logit_bias"):
        raise bad_request("'logit_bias' is not supported", param="logit_bias")
    n = get_int(body, "n", 1, lo=1, hi=MAX_N)
    best_of = get_int(body, "best_of", None)
    if best_of is not None and best_of != n:
        raise bad_request("'best_of' is not supported (only best_of == n)", param="best_of")
    max_tokens = get_int(body, "max_tokens", None, lo=1)
    shadowed = None
    if chat and body.get("max_completion_tokens") is not None:
        shadowed, max_tokens = max_tokens, get_int(body, "max_completion_tokens", max_tokens, lo=1)
    stream = get_bool(body, "stream", False)
    stream_options = get_dict(body, "stream_options")
    if stream_options is not None and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true",
                          param="stream_options")
    include_usage = get_bool(stream_options or {}, "include_usage", False)
    if chat:
        want = get_bool(body, "logprobs", False)
        top = get_int(body, "top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
        if top is not None and not want:
            raise bad_request("'top_logprobs' requires 'logprobs': true", param="top_logprobs")
        logprobs = (top or 0) if want else None
    else:
        logprobs = get_int(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    kwargs = {
        "temperature": get_number(body, "temperature", 1.0),
        "top_p": get_number(body, "top_p", 1.0),
        "top_k": get_int(body, "top_k", 0),
        "min_p": get_number(body, "min_p", 0.0),
        "presence_penalty": get_number(body, "presence_penalty", 0.0),
        "frequency_penalty": get_number(body, "frequency_penalty", 0.0),
        "repetition_penalty": get_number(body, "repetition_penalty", 1.0),
        "stop": _stop_strings(body),
        "stop_token_ids": _token_ids(body, "stop_token_ids"),
        "ignore_eos": get_bool(body, "ignore_eos", False),
        "skip_special_tokens": get_bool(body, "skip_special_tokens", True),
        "include_stop_str_in_output": get_bool(body, "include_stop_str_in_output", False),
        "logprobs": logprobs,
        "speculative": get_bool(body, "speculative", True),
    }
    kwargs["top_k"] = max(kwargs["top_k"], 0)
    seed = get_int(body, "seed", None)
    return SamplingRequest(n=n, max_tokens=max_tokens, seed=seed, stream=stream,
                           include_usage=include_usage, logprobs=logprobs,
                           tokens_as_ids=get_bool(body, "return_tokens_as_token_ids", False),
                           engine_kwargs=kwargs,
                           return_progress=get_bool(body, "return_progress", False) and stream,
                           shadowed_max_tokens=shadowed)


def resolve_max_tokens(sreq: SamplingRequest, prompt_len: int, max_model_len: int,
                       prompt_param: str) -> int:
    if prompt_len >= max_model_len:
        raise APIError(400, f"The prompt has {prompt_len} tokens; the model's context is "
                       f"{max_model_len} tokens, which leaves no room to generate",
                       param=prompt_param, code="context_length_exceeded")
    room = max_model_len - prompt_len
    if sreq.shadowed_max_tokens is not None and sreq.shadowed_max_tokens > room:
        raise APIError(400, f"max_tokens is {sreq.shadowed_max_tokens}, but the prompt has {prompt_len} "
                       f"tokens and the context is {max_model_len}: at most {room} tokens can "
                       f"be generated", param="max_tokens", code="context_length_exceeded")
    if sreq.max_tokens is None:
        return room
    if sreq.max_tokens > room:
        raise APIError(400, f"max_tokens is {sreq.max_tokens}, but the prompt has {prompt_len} "
                       f"tokens and the context is {max_model_len}: at most {room} tokens can "
                       f"be generated", param="max_tokens", code="context_length_exceeded")
    return sreq.max_tokens


def make_sampling_params(sampling_cls, sreq: SamplingRequest, max_tokens: int, index: int):
    """SamplingParams for choice `index`; choices get distinct seeds derived from `seed`."""
    seed = None if sreq.seed is None else (sreq.seed + index) % (2 ** 63)
    try:
        return sampling_cls(max_tokens=max_tokens, seed=seed, **sreq.engine_kwargs)
    except (ValueError, TypeError) as exc:
        # SamplingParams' messages start with the field's name ("top_p must be > 0, got 0").
        field_name = str(exc).split(" ", 1)[0].split("[", 1)[0]
        param = field_name if field_name in sreq.engine_kwargs or field_name == "seed" else None
        raise bad_request(f"Invalid sampling parameters: {exc}", param=param)
