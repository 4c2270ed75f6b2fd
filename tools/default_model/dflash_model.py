"""The DFlash draft (block-diffusion drafter) in PyTorch, in the public checkpoint format
(MODEL_SPEC.md §6; z-lab's dflash/model.py is the reference implementation).

One forward drafts a block at absolute positions s .. s+bs-1:
    C = hidden_norm(fc(concat_l target_layer_output_l))   one context vector per committed token
    h = target.embed([last committed token, MASK x (bs-1)])
    per layer:  x = input_layernorm(h)
                q = q_norm(q_proj(x));  k = k_norm(k_proj([C; x]));  v = v_proj([C; x])
                RoPE (full head_dim, NeoX halves) on q and k at their absolute positions
                h = h + o_proj(softmax(q k^T / sqrt(D) + mask) v)
                h = h + down(silu(gate(post_attention_layernorm(h))) * up(...))
    out = norm(h) -> the target's lm_head; block position j (1 .. bs-1) proposes the token AT s+j.
The context K/V of a layer come from C itself, not from a normed residual stream: C is the same
input for every layer (z-lab computes k_proj(target_hidden) in each layer). No causal mask: a
block sees all context positions before s and its own bs positions both ways.

Norms are Qwen3-style (w * x / rms(x)), NOT the target's (1 + w) offset form. Tensor names are the
checkpoint's: layers.{i}.self_attn.{q,k,v,o}_proj / q_norm / k_norm, layers.{i}.mlp.*,
layers.{i}.{input,post_attention}_layernorm, fc, hidden_norm, norm. No embedding, no lm_head.

target_layer_ids are 0-based decoder-layer indices; the feature of layer l is the residual stream
AFTER decoder layer l, before the final norm (transformers' hidden_states[l + 1]).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DFlashConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int] = field(default_factory=list)
    num_target_layers: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768

    def to_json(self) -> dict:
        """config.json in the public DFlash layout (Qwen3 keys + block_size + dflash_config).
        block_size is written at the top level (z-lab's Qwen3 drafts) and inside dflash_config
        (the newer drafts' place), with the same value."""
        return {
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "torch_dtype": "bfloat16",
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size, "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings, "vocab_size": self.vocab_size,
            "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
            "layer_types": ["full_attention"] * self.num_hidden_layers, "use_sliding_window": False,
            "sliding_window": None, "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "dflash_config": {"block_size": self.block_size, "mask_token_id": self.mask_token_id,
                              "target_layer_ids": list(self.target_layer_ids)},
        }

    @classmethod
    def from_json(cls, d: dict) -> DFlashConfig:
        dflash = d["dflash_config"]
        theta = d.get("rope_theta") or d.get("rope_parameters", {}).get("rope_theta", 10000.0)
        return cls(hidden_size=d["hidden_size"], num_hidden_layers=d["num_hidden_layers"],
                   num_attention_heads=d["num_attention_heads"], num_key_value_heads=d["num_key_value_heads"],
                   head_dim=d["head_dim"], intermediate_size=d["intermediate_size"], vocab_size=d["vocab_size"],
                   block_size=d.get("block_size") or dflash["block_size"], mask_token_id=dflash["mask_token_id"],
                   target_layer_ids=list(dflash["target_layer_ids"]), num_target_layers=d.get("num_target_layers", 0),
                   rms_norm_eps=d["rms_norm_eps"], rope_theta=float(theta),
                   max_position_embeddings=d.get("max_position_embeddings", 32768))


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: w * x * rsqrt(mean(x^2) + eps), normalized in fp32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(_at_least_fp32(x.dtype))
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T] -> cos, sin [B, T, head_dim] (NeoX layout: the D/2 frequencies twice)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim)
    angles = positions.double()[..., None] * inv_freq  # fp64: exact angles at large positions
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D]; cos/sin [B, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    wide = _at_least_fp32(x.dtype)
    return (x.to(wide) * cos[:, None].to(wide) + rotated.to(wide) * sin[:, None].to(wide)).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(*x.shape[:2], n, self.head_dim).transpose(1, 2)

    def forward(self, x, context, rope_q, rope_kv, mask):
        """x [B, Q, H] normed block; context [B, S, H]; mask [B, Q, S+Q] bool (True: attend) or None."""
        kv_in = torch.cat([context, x], dim=1)
        q = apply_rope(self.q_norm(self._heads(self.q_proj(x), self.n_heads)), *rope_q)
        k = apply_rope(self.k_norm(self._heads(self.k_proj(kv_in), self.n_kv_heads)), *rope_kv)
        v = self._heads(self.v_proj(kv_in), self.n_kv_heads)
        groups = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class MLP(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, h, context, rope_q, rope_kv, mask):
        h = h + self.self_attn(self.input_layernorm(h), context, rope_q, rope_kv, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    def __init__(self, config: DFlashConfig, init_std: float = 0.02):
        super().__init__()
        self.config = config
        n_features = len(config.target_layer_ids)
        self.fc = nn.Linear(n_features * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList([Layer(config) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=init_std)

    def context(self, target_features: torch.Tensor) -> torch.Tensor:
        """[B, S, n_features * H] (layer outputs concatenated in target_layer_ids order) -> C [B, S, H]."""
        return self.hidden_norm(self.fc(target_features))

    def forward(self, target_features, block_embeds, context_positions, block_positions, mask=None):
        """Normed block hidden states [B, Q, H]; the caller applies the target's lm_head.

        target_features [B, S, n_features*H]; block_embeds [B, Q, H] (target.embed of the block ids);
        context_positions [B, S], block_positions [B, Q] absolute positions; mask [B, Q, S+Q] bool
        over [context; block] keys, None when every query may see every key (one block whose
        context is exactly the committed prefix)."""
        c, d = self.config, self.config.head_dim
        context = self.context(target_features)
        rope_q = rope_cos_sin(block_positions, d, c.rope_theta)
        rope_kv = rope_cos_sin(torch.cat([context_positions, block_positions], dim=1), d, c.rope_theta)
        h = block_embeds
        for layer in self.layers:
            h = layer(h, context, rope_q, rope_kv, mask)
        return self.norm(h)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in self.state_dict().items()}


def block_ids(last_token: torch.Tensor, config: DFlashConfig) -> torch.Tensor:
    """[B] last committed tokens -> [B, bs] block input ids [token, MASK, ..., MASK]."""
    ids = torch.full((last_token.shape[0], config.block_size), config.mask_token_id, dtype=torch.long,
                     device=last_token.device)
    ids[:, 0] = last_token
    return ids


def blocks_mask(anchors: torch.Tensor, n_context: int, block_size: int) -> torch.Tensor:
    """anchors [B, N] -> [B, N*bs, n_context + N*bs] bool: block i sees context positions < anchor_i
    (what is committed when it is drafted) and its own bs entries both ways, no other block."""
    b, n = anchors.shape
    q_block = torch.arange(n * block_size, device=anchors.device) // block_size
    q_anchor = anchors.repeat_interleave(block_size, dim=1)  # [B, Q]
    ctx = torch.arange(n_context, device=anchors.device)[None, None, :] < q_anchor[:, :, None]
    own = (q_block[:, None] == q_block[None, :]).expand(b, -1, -1)
    return torch.cat([ctx, own], dim=2)


def forward_blocks(draft: DFlashDraft, embed, features: torch.Tensor, ids: torch.Tensor,
                   anchors: torch.Tensor) -> torch.Tensor:
    """Many blocks per sequence in one forward (training, and offline acceptance): the block at
    anchor a is [ids[a], MASK x (bs-1)] at positions a .. a+bs-1 with the features of positions < a
    as its context, exactly as if drafted alone after committing ids[:a+1].
    features [B, T, n*H], ids [B, T], anchors [B, N] (< T) -> normed hidden [B, N, bs, H]."""
    c = draft.config
    b, t = ids.shape
    n = anchors.shape[1]
    blocks = torch.full((b, n, c.block_size), c.mask_token_id, dtype=torch.long, device=ids.device)
    blocks[:, :, 0] = torch.gather(ids, 1, anchors)
    positions = (anchors[:, :, None] + torch.arange(c.block_size, device=ids.device)).reshape(b, -1)
    context_positions = torch.arange(t, device=ids.device).expand(b, -1)
    hidden = draft(features, embed(blocks.reshape(b, -1)), context_positions, positions,
                   blocks_mask(anchors, t, c.block_size))
    return hidden.view(b, n, c.block_size, -1)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save(model: DFlashDraft, out: Path) -> list[Path]:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(dict(sorted(model.checkpoint_tensors().items())), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(model.config.to_json(), indent=2) + "\n")
    return [out / "config.json", out / "model.safetensors"]


def load(directory: Path, dtype=torch.float32) -> DFlashDraft:
    from safetensors.torch import load_file

    config = DFlashConfig.from_json(json.loads((directory / "config.json").read_text()))
    model = DFlashDraft(config)
    model.load_state_dict({k: v.to(dtype) for k, v in load_file(str(directory / "model.safetensors")).items()})
    return model.to(dtype)


