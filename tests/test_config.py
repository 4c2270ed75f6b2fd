import copy
import json

import pytest

from pyengine.config import ModelConfig
from pyengine.errors import CheckpointError

# A small text-only config in the shape of the 27B one (3 GDN layers per attention layer).
TEXT_CONFIG = {
    "model_type": "qwen3_5_text",
    "vocab_size": 1000,
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 6,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "mtp_num_hidden_layers": 1,
    "eos_token_id": 999,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
}


def wrapper_of(text_config: dict) -> dict:
    inner = {k: v for k, v in text_config.items() if k != "model_type"}
    inner["model_type"] = "qwen3_5_text"
    return {"model_type": "qwen3_5", "text_config": inner, "vision_config": {"depth": 2}}


def parse(raw: dict, generation: dict | None = None) -> ModelConfig:
    return ModelConfig.from_dict(raw, generation, source="config.json")


def with_changes(**changes) -> dict:
    raw = copy.deepcopy(TEXT_CONFIG)
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


def test_text_layout_fields():
    cfg = parse(TEXT_CONFIG)
    assert cfg.hidden_size == 64 and cfg.num_hidden_layers == 8 and cfg.head_dim == 16
    assert cfg.rope_theta == 1e7 and cfg.partial_rotary_factor == 0.25 and cfg.rotary_dim == 4
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",) + (
        "linear_attention",
    ) * 3 + ("full_attention",)
    assert cfg.layer_type_codes == [0, 0, 0, 1, 0, 0, 0, 1]
    assert cfg.weight_prefix == "model."
    assert cfg.tie_word_embeddings is True and cfg.mtp_num_hidden_layers == 1
    assert cfg.eos_token_ids == (999,)
    assert cfg.quantization is None


def test_wrapper_layout_reads_text_config_and_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(wrapper_of(TEXT_CONFIG)))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [998, 999]}))
    cfg = ModelConfig.from_dir(tmp_path)
    assert cfg.model_type == "qwen3_5"
    assert cfg.weight_prefix == "model.language_model."
    assert cfg.intermediate_size == 128
    assert cfg.eos_token_ids == (999, 998)


def test_wrapper_top_level_tie_word_embeddings_wins():
    raw = wrapper_of(TEXT_CONFIG)
    raw["tie_word_embeddings"] = False
    assert parse(raw).tie_word_embeddings is False


def test_defaults_follow_transformers():
    raw = with_changes(
        rope_parameters=None, head_dim=None, linear_conv_kernel_dim=None, mtp_num_hidden_layers=None
    )
    cfg = parse(raw)
    assert cfg.rope_theta == 10000.0
    assert cfg.partial_rotary_factor == 0.25
    assert (
        cfg.head_dim == 256 and cfg.linear_conv_kernel_dim == 4 and cfg.mtp_num_hidden_layers == 0
    )


def test_rope_values_at_top_level_are_used():
    cfg = parse(with_changes(rope_parameters=None, rope_theta=5e5, partial_rotary_factor=0.5))
    assert cfg.rope_theta == 5e5 and cfg.partial_rotary_factor == 0.5


def test_rope_parameters_win_over_top_level():
    cfg = parse(with_changes(rope_theta=5e5, partial_rotary_factor=0.5))
    assert cfg.rope_theta == 1e7 and cfg.partial_rotary_factor == 0.25


def test_layer_types_from_interval_and_explicit():
    cfg = parse(with_changes(full_attention_interval=2))
    assert cfg.layer_type_codes == [0, 1] * 4
    explicit = ["full_attention"] * 2 + ["linear_attention"] * 6
    assert parse(with_changes(layer_types=explicit)).layer_type_codes == [1, 1] + [0] * 6


def test_fp8_quantization_accepted():
    quant = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    cfg = parse(with_changes(quantization_config=quant))
    assert cfg.quantization["weight_block_size"] == [128, 128]
    assert cfg.quantization["modules_to_not_convert"] == []


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model_type": "qwen3_5_moe"}, "model_type: unsupported value 'qwen3_5_moe'"),
        ({"hidden_size": None}, "hidden_size: missing"),
        ({"hidden_size": 0}, "hidden_size: must be positive"),
        ({"hidden_size": 64.0}, "hidden_size: must be an integer"),
        ({"num_attention_heads": True}, "num_attention_heads: must be an integer"),
        (
            {"num_key_value_heads": 3},
            "num_key_value_heads: 3 does not divide num_attention_heads 4",
        ),
        (
            {"linear_num_value_heads": 5},
            "linear_num_key_heads: 2 does not divide linear_num_value_heads 5",
        ),
        (
            {"rope_parameters": {"partial_rotary_factor": 0.1}},
            "partial_rotary_factor: head_dim 16 x 0.1",
        ),
        ({"rope_parameters": {"partial_rotary_factor": 1.5}}, "must be in (0, 1]"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4}}, "rope_type: only 'default'"),
        ({"rope_parameters": {"rope_theta": float("nan")}}, "rope_theta: must be a finite number"),
        ({"rms_norm_eps": -1}, "rms_norm_eps: must be positive"),
        ({"hidden_act": "gelu"}, "hidden_act: only 'silu'"),
        ({"attn_output_gate": False}, "attn_output_gate: only true"),
        ({"attention_bias": True}, "attention_bias: the engine has no attention biases"),
        (
            {"layer_types": ["full_attention"] * 7},
            "layer_types: has 7 entries but num_hidden_layers is 8",
        ),
        (
            {"layer_types": ["full_attention"] * 7 + ["sliding_attention"]},
            "layer_types[7]: unknown layer type",
        ),
        ({"full_attention_interval": 0}, "full_attention_interval: must be positive"),
        ({"eos_token_id": 1000}, "eos_token_id: 1000 is not a token id below vocab_size 1000"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quant_method: only 'fp8'"),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}},
            "weight_block_size: only [128, 128]",
        ),
        ({"quantization_config": {"quant_method": "fp8"}}, "weight_block_size"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings: must be true or false"),
        ({"mtp_num_hidden_layers": -1}, "mtp_num_hidden_layers: must be >= 0"),
    ],
)
def test_invalid_values_name_the_field(changes, message):
    with pytest.raises(CheckpointError) as info:
        parse(with_changes(**changes))
    assert str(info.value).startswith("config.json: ")
    assert message in str(info.value)


def test_wrapper_errors_give_the_nested_path():
    raw = wrapper_of(with_changes(num_key_value_heads=3))
    with pytest.raises(CheckpointError, match=r"text_config\.num_key_value_heads"):
        parse(raw)
    with pytest.raises(CheckpointError, match="text_config: missing"):
        parse({"model_type": "qwen3_5"})


def test_unreadable_config_file(tmp_path):
    with pytest.raises(CheckpointError, match="config.json: file not found"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: cannot read JSON"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        ModelConfig.from_dir(tmp_path)


def test_generation_config_eos_error_names_that_file():
    with pytest.raises(CheckpointError, match="generation_config.json: eos_token_id"):
        parse(TEXT_CONFIG, {"eos_token_id": [-1]})


def test_27b_shape_of_model_spec():
    text = {
        "model_type": "qwen3_5_text",
        "vocab_size": 248320,
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "intermediate_size": 17408,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "full_attention_interval": 4,
        "attn_output_gate": True,
        "mtp_num_hidden_layers": 1,
        "max_position_embeddings": 262144,
        "eos_token_id": 248044,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
    }
    raw = {"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": False}
    cfg = parse(raw, {"eos_token_id": [248046, 248044]})
    assert cfg.num_full_attention_layers == 16
    assert [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"] == list(
        range(3, 64, 4)
    )
    assert cfg.rotary_dim == 64 and cfg.rope_theta == 1e7
    assert cfg.linear_key_head_dim == 128 and cfg.linear_conv_kernel_dim == 4
    assert cfg.eos_token_ids == (248044, 248046)
    assert not cfg.tie_word_embeddings
