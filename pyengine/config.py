"""The text-model configuration of a Qwen3.5 checkpoint, read from its config.json.

Two layouts exist (MODEL_SPEC.md section 1): the text-only `qwen3_5_text` with every field at
the top level, and the released multimodal wrapper `qwen3_5` with the text fields under
`text_config`. Defaults for absent fields follow transformers' Qwen3_5TextConfig, the reference.
Every value the engine relies on is checked here, so that a bad file fails with its name and
the field rather than deep inside the native loader.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from .errors import CheckpointError

# Values of PE_LAYER_* in native/include/pyengine.h.
LAYER_TYPE_CODES = {"linear_attention": 0, "full_attention": 1}
# Older configs of hybrid models used these names; transformers remaps them the same way.
_LEGACY_LAYER_TYPES = {"attention": "full_attention", "mamba": "linear_attention"}

_TEXT_MODEL_TYPE = "qwen3_5_text"
_WRAPPER_MODEL_TYPE = "qwen3_5"
_WEIGHT_PREFIX = {_TEXT_MODEL_TYPE: "model.", _WRAPPER_MODEL_TYPE: "model.language_model."}

# Design decision: these sizes have transformers defaults (a 9B-like shape), but a config.json
# without them is far more likely broken than intentionally default, so they are required.
_REQUIRED_INT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
)
# Qwen3_5TextConfig defaults.
_DEFAULT_INT_FIELDS = {
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 32768,
}
_DEFAULT_RMS_NORM_EPS = 1e-6
_DEFAULT_ROPE_THETA = 10_000.0  # RotaryEmbeddingConfigMixin.default_theta
_DEFAULT_PARTIAL_ROTARY_FACTOR = 0.25  # set in Qwen3_5TextConfig.__post_init__ "for BC"
_DEFAULT_FULL_ATTENTION_INTERVAL = 4


@dataclass(frozen=True)
class ModelConfig:
    """Fields named as in pe_model_config, plus what Python needs to load and serve."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    tie_word_embeddings: bool
    mtp_num_hidden_layers: int
    max_position_embeddings: int
    layer_types: tuple[str, ...]  # "linear_attention" | "full_attention", one per layer
    eos_token_ids: tuple[int, ...]
    model_type: str  # "qwen3_5_text" or "qwen3_5"
    weight_prefix: str  # "model." or "model.language_model."
    hidden_act: str = "silu"
    # None, or the fp8 quantization_config: {"quant_method": "fp8", "fmt": "e4m3",
    # "activation_scheme": "dynamic", "weight_block_size": [128, 128],
    # "modules_to_not_convert": [...]}
    quantization: dict | None = None

    @property
    def layer_type_codes(self) -> list[int]:
        """layer_types as PE_LAYER_* values, the form pe_model_config.layer_types takes."""
        return [LAYER_TYPE_CODES[t] for t in self.layer_types]

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def num_full_attention_layers(self) -> int:
        return sum(t == "full_attention" for t in self.layer_types)

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike) -> ModelConfig:
        """Reads model_dir/config.json and, for extra eos ids, generation_config.json."""
        config_path = os.path.join(os.fspath(model_dir), "config.json")
        raw = read_json_object(config_path)
        generation_path = os.path.join(os.fspath(model_dir), "generation_config.json")
        generation = read_json_object(generation_path) if os.path.exists(generation_path) else {}
        return cls.from_dict(raw, generation, source=config_path)

    @classmethod
    def from_dict(
        cls, raw: dict, generation_config: dict | None = None, source: str = "config.json"
    ) -> ModelConfig:
        return _ConfigParser(raw, generation_config or {}, source).parse()


def read_json_object(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


class _ConfigParser:
    """One parse of one config.json; `source` prefixes every error message."""

    def __init__(self, raw: dict, generation_config: dict, source: str):
        self.raw = raw
        self.generation_config = generation_config
        self.source = source

    def fail(self, field: str, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.source}: {field}: {problem}")

    def parse(self) -> ModelConfig:
        model_type = self.raw.get("model_type")
        if model_type not in _WEIGHT_PREFIX:
            raise self.fail(
                "model_type",
                f"unsupported value {model_type!r} (expected 'qwen3_5_text' or 'qwen3_5')",
            )
        text, text_path = self.text_section(model_type)

        sizes = {
            name: self.int_field(text, text_path + name, name, None)
            for name in _REQUIRED_INT_FIELDS
        }
        for name, default in _DEFAULT_INT_FIELDS.items():
            sizes[name] = self.int_field(text, text_path + name, name, default)
        for name, value in sizes.items():
            if value <= 0:
                raise self.fail(text_path + name, f"must be positive, got {value}")
        mtp_layers = self.int_field(
            text, text_path + "mtp_num_hidden_layers", "mtp_num_hidden_layers", 0
        )
        if mtp_layers < 0:
            raise self.fail(text_path + "mtp_num_hidden_layers", f"must be >= 0, got {mtp_layers}")

        rms_norm_eps = self.float_field(
            text, text_path + "rms_norm_eps", text.get("rms_norm_eps", _DEFAULT_RMS_NORM_EPS)
        )
        if rms_norm_eps <= 0:
            raise self.fail(text_path + "rms_norm_eps", f"must be positive, got {rms_norm_eps}")
        rope_theta, partial_rotary_factor = self.rope(text, text_path)

        hidden_act = text.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise self.fail(
                text_path + "hidden_act", f"only 'silu' is supported, got {hidden_act!r}"
            )
        if text.get("attention_bias", False) not in (False, None):
            raise self.fail(text_path + "attention_bias", "the engine has no attention biases")
        if text.get("attn_output_gate", True) is not True:
            # Qwen3.5 attention always gates its output; q_proj's shape depends on it.
            raise self.fail(
                text_path + "attn_output_gate", "only true (gated attention) is supported"
            )

        self.check_shapes(sizes, partial_rotary_factor, text_path)
        layer_types = self.layer_types(text, text_path, sizes["num_hidden_layers"])
        eos_token_ids = self.eos_token_ids(text, sizes["vocab_size"])
        return ModelConfig(
            **sizes,
            rms_norm_eps=rms_norm_eps,
            rope_theta=rope_theta,
            partial_rotary_factor=partial_rotary_factor,
            tie_word_embeddings=self.tie_word_embeddings(text, text_path),
            mtp_num_hidden_layers=mtp_layers,
            layer_types=layer_types,
            eos_token_ids=eos_token_ids,
            model_type=model_type,
            weight_prefix=_WEIGHT_PREFIX[model_type],
            hidden_act=hidden_act,
            quantization=self.quantization(text),
        )

    def text_section(self, model_type: str) -> tuple[dict, str]:
        if model_type == _TEXT_MODEL_TYPE:
            return self.raw, ""
        text = self.raw.get("text_config")
        if not isinstance(text, dict):
            raise self.fail(
                "text_config", "missing or not an object (required when model_type is 'qwen3_5')"
            )
        inner_type = text.get("model_type", _TEXT_MODEL_TYPE)
        if inner_type != _TEXT_MODEL_TYPE:
            raise self.fail(
                "text_config.model_type", f"expected 'qwen3_5_text', got {inner_type!r}"
            )
        return text, "text_config."

    def int_field(self, section: dict, path: str, name: str, default: int | None) -> int:
        if name not in section or section[name] is None:
            if default is None:
                raise self.fail(path, "missing")
            return default
        value = section[name]
        # bool is an int subclass in Python; `true` is never a size.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be an integer, got {value!r}")
        if value >= 2**31:
            raise self.fail(path, f"{value} does not fit the engine's int32")
        return value

    def float_field(self, section: dict, path: str, value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise self.fail(path, f"must be a finite number, got {value!r}")
        return float(value)

    def rope(self, text: dict, text_path: str) -> tuple[float, float]:
        # transformers gives rope_parameters priority over the legacy top-level keys.
        params = text.get("rope_parameters")
        params_key = "rope_parameters"
        if params is None:
            params, params_key = text.get("rope_scaling"), "rope_scaling"
        params = {} if params is None else params
        if not isinstance(params, dict):
            raise self.fail(text_path + params_key, f"must be an object, got {params!r}")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            # mrope_section only changes image/video positions; scaled RoPE variants are not built.
            raise self.fail(
                text_path + params_key + ".rope_type",
                f"only 'default' is supported, got {rope_type!r}",
            )

        def pick(name: str, default: float) -> float:
            if name in params:
                return self.float_field(params, f"{text_path}{params_key}.{name}", params[name])
            if name in text:
                return self.float_field(text, text_path + name, text[name])
            return default

        rope_theta = pick("rope_theta", _DEFAULT_ROPE_THETA)
        if rope_theta <= 0:
            raise self.fail(text_path + "rope_theta", f"must be positive, got {rope_theta}")
        factor = pick("partial_rotary_factor", _DEFAULT_PARTIAL_ROTARY_FACTOR)
        if not 0 < factor <= 1:
            raise self.fail(text_path + "partial_rotary_factor", f"must be in (0, 1], got {factor}")
        return rope_theta, factor

    def check_shapes(self, sizes: dict, partial_rotary_factor: float, text_path: str) -> None:
        if sizes["num_attention_heads"] % sizes["num_key_value_heads"]:
            raise self.fail(
                text_path + "num_key_value_heads",
                f"{sizes['num_key_value_heads']} does not divide num_attention_heads "
                f"{sizes['num_attention_heads']}",
            )
        if sizes["linear_num_value_heads"] % sizes["linear_num_key_heads"]:
            raise self.fail(
                text_path + "linear_num_key_heads",
                f"{sizes['linear_num_key_heads']} does not divide linear_num_value_heads "
                f"{sizes['linear_num_value_heads']}",
            )
        rotary = sizes["head_dim"] * partial_rotary_factor
        # NeoX RoPE rotates two halves of the rotary part, so it must be a positive even integer.
        if rotary != int(rotary) or int(rotary) <= 0 or int(rotary) % 2:
            raise self.fail(
                text_path + "partial_rotary_factor",
                f"head_dim {sizes['head_dim']} x {partial_rotary_factor} = {rotary} rotary dims; "
                "must be a positive even integer",
            )

    def layer_types(self, text: dict, text_path: str, num_layers: int) -> tuple[str, ...]:
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = self.int_field(
                text,
                text_path + "full_attention_interval",
                "full_attention_interval",
                _DEFAULT_FULL_ATTENTION_INTERVAL,
            )
            if interval <= 0:
                raise self.fail(
                    text_path + "full_attention_interval", f"must be positive, got {interval}"
                )
            return tuple(
                "full_attention" if (i + 1) % interval == 0 else "linear_attention"
                for i in range(num_layers)
            )
        if not isinstance(layer_types, list):
            raise self.fail(text_path + "layer_types", f"must be a list, got {layer_types!r}")
        if len(layer_types) != num_layers:
            raise self.fail(
                text_path + "layer_types",
                f"has {len(layer_types)} entries but num_hidden_layers is {num_layers}",
            )
        result = []
        for i, layer_type in enumerate(layer_types):
            layer_type = _LEGACY_LAYER_TYPES.get(layer_type, layer_type)
            if layer_type not in LAYER_TYPE_CODES:
                raise self.fail(
                    f"{text_path}layer_types[{i}]",
                    f"unknown layer type {layer_type!r} "
                    "(expected 'linear_attention' or 'full_attention')",
                )
            result.append(layer_type)
        return tuple(result)

    def tie_word_embeddings(self, text: dict, text_path: str) -> bool:
        # The wrapper model's own flag is what transformers uses when it loads the wrapper;
        # fall back to text_config's when the wrapper does not say.
        if "tie_word_embeddings" in self.raw:
            section, path = self.raw, "tie_word_embeddings"
        else:
            section, path = text, text_path + "tie_word_embeddings"
        value = section.get("tie_word_embeddings", False)
        if not isinstance(value, bool):
            raise self.fail(path, f"must be true or false, got {value!r}")
        return value

    def eos_token_ids(self, text: dict, vocab_size: int) -> tuple[int, ...]:
        # generation_config.json usually lists more ids (e.g. <|im_end|> and <|endoftext|>);
        # any of them ends a request, so take the union, config.json's first.
        ids: list[int] = []
        sources = (
            (text, self.source, "eos_token_id"),
            (self.raw, self.source, "eos_token_id"),
            (self.generation_config, "generation_config.json", "eos_token_id"),
        )
        for section, file_name, key in sources:
            value = section.get(key)
            values = value if isinstance(value, list) else [] if value is None else [value]
            for eos in values:
                if isinstance(eos, bool) or not isinstance(eos, int) or not 0 <= eos < vocab_size:
                    raise CheckpointError(
                        f"{file_name}: {key}: {eos!r} is not a token id below "
                        f"vocab_size {vocab_size}"
                    )
                if eos not in ids:
                    ids.append(eos)
        return tuple(ids)

    def quantization(self, text: dict) -> dict | None:
        quant = self.raw.get("quantization_config", text.get("quantization_config"))
        if quant is None:
            return None
        field = "quantization_config"
        if not isinstance(quant, dict):
            raise self.fail(field, f"must be an object, got {quant!r}")
        method = quant.get("quant_method")
        if method != "fp8":
            raise self.fail(field + ".quant_method", f"only 'fp8' is supported, got {method!r}")
        fmt = quant.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise self.fail(field + ".fmt", f"only 'e4m3' is supported, got {fmt!r}")
        scheme = quant.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise self.fail(
                field + ".activation_scheme", f"only 'dynamic' is supported, got {scheme!r}"
            )
        block = quant.get("weight_block_size")
        if block != [128, 128]:
            raise self.fail(
                field + ".weight_block_size",
                f"only [128, 128] blocks are supported, got {block!r} "
                "(per-tensor fp8 is not either)",
            )
        skipped = quant.get("modules_to_not_convert") or []
        if not isinstance(skipped, list) or not all(isinstance(m, str) for m in skipped):
            raise self.fail(
                field + ".modules_to_not_convert", f"must be a list of names, got {skipped!r}"
            )
        return {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": list(skipped),
        }
