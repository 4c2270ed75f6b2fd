"""The tiny DFlash test draft (tests/data/dflash_text_bf16) and the NumPy reference the engine's
DFlash forward will be tested against (tools/default_model/dflash_reference.py). No torch."""

import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
DRAFT = os.path.join(DATA, "dflash_text_bf16")
sys.path.insert(0, os.path.join(HERE, "..", "tools", "default_model"))

import dflash_reference

LAYER_TENSORS = {"self_attn.q_proj.weight": ("q", "h"), "self_attn.k_proj.weight": ("kv", "h"),
                 "self_attn.v_proj.weight": ("kv", "h"), "self_attn.o_proj.weight": ("h", "q"),
                 "self_attn.q_norm.weight": ("d",), "self_attn.k_norm.weight": ("d",),
                 "mlp.gate_proj.weight": ("i", "h"), "mlp.up_proj.weight": ("i", "h"),
                 "mlp.down_proj.weight": ("h", "i"), "input_layernorm.weight": ("h",),
                 "post_attention_layernorm.weight": ("h",)}


@pytest.fixture(scope="module")
def draft():
    config, weights = dflash_reference.load_draft(DRAFT)
    target = dflash_reference.read_safetensors(os.path.join(DATA, "ckpt_text_bf16", "model.safetensors"))
    return config, weights, target["model.embed_tokens.weight"], np.load(os.path.join(DRAFT, "goldens.npz"))


def test_config_and_tensors_are_in_the_public_format(draft):
    config, weights, embed, _ = draft
    with open(os.path.join(DATA, "ckpt_text_bf16", "config.json")) as f:
        target_config = json.load(f)
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["block_size"] == config["dflash_config"]["block_size"] == 8
    assert config["dflash_config"]["target_layer_ids"] == [1, 4, 7]
    assert config["dflash_config"]["mask_token_id"] == 507  # <|endoftext|> of the test tokenizer
    assert config["hidden_size"] == target_config["hidden_size"] == embed.shape[1]
    size = {"h": config["hidden_size"], "d": config["head_dim"], "i": config["intermediate_size"],
            "q": config["num_attention_heads"] * config["head_dim"],
            "kv": config["num_key_value_heads"] * config["head_dim"]}
    expected = {"fc.weight": (size["h"], 3 * size["h"]), "hidden_norm.weight": (size["h"],),
                "norm.weight": (size["h"],)}
    for i in range(config["num_hidden_layers"]):
        for name, dims in LAYER_TENSORS.items():
            expected[f"layers.{i}.{name}"] = tuple(size[d] for d in dims)
    assert {k: v.shape for k, v in weights.items()} == expected  # no embedding, no lm_head


def test_reference_reproduces_the_goldens_exactly(draft):
    config, weights, embed, g = draft
    ids, features = g["ids"], g["features"].astype(np.float64)
    for s in (1, 7, 40):
        logits, proposals = dflash_reference.draft_block(weights, config, features[:s], embed, embed, int(ids[s]))
        assert logits.shape == (7, 512)
        np.testing.assert_allclose(logits, g[f"logits_{s}"], rtol=0, atol=1e-5)
        np.testing.assert_array_equal(proposals, g[f"proposals_{s}"])


def test_block_depends_on_context_mask_token_and_position(draft):
    """Each input the engine must get right changes the answer: the context length, the last
    token, and the absolute position of the block (RoPE)."""
    config, weights, embed, g = draft
    features = g["features"].astype(np.float64)
    base, _ = dflash_reference.draft_block(weights, config, features[:7], embed, embed, int(g["ids"][7]))
    shorter, _ = dflash_reference.draft_block(weights, config, features[:6], embed, embed, int(g["ids"][7]))
    other_token, _ = dflash_reference.draft_block(weights, config, features[:7], embed, embed, int(g["ids"][7]) + 1)
    moved = dict(config, rope_theta=float(config["rope_theta"]) * 2)
    other_rope, _ = dflash_reference.draft_block(weights, moved, features[:7], embed, embed, int(g["ids"][7]))
    for other in (shorter, other_token, other_rope):
        assert np.abs(other - base).max() > 1e-2


def test_bf16_tensors_widen_bit_exactly(tmp_path):
    values = np.asarray([1.0, -2.5, 3.140625, 0.0], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "t.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bf16.tobytes())
    np.testing.assert_array_equal(dflash_reference.read_safetensors(path)["w"], values)
