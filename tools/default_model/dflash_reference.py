"""Plain NumPy (float64) reference of one DFlash draft step, for testing the engine's forward.

No torch: it reads config.json and model.safetensors (F32, F16 or BF16) itself. The math is
MODEL_SPEC.md §6 / dflash_model.py, written out once with no batching, cache or masks:

    draft_block(weights, config, features, embed, lm_head, last_token, start)
      features [S, n*H]: the target's layer outputs (target_layer_ids order) at positions 0..S-1
      start = S: the block sits at positions S .. S+bs-1, its first token is last_token
      -> logits [bs-1, V] for positions S+1 .. S+bs-1, proposals = argmax
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "I64": np.int64}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors as float64 (integer tensors keep their type); BF16 is widened bit-exactly."""
    raw = Path(path).read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len])
    data, out = raw[8 + header_len:], {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=_DTYPES[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr.astype(np.float64) if arr.dtype.kind == "f" else arr.copy()
    return out


def load_draft(directory: Path) -> tuple[dict, dict[str, np.ndarray]]:
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    return config, read_safetensors(directory / "model.safetensors")


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """x [T, heads, D], full-dimension NeoX rotation: pairs (i, i + D/2)."""
    half = x.shape[-1] // 2
    angle = positions[:, None] * theta ** (-np.arange(half) * 2.0 / x.shape[-1])  # [T, D/2]
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def draft_block(w: dict, config: dict, features: np.ndarray, embed: np.ndarray, lm_head: np.ndarray,
                last_token: int, start: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """-> (logits [bs-1, V], proposals [bs-1]) for positions start+1 .. start+bs-1."""
    dflash = config["dflash_config"]
    bs = config.get("block_size") or dflash["block_size"]
    eps, theta = config["rms_norm_eps"], float(config["rope_theta"])
    n_heads, n_kv, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    n_ctx = features.shape[0]
    start = n_ctx if start is None else start
    assert start == n_ctx, "the context is every committed position before the block"

    context = rms_norm(features @ w["fc.weight"].T, w["hidden_norm.weight"], eps)  # [S, H]
    ids = [last_token] + [dflash["mask_token_id"]] * (bs - 1)
    h = embed[ids]  # [bs, H]
    q_pos = np.arange(start, start + bs, dtype=np.float64)
    kv_pos = np.concatenate([np.arange(n_ctx, dtype=np.float64), q_pos])
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        kv_in = np.concatenate([context, x])  # keys/values over [context; block]
        q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(bs, n_heads, d)
        k = (kv_in @ w[p + "self_attn.k_proj.weight"].T).reshape(-1, n_kv, d)
        v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).reshape(-1, n_kv, d)
        q = rope(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), q_pos, theta)
        k = rope(rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), kv_pos, theta)
        out = np.empty((bs, n_heads, d))
        for head in range(n_heads):
            kv_head = head // (n_heads // n_kv)
            scores = q[:, head] @ k[:, kv_head].T / np.sqrt(d)  # [bs, S+bs]: no mask at all
            out[:, head] = softmax(scores) @ v[:, kv_head]
        h = h + out.reshape(bs, n_heads * d) @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    logits = rms_norm(h, w["norm.weight"], eps)[1:] @ lm_head.T
    return logits, logits.argmax(-1)
