"""The frozen target of the DFlash draft: the shipped default model, its layer features, its
embedding and lm_head (the draft has neither)."""

from __future__ import annotations

from pathlib import Path

import torch
from model import DefaultModel

EOS_IDS = (2, 0)  # <|im_end|>, <|endoftext|>: generation_config.json's eos_token_id
PAD_ID = 0


def load(model_dir: Path, device: torch.device, dtype=torch.float32) -> DefaultModel:
    from safetensors.torch import load_file
    from transformers import Qwen3_5TextConfig

    config = Qwen3_5TextConfig.from_json_file(str(model_dir / "config.json"))
    model = DefaultModel(config)
    model.load_checkpoint_tensors({k: v.float() for k, v in load_file(str(model_dir / "model.safetensors")).items()})
    model = model.to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def embed(target: DefaultModel, ids: torch.Tensor) -> torch.Tensor:
    return target.lm.model.embed_tokens(ids)


def lm_head(target: DefaultModel, hidden: torch.Tensor) -> torch.Tensor:
    return target.lm.lm_head(hidden)


@torch.no_grad()
def features(target: DefaultModel, ids: torch.Tensor, layer_ids: list[int],
             attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T] ids -> [B, T, len(layer_ids) * H]: the residual stream after each listed decoder layer
    (before the final norm), concatenated in layer_ids order."""
    inner = target.lm.model
    captured: dict[int, torch.Tensor] = {}

    def hook(index):
        def fn(_module, _inputs, output):
            captured[index] = output[0] if isinstance(output, tuple) else output
        return fn

    handles = [inner.layers[i].register_forward_hook(hook(i)) for i in sorted(set(layer_ids))]
    try:
        inner(input_ids=ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return torch.cat([captured[i] for i in layer_ids], dim=-1)
