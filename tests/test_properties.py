"""Property tests (hypothesis): SamplingParams, the C API's argument checks, and the OpenAI
routes in-process, each against any value of each field.

- SamplingParams(**fields) either builds or raises ValueError naming a field, and what it
  builds the engine accepts (the Python checks are never looser than the C ones).
- pe_engine_add_request accepts exactly the arguments its header documents as valid and
  refuses the rest with PE_ERR_INVALID_ARGUMENT and a message, for any float32 / int32 values
  (NaN, infinities, subnormals, extremes) and any prompt.
- POST /v1/chat/completions and /v1/completions answer any JSON body with a 2xx or a 4xx in
  OpenAI's error format, never a 5xx.
"""
import json
import math
import struct

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from server_process import find_checkpoint

from pyengine import SamplingParams

MAX_MODEL_LEN = 64
SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def llm():
    from pyengine import LLM
    with LLM(str(find_checkpoint()), max_model_len=MAX_MODEL_LEN, max_batch=2) as engine:
        yield engine


def any_value():
    return st.one_of(
        st.none(), st.booleans(),
        st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=4), st.lists(st.integers(-5, 2 ** 33), max_size=3),
        st.lists(st.text(max_size=3), max_size=3))


def near_valid_float():
    return st.one_of(st.floats(-3, 3), st.sampled_from([0.0, -0.0, 1e-50, 1e-320, 1e38, 1e39]))


FIELDS = {
    "max_tokens": st.one_of(st.integers(-3, 2 ** 32), any_value()),
    "temperature": st.one_of(near_valid_float(), any_value()),
    "top_p": st.one_of(near_valid_float(), any_value()),
    "top_k": st.one_of(st.integers(-3, 2 ** 32), any_value()),
    "min_p": st.one_of(near_valid_float(), any_value()),
    "seed": st.one_of(st.integers(-3, 2 ** 65), any_value()),
    "stop": any_value(),
    "stop_token_ids": any_value(),
    "ignore_eos": any_value(),
    "logprobs": st.one_of(st.integers(-3, 25), any_value()),
    "presence_penalty": st.one_of(near_valid_float(), any_value()),
    "frequency_penalty": st.one_of(near_valid_float(), any_value()),
    "repetition_penalty": st.one_of(near_valid_float(), any_value()),
    "skip_special_tokens": any_value(),
}


@SETTINGS
@given(st.fixed_dictionaries({}, optional=FIELDS))
def test_sampling_params_build_or_name_the_field(fields):
    try:
        sp = SamplingParams(**fields)
    except ValueError as exc:
        assert str(exc).split(" ")[0].split("[")[0] in FIELDS, exc
        return
    assert sp.max_tokens >= 1 and sp.top_k >= 0 and 0 < sp.top_p <= 1
    assert sp.stop is None or (sp.stop and all(isinstance(s, str) and s for s in sp.stop))
    assert all(isinstance(getattr(sp, f), bool) for f in ("ignore_eos", "skip_special_tokens"))


@SETTINGS
@given(st.fixed_dictionaries({}, optional=FIELDS))
def test_what_sampling_params_accept_the_engine_accepts(llm, fields):
    try:
        sp = SamplingParams(**fields)
    except ValueError:
        return
    stream = llm.submit(prompt_token_ids=[1, 2, 3], sampling_params=sp)  # raises if refused
    stream.cancel()
    stream.result()


# ---- the C API directly ----

def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def c_accepts(args: dict, vocab: int) -> bool:
    """pyengine.h's rules for pe_engine_add_request (see pe_sampling_params)."""
    tokens = args["tokens"]
    finite = math.isfinite
    return (1 <= len(tokens) <= MAX_MODEL_LEN - 1 and all(0 <= t < vocab for t in tokens)
            and finite(args["temperature"]) and args["temperature"] >= 0
            and 0 < args["top_p"] <= 1 and 0 <= args["min_p"] <= 1
            and args["top_k"] >= 0 and args["max_tokens"] >= 1
            and finite(args["repetition_penalty"]) and args["repetition_penalty"] > 0
            and finite(args["presence_penalty"]) and finite(args["frequency_penalty"])
            and -1 <= args["logprobs"] <= 20 and args["n_stop_token_ids"] >= 0)


FLOAT32 = st.one_of(st.floats(width=32), st.sampled_from([0.0, -0.0, 1.0, 1e-45, 2.0]))
INT32 = st.one_of(st.integers(-(2 ** 31), 2 ** 31 - 1), st.integers(-3, 30))
VALID_C_ARGS = {"tokens": [1, 2, 3], "temperature": 0.7, "top_p": 0.9, "min_p": 0.0, "top_k": 0,
                "seed": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "repetition_penalty": 1.0, "max_tokens": 4, "ignore_eos": 0, "logprobs": -1,
                "stop_token_ids": [], "n_stop_token_ids": 0}
# A valid call with any few of its arguments replaced by any value of their C type.
C_ARGS = st.fixed_dictionaries({}, optional={
    "tokens": st.lists(st.integers(-(2 ** 31), 2 ** 31 - 1) | st.integers(0, 600),
                       max_size=MAX_MODEL_LEN + 2),
    "temperature": FLOAT32, "top_p": FLOAT32, "min_p": FLOAT32, "top_k": INT32,
    "seed": st.integers(0, 2 ** 64 - 1), "presence_penalty": FLOAT32,
    "frequency_penalty": FLOAT32, "repetition_penalty": FLOAT32, "max_tokens": INT32,
    "ignore_eos": INT32, "logprobs": INT32,
    "stop_token_ids": st.lists(st.integers(-(2 ** 31), 2 ** 31 - 1), max_size=4),
    "n_stop_token_ids": st.integers(-2, 4),
}).filter(lambda d: len(d) <= 3).map(lambda d: {**VALID_C_ARGS, **d})


@settings(SETTINGS, max_examples=400)
@given(C_ARGS)
def test_c_api_add_request_checks_its_arguments(llm, args):
    from pyengine._native import native
    n = native()
    engine = llm._engine
    c = n.ffi.new("pe_sampling_params*")
    for name in ("temperature", "top_p", "min_p", "top_k", "seed", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "max_tokens", "ignore_eos",
                 "logprobs", "n_stop_token_ids"):
        setattr(c, name, args[name])
    stop_ids = n.ffi.new("int32_t[]", args["stop_token_ids"] or [0])
    c.stop_token_ids = stop_ids
    c.n_stop_token_ids = min(args["n_stop_token_ids"], len(args["stop_token_ids"]))
    args = {**args, **{k: getattr(c, k) for k in ("temperature", "top_p", "min_p",
                                                   "presence_penalty", "frequency_penalty",
                                                   "repetition_penalty", "n_stop_token_ids")}}
    tokens = n.ffi.new("int32_t[]", args["tokens"] or [0])
    rid = n.ffi.new("uint64_t*")
    status = n.lib.pe_engine_add_request(engine.handle, tokens, len(args["tokens"]), c, rid)
    expected = c_accepts(args, llm.config.vocab_size)
    if status == 0:
        n.lib.pe_engine_cancel(engine.handle, rid[0])  # the dispatcher drops its events
    event(f"status {status}")
    assert (status == 0) == expected, (status, n.last_error(), args)
    if status != 0:
        assert status == n.lib.PE_ERR_INVALID_ARGUMENT and n.last_error()


# ---- the routes, in-process ----

def json_values():
    return st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 40), 2 ** 40),
                  st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6)),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                    max_size=3),
        max_leaves=8)


BODY_KEYS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n",
             "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
             "stream", "stream_options", "logprobs", "top_logprobs", "tools", "tool_choice",
             "response_format", "chat_template_kwargs", "reasoning_effort", "echo", "suffix",
             "logit_bias", "best_of", "ignore_eos", "presence_penalty", "repetition_penalty"]
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "x"])},
                                optional={"content": st.one_of(st.text(max_size=8), json_values()),
                                          "name": json_values(),
                                          "tool_calls": json_values()})
OVERRIDES = st.fixed_dictionaries({}, optional={
    **{k: json_values() for k in BODY_KEYS},
    "messages": st.lists(MESSAGE, max_size=3) | json_values(),
    "prompt": st.text(max_size=10) | st.lists(st.integers(0, 600), max_size=4) | json_values(),
    "max_tokens": st.integers(1, 4) | json_values()}).filter(lambda d: len(d) <= 3)


@pytest.fixture(scope="module")
def client(llm):
    from webapp import create_app
    return create_app(llm).test_client()


@settings(SETTINGS, max_examples=200)
@given(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), OVERRIDES)
def test_routes_answer_any_body_with_2xx_or_openai_4xx(client, path, overrides):
    # A valid request with any few of its fields replaced by any JSON value.
    body = {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "max_tokens": 2,
            **overrides}
    resp = client.post(path, data=json.dumps(body), content_type="application/json")
    data = resp.get_data()  # runs a stream to its end
    event(f"http {resp.status_code}")
    assert resp.status_code < 500, (resp.status_code, data[:300])
    if resp.status_code >= 400:
        err = json.loads(data)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
