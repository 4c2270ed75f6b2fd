"""The engine's DFlash draft (native/src/model/dflash*.cpp through pyengine.dflash) on the CPU,
against the NumPy reference's goldens (tests/data/dflash_text_bf16/goldens.npz, made by
tools/default_model/dflash_reference.py) for the target tests/data/ckpt_text_bf16. No torch.

Bounds: the fp32 engine vs the float64 reference measured 1.1e-5 max abs on logits of size ~15
(draft alone, from the goldens' features) and 5.6e-5 end to end (the engine's own target features,
which differ from transformers' by 5.8e-5); the bounds are a few times that.
"""

import json
import os
import shutil
import sys
import types

import numpy as np
import pytest

from pyengine.checkpoint import CheckpointReader
from pyengine.config import ModelConfig
from pyengine.dflash import DFlashDraft
from pyengine.dflash_config import build_target_layer_ids
from pyengine.errors import CheckpointError
from pyengine.model_loader import NativeModel
from pyengine.tokenizer import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
TARGET = os.path.join(DATA, "ckpt_text_bf16")
DRAFT = os.path.join(DATA, "dflash_text_bf16")
CONTEXTS = (1, 7, 40)
sys.path.insert(0, os.path.join(HERE, "..", "tools", "default_model"))

import dflash_reference

ATOL_DRAFT = 5e-5  # draft alone, the reference's features
ATOL_END_TO_END = 3e-4  # the engine's target features too
ATOL_FEATURES = 3e-4  # target layer outputs vs transformers (size ~8)
# ||draft_quant - reference|| / ||reference|| over the block logits: about twice the measured
# (int8 0.027, fp8 0.11, nvfp4 0.28: a random draft amplifies weight rounding; fp8's 128x128
# blocks give these tiny matrices one scale each).
QUANT_REL = {"int8": 0.06, "fp8": 0.25, "nvfp4": 0.6}


@pytest.fixture(scope="module")
def target():
    model = NativeModel(TARGET, ModelConfig.from_dir(TARGET), "cpu")
    yield model
    model.close()


@pytest.fixture(scope="module")
def draft(target):
    d = DFlashDraft(DRAFT, target)
    yield d
    d.close()


@pytest.fixture(scope="module")
def g():
    return np.load(os.path.join(DRAFT, "goldens.npz"))


def test_config_is_read_from_the_public_format(draft):
    c = draft.config
    assert (c.block_size, c.mask_token_id, c.target_layer_ids) == (8, 507, (1, 4, 7))
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (64, 2, 4, 2, 16)
    assert c.rope_theta == 1e4 and c.rms_norm_eps == 1e-6


def test_default_target_layer_ids_are_the_public_loaders():
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]  # MODEL_SPEC §6, the 27B drafts
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(8, 1) == [4]


@pytest.mark.parametrize("s", CONTEXTS)
def test_draft_matches_the_reference_from_its_features(draft, g, s):
    logits = draft.block_logits(g["ids"][: s + 1], context_ends=[s], features=g["features"][:s])
    assert logits.shape == (1, 7, 512)
    np.testing.assert_allclose(logits[0], g[f"logits_{s}"], rtol=0, atol=ATOL_DRAFT)
    np.testing.assert_array_equal(logits[0].argmax(-1), g[f"proposals_{s}"])


def test_reference_agrees_on_other_inputs(draft, g, target):
    """Inputs the goldens do not cover: another last token and an all-mask block start, against
    dflash_reference.draft_block computed here (with the target's bf16 embedding)."""
    config, weights = dflash_reference.load_draft(DRAFT)
    embed = dflash_reference.read_safetensors(os.path.join(TARGET, "model.safetensors"))["model.embed_tokens.weight"]
    features = g["features"][:23].astype(np.float64)
    for token in (3, 507, 511):
        ref, _ = dflash_reference.draft_block(weights, config, features, embed, embed, token)
        ids = np.concatenate([g["ids"][:23], [token]])
        ours = draft.block_logits(ids, context_ends=[23], features=g["features"][:23])[0]
        np.testing.assert_allclose(ours, ref, rtol=0, atol=ATOL_DRAFT)


def test_context_in_pieces_equals_one_call(draft, g):
    """The draft's KV cache filled over several steps (as the engine appends accepted tokens),
    including a step that appends nothing, gives each block what one call over its whole context
    gives."""
    features = g["features"][:40]
    ends = [1, 7, 7, 19, 40]
    pieces = draft.block_logits(g["ids"], context_ends=ends, features=features)
    for b, s in enumerate(ends):
        whole = draft.block_logits(g["ids"][: s + 1], context_ends=[s], features=features[:s])[0]
        np.testing.assert_allclose(pieces[b], whole, rtol=0, atol=2e-5)
    for b, s in ((0, 1), (2, 7), (4, 40)):
        np.testing.assert_allclose(pieces[b], g[f"logits_{s}"], rtol=0, atol=ATOL_DRAFT)


def test_block_attends_to_the_whole_context(draft, g):
    """Dropping the oldest context row changes the block (the cache is read from position 0)."""
    full = draft.block_logits(g["ids"][:41], context_ends=[40], features=g["features"][:40])[0]
    shifted = draft.block_logits(g["ids"][1:41], context_ends=[39], features=g["features"][1:40])[0]
    assert np.abs(full - shifted).max() > 1e-2


def test_target_features_match_transformers(draft, g):
    features = draft.target_features(g["ids"][:40])
    assert features.shape == (40, 3 * 64)
    np.testing.assert_allclose(features, g["features"][:40], rtol=0, atol=ATOL_FEATURES)


def test_end_to_end_from_tokens(draft, g):
    """The target computes the features itself (pe_model_layer_features' path in one call)."""
    logits = draft.block_logits(g["ids"], context_ends=list(CONTEXTS))
    for b, s in enumerate(CONTEXTS):
        np.testing.assert_allclose(logits[b], g[f"logits_{s}"], rtol=0, atol=ATOL_END_TO_END)
        np.testing.assert_array_equal(logits[b].argmax(-1), g[f"proposals_{s}"])
    np.testing.assert_allclose(draft.propose_logits(g["ids"][:8]), g["logits_7"], rtol=0, atol=ATOL_END_TO_END)
    assert draft.propose(g["ids"][:41]) == [int(t) for t in g["proposals_40"]]


def test_kv_cache_dtypes(draft, g):
    ref = draft.block_logits(g["ids"], context_ends=list(CONTEXTS), features=g["features"][:40])
    for kv, bound in (("fp16", 0.03), ("bf16", 0.1), ("int8", 0.5)):  # 3x the measured
        got = draft.block_logits(g["ids"], context_ends=list(CONTEXTS), features=g["features"][:40], kv_cache_dtype=kv)
        err = np.abs(got - ref).max()
        assert 0 < err < bound, (kv, err)


@pytest.mark.parametrize("quant", sorted(QUANT_REL))
def test_quantized_draft(target, g, quant, draft):
    q = DFlashDraft(DRAFT, target, draft_quant=quant)
    try:
        assert q.weight_bytes() < 0.6 * draft.weight_bytes()
        logits = q.block_logits(g["ids"], context_ends=list(CONTEXTS), features=g["features"][:40])
        for b, s in enumerate(CONTEXTS):
            ref = g[f"logits_{s}"]
            rel = np.linalg.norm(logits[b] - ref) / np.linalg.norm(ref)
            print(f"{quant} context {s}: rel {rel:.3g}, max abs {np.abs(logits[b] - ref).max():.3g}")
            assert 1e-4 < rel < QUANT_REL[quant], (quant, s, rel)
    finally:
        q.close()


def test_mask_token_from_the_targets_tokenizer(tmp_path, target, g):
    """A draft without mask_token_id names its mask token; the id comes from the target's tokenizer."""
    d = _copy_draft(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["dflash_config"]["mask_token_id"]
    cfg["dflash_config"]["mask_token"] = "<|endoftext|>"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="mask_token_id"):
        DFlashDraft(d, target)  # a bare model has no tokenizer
    llm_like = types.SimpleNamespace(_model=target, tokenizer=Tokenizer(TARGET))
    draft = DFlashDraft(d, llm_like)
    assert draft.config.mask_token_id == 507
    logits = draft.block_logits(g["ids"][:8], context_ends=[7], features=g["features"][:7])
    np.testing.assert_allclose(logits[0], g["logits_7"], rtol=0, atol=ATOL_DRAFT)


# ---- Malformed draft directories: clear errors naming the file and the field or tensor ----


def _copy_draft(tmp_path, drop=(), reshape=None):
    """The test draft as F32 safetensors (values exact), without the tensors in drop."""
    from safetensors.numpy import save_file

    out = tmp_path / "draft"
    out.mkdir()
    shutil.copy(os.path.join(DRAFT, "config.json"), out / "config.json")
    tensors = {k: v.astype(np.float32) for k, v in dflash_reference.read_safetensors(os.path.join(DRAFT, "model.safetensors")).items()
               if k not in drop}  # fmt: skip
    if reshape:
        name, shape = reshape
        tensors[name] = np.zeros(shape, dtype=np.float32)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if key.startswith("dflash_"):
            cfg["dflash_config"][key[len("dflash_"):]] = value
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))


def test_f32_copy_gives_the_same_logits(tmp_path, target, draft, g):
    copy = DFlashDraft(_copy_draft(tmp_path), target)
    a = copy.block_logits(g["ids"][:8], context_ends=[7], features=g["features"][:7])
    b = draft.block_logits(g["ids"][:8], context_ends=[7], features=g["features"][:7])
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)  # the F32 and BF16 matmuls sum in other orders


def test_missing_tensor_is_named(tmp_path, target):
    path = _copy_draft(tmp_path, drop=("layers.1.self_attn.k_norm.weight",))
    with pytest.raises(CheckpointError, match=r"layers\.1\.self_attn\.k_norm\.weight is missing"):
        DFlashDraft(path, target)


def test_misshaped_tensor_is_named(tmp_path, target):
    path = _copy_draft(tmp_path, reshape=("fc.weight", (64, 128)))
    with pytest.raises(CheckpointError, match=r"fc\.weight: shape \[64, 128\], expected \[64, 192\]"):
        DFlashDraft(path, target)


def test_unknown_tensor_is_named(tmp_path, target):
    path = _copy_draft(tmp_path, reshape=("embed_tokens.weight", (512, 64)))
    with pytest.raises(Exception, match=r"embed_tokens\.weight: not a tensor of this model"):
        DFlashDraft(path, target)


@pytest.mark.parametrize("changes, message", [
    ({"architectures": ["Qwen3ForCausalLM"]}, "architectures"),
    ({"hidden_size": 96}, "hidden_size 96 differs from the target's 64"),
    ({"vocab_size": 600}, "vocab_size 600 differs"),
    ({"dflash_target_layer_ids": [1, 4, 8]}, "target_layer_ids"),
    ({"dflash_mask_token_id": 512}, "mask_token_id 512 outside the vocabulary"),
    ({"dflash_block_size": 1}, "block_size must be in 2 .. 64"),
    ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding_attention layers are not supported"),
    ({"head_dim": "16"}, "head_dim"),
])  # fmt: skip
def test_bad_config_is_named(tmp_path, target, changes, message):
    path = _copy_draft(tmp_path)
    _edit_config(path, **changes)
    with pytest.raises(CheckpointError, match=message) as e:
        DFlashDraft(path, target)
    assert "config.json" in str(e.value)


def test_not_a_draft_directory(tmp_path, target):
    with pytest.raises(CheckpointError, match="config.json: file not found"):
        DFlashDraft(tmp_path, target)
    shutil.copy(os.path.join(DRAFT, "config.json"), tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        DFlashDraft(tmp_path, target)


def test_bad_calls(draft, g):
    with pytest.raises(ValueError, match="non-decreasing"):
        draft.block_logits(g["ids"][:10], context_ends=[5, 3])
    with pytest.raises(ValueError, match="< 10"):
        draft.block_logits(g["ids"][:10], context_ends=[10])
    with pytest.raises(ValueError, match="features must have shape"):
        draft.block_logits(g["ids"][:10], context_ends=[5], features=g["features"][:4])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        draft.block_logits([1, 2, 9999], context_ends=[2])
    with CheckpointReader(DRAFT) as reader:  # the draft's tensors have no prefix to strip
        assert "fc.weight" in reader and "layers.0.mlp.down_proj.weight" in reader
