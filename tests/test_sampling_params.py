import math

import pytest

from pyengine.sampling_params import SamplingParams


def test_defaults():
    params = SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.min_p) == (
        16,
        1.0,
        1.0,
        0,
        0.0,
    )
    assert params.seed is None and params.stop is None and params.stop_token_ids is None
    assert params.logprobs is None and params.repetition_penalty == 1.0
    assert params.skip_special_tokens is True and params.include_stop_str_in_output is False
    assert not params.is_greedy and SamplingParams(temperature=0).is_greedy


def test_normalization():
    params = SamplingParams(
        top_k=-1, stop="###", temperature=1, stop_token_ids=(5, 6), seed=2**64 - 1
    )
    assert params.top_k == 0
    assert params.stop == ["###"]
    assert params.stop_token_ids == [5, 6]
    assert isinstance(params.temperature, float)
    assert SamplingParams(stop=[]).stop is None
    assert SamplingParams(logprobs=0).logprobs == 0 and SamplingParams(logprobs=20).logprobs == 20


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"max_tokens": 2**31}, "max_tokens must be <= 2147483647"),
        ({"max_tokens": True}, "max_tokens must be an integer, got True"),
        ({"max_tokens": 4.0}, "max_tokens must be an integer, got 4.0"),
        ({"max_tokens": "8"}, "max_tokens must be an integer, got '8'"),
        ({"temperature": -0.1}, "temperature must be >= 0, got -0.1"),
        ({"temperature": math.nan}, "temperature must be finite, got nan"),
        ({"temperature": math.inf}, "temperature must be finite, got inf"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"temperature": False}, "temperature must be a number"),
        ({"top_p": 0}, "top_p must be > 0, got 0"),
        ({"top_p": 1.01}, "top_p must be <= 1, got 1.01"),
        ({"top_k": -2}, "top_k must be >= 0 (0 or -1: off), got -2"),
        ({"top_k": 1.5}, "top_k must be an integer"),
        ({"min_p": 1.5}, "min_p must be <= 1"),
        ({"min_p": -0.5}, "min_p must be >= 0"),
        ({"seed": -1}, "seed must be >= 0, got -1"),
        ({"seed": 2**64}, "seed must be <= 18446744073709551615"),
        ({"seed": "1"}, "seed must be an integer"),
        ({"stop": 3}, "stop must be a string or a list of strings"),
        ({"stop": ["a", 3]}, "stop[1] must be a string"),
        ({"stop": ["a", ""]}, "stop[1] must not be empty"),
        ({"stop_token_ids": 5}, "stop_token_ids must be a list"),
        ({"stop_token_ids": [1, -1]}, "stop_token_ids[1] must be >= 0"),
        ({"stop_token_ids": [True]}, "stop_token_ids[0] must be an integer"),
        ({"logprobs": 21}, "logprobs must be <= 20, got 21"),
        ({"logprobs": -1}, "logprobs must be >= 0"),
        ({"presence_penalty": 2.5}, "presence_penalty must be <= 2"),
        ({"frequency_penalty": -3}, "frequency_penalty must be >= -2"),
        ({"repetition_penalty": 0}, "repetition_penalty must be > 0"),
        ({"repetition_penalty": math.inf}, "repetition_penalty must be finite"),
        ({"ignore_eos": 1}, "ignore_eos must be true or false, got 1"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens must be true or false"),
        ({"include_stop_str_in_output": None}, "include_stop_str_in_output must be true or false"),
    ],
)
def test_invalid_values_name_the_field(kwargs, message):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert message in str(info.value)
