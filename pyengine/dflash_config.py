"""The configuration of a DFlash draft directory, read from its config.json (MODEL_SPEC.md §6).

The public format (z-lab's drafts, SGLang's and vLLM's loaders): `"architectures":
["DFlashDraftModel"]`, Qwen3 keys (hidden_size, num_hidden_layers, num_attention_heads,
num_key_value_heads, head_dim, intermediate_size, rms_norm_eps, rope_theta or
rope_parameters.rope_theta, vocab_size), `block_size` at the top level and / or in
`dflash_config` (dflash_config's wins where both are given, as in SGLang), and `dflash_config:
{mask_token_id, target_layer_ids}`. Fallbacks of the public loaders: no target_layer_ids ->
evenly spread over the target's layers (build_target_layer_ids); no mask_token_id -> the id of
dflash_config.mask_token (default "<|MASK|>") in the target's tokenizer. Layers of `layer_types`
other than full_attention (sliding-window variants) are refused: their mask is not implemented.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from .config import read_json_object
from .errors import CheckpointError

ARCHITECTURE = "DFlashDraftModel"
DEFAULT_MASK_TOKEN = "<|MASK|>"
_DEFAULT_ROPE_THETA = 10_000.0
_DEFAULT_EPS = 1e-6


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The public loaders' default: round(1 + i (L - 4) / (n - 1)), the middle layer for n = 1."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


class _Parser:
    def __init__(self, raw: dict, path: str):
        self.raw, self.path = raw, path

    def fail(self, field: str, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {field}: {problem}")

    def int_field(self, section: dict, name: str, where: str = "", default: int | None = None) -> int:
        value = section.get(name, default)
        if value is None:
            raise self.fail(where + name, "missing")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.fail(where + name, f"must be a non-negative integer, got {value!r}")
        return value

    def float_field(self, name: str, value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise self.fail(name, f"must be a positive number, got {value!r}")
        return float(value)


def parse_draft_config(raw: dict, path: str, target_num_layers: int,
                       mask_token_lookup: Callable[[str], int | None] | None = None) -> DraftConfig:
    """raw: the draft's config.json; target_num_layers: the target's decoder layers;
    mask_token_lookup: token string -> id in the target's tokenizer (for drafts without an id)."""
    p = _Parser(raw, path)
    if raw.get("architectures") != [ARCHITECTURE]:
        raise p.fail("architectures", f"must be [{ARCHITECTURE!r}], got {raw.get('architectures')!r}")
    dflash = raw.get("dflash_config")
    if not isinstance(dflash, dict):
        raise p.fail("dflash_config", "missing or not an object")
    sizes = {name: p.int_field(raw, name) for name in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "vocab_size")}  # fmt: skip
    head_dim = p.int_field(raw, "head_dim", default=sizes["hidden_size"] // max(sizes["num_attention_heads"], 1))
    block = dflash.get("block_size", raw.get("block_size"))
    block_size = p.int_field({"block_size": block}, "block_size", "dflash_config." if "block_size" in dflash else "")
    rope = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    theta = p.float_field("rope_theta", raw.get("rope_theta") or rope.get("rope_theta") or _DEFAULT_ROPE_THETA)
    eps = p.float_field("rms_norm_eps", raw.get("rms_norm_eps", _DEFAULT_EPS))
    layer_types = raw.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != sizes["num_hidden_layers"]:
            raise p.fail("layer_types", f"must list {sizes['num_hidden_layers']} layer kinds, got {layer_types!r}")
        other = sorted({t for t in layer_types if t != "full_attention"})
        if other:
            raise p.fail("layer_types", f"{', '.join(map(str, other))} layers are not supported (full_attention only)")
    layer_ids = dflash.get("target_layer_ids", raw.get("target_layer_ids"))
    if layer_ids is None:
        layer_ids = build_target_layer_ids(target_num_layers, sizes["num_hidden_layers"])
    if not isinstance(layer_ids, list) or not layer_ids or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < target_num_layers for i in layer_ids):
        raise p.fail("dflash_config.target_layer_ids",
                     f"must be a non-empty list of the target's layers 0 .. {target_num_layers - 1}, got {layer_ids!r}")
    mask_id = dflash.get("mask_token_id")
    if mask_id is None:
        token = dflash.get("mask_token", DEFAULT_MASK_TOKEN)
        mask_id = mask_token_lookup(token) if mask_token_lookup else None
        if mask_id is None:
            raise p.fail("dflash_config.mask_token_id", f"missing, and the target's tokenizer has no {token!r}")
    mask_id = p.int_field({"mask_token_id": mask_id}, "mask_token_id", "dflash_config.")
    return DraftConfig(head_dim=head_dim, rms_norm_eps=eps, rope_theta=theta, block_size=block_size,
                       mask_token_id=mask_id, target_layer_ids=tuple(layer_ids), **sizes)


def read_draft_config(draft_dir: str | os.PathLike, target_num_layers: int,
                      mask_token_lookup: Callable[[str], int | None] | None = None) -> DraftConfig:
    path = os.path.join(os.fspath(draft_dir), "config.json")
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: file not found (not a DFlash draft directory)")
    return parse_draft_config(read_json_object(path), path, target_num_layers, mask_token_lookup)
