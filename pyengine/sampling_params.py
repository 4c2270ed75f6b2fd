"""Per-request sampling settings, validated where they enter (names and defaults as in vLLM).

Values reach the C engine as pe_sampling_params; checking them here, with the field named,
gives HTTP clients a 400 that says what to fix instead of an engine error code.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

MAX_LOGPROBS = 20  # PE_MAX_TOP_LOGPROBS
_INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.401298464324817e-45  # the smallest positive float32 (a subnormal)
_UINT64_LIMIT = 2**64


def _is_int(value: object) -> bool:
    # bool is an int subclass; `true` as a token count is a client bug worth reporting.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1 on input): off
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None  # normalized to list[str] | None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; n: the sampled token's logprob and the top n
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # A grammar the output must follow (structured_outputs.StructuredOutputsParams).
    structured_outputs: object | None = None
    # False: this request decodes one token per step even when the engine speculates.
    speculative: bool = True

    def __post_init__(self) -> None:
        self.max_tokens = _int_in("max_tokens", self.max_tokens, 1, _INT32_MAX)
        self.temperature = _float_in("temperature", self.temperature, 0.0, math.inf)
        self.top_p = _float_in("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if _is_int(self.top_k) and self.top_k == -1:
            self.top_k = 0  # vLLM's and OpenAI-compatible clients' spelling of "off"
        self.top_k = _int_in("top_k", self.top_k, 0, _INT32_MAX, hint=" (0 or -1: off)")
        self.min_p = _float_in("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            self.seed = _int_in("seed", self.seed, 0, _UINT64_LIMIT - 1)
        self.stop = _stop_strings(self.stop)
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, (list, tuple)):
                raise ValueError(
                    f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}"
                )
            self.stop_token_ids = [
                _int_in(f"stop_token_ids[{i}]", t, 0, _INT32_MAX)
                for i, t in enumerate(self.stop_token_ids)
            ]
        if self.logprobs is not None:
            self.logprobs = _int_in("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        # OpenAI's documented range for both penalties.
        self.presence_penalty = _float_in("presence_penalty", self.presence_penalty, -2.0, 2.0)
        self.frequency_penalty = _float_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        self.repetition_penalty = _float_in(
            "repetition_penalty", self.repetition_penalty, 0.0, math.inf, low_open=True
        )
        if self.structured_outputs is not None:
            from .structured_outputs import StructuredOutputsParams

            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise ValueError("structured_outputs must be a StructuredOutputsParams")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "speculative"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def _int_in(name: str, value: object, low: int, high: int, hint: str = "") -> int:
    if not _is_int(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}{hint}, got {value}")
    if value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return value


def _float_in(name: str, value: object, low: float, high: float, low_open: bool = False) -> float:
    """value as a float, checked as the engine will see it, a float32: beyond 3.4e38 is infinite
    there, and a positive value below 1.4e-45 is 0 (so `> 0` means at least that)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if abs(value) > FLOAT32_MAX:
        raise ValueError(f"{name} must be within the float32 range (3.4e38), got {value:g}")
    seen = struct.unpack("f", struct.pack("f", value))[0]
    if low_open and low == 0.0 and 0.0 < value < FLOAT32_TINY:
        raise ValueError(f"{name} must be > 0 (at least {FLOAT32_TINY:.3g}, the smallest "
                         f"float32), got {value:g}")
    if seen < low or (low_open and seen == low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value:g}")
    if seen > high:
        raise ValueError(f"{name} must be <= {high:g}, got {value:g}")
    return value


def _stop_strings(stop: object) -> list[str] | None:
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    for i, s in enumerate(stops):
        if not isinstance(s, str):
            raise ValueError(f"stop[{i}] must be a string, got {s!r}")
        if not s:
            # An empty stop string would match before the first token.
            raise ValueError(f"stop[{i}] must not be empty")
    return list(stops) or None
