#!/usr/bin/env python3
"""A tiny random DFlash draft for tests/data/ckpt_text_bf16, with goldens for the engine's tests.

    python tools/make_dflash_test_checkpoint.py --data tests/data

Writes <data>/dflash_text_bf16/: config.json, model.safetensors (bf16), goldens.npz, meta.json
(tests/data/README.md describes them). The target's layer features come from transformers
(fp32, eager, the checkpoint's bf16 weights); the draft's block logits from the NumPy float64
reference (tools/default_model/dflash_reference.py), cross-checked against the torch model
(tools/default_model/dflash_model.py). Needs torch 2.13 and transformers 5.17; fixed seed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_model"))

import dflash_model
import dflash_reference

SEED = 1234
TARGET = "ckpt_text_bf16"
NAME = "dflash_text_bf16"
CONTEXTS = (1, 7, 40)  # contexts = prefixes of one 41-token sequence; the block token is ids[S]
# Layers 1, 4 and the last one (7): the last layer's feature is its output BEFORE the final norm.
CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "intermediate_size": 48, "block_size": 8, "target_layer_ids": [1, 4, 7], "rope_theta": 10000.0}


def random_draft(target_config: dict, mask_token_id: int) -> dflash_model.DFlashDraft:
    """Weights large enough that attention is far from uniform; norm weights around 1 (not 0), so
    an engine that used the target's (1 + w) norm form would fail the goldens."""
    config = dflash_model.DFlashConfig(hidden_size=target_config["hidden_size"], vocab_size=target_config["vocab_size"],
                                       mask_token_id=mask_token_id, num_target_layers=target_config["num_hidden_layers"],
                                       rms_norm_eps=target_config["rms_norm_eps"], **CONFIG)
    torch.manual_seed(SEED)
    draft = dflash_model.DFlashDraft(config, init_std=0.15)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    return draft


@torch.no_grad()
def target_features(target_dir: Path, ids: list[int], layer_ids: list[int]) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, attn_implementation="eager").eval()
    out = lm(torch.tensor([ids]), output_hidden_states=True)
    captured = {}
    hooks = [lm.model.layers[i].register_forward_hook(
        lambda _m, _i, o, i=i: captured.__setitem__(i, o[0] if isinstance(o, tuple) else o)) for i in layer_ids]
    lm(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    # transformers' hidden_states[i + 1] is layer i's output for inner layers (a cross-check of the hooks)
    assert torch.allclose(captured[layer_ids[0]], out.hidden_states[layer_ids[0] + 1])
    return torch.cat([captured[i] for i in layer_ids], dim=-1)[0].numpy()


def make_goldens(target_dir: Path, config: dict, weights: dict, torch_draft, embed: np.ndarray, seed: int):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config["vocab_size"] - 5, size=max(CONTEXTS) + 1).tolist()
    features = target_features(target_dir, ids, CONFIG["target_layer_ids"])
    goldens = {"ids": np.asarray(ids, dtype=np.int32), "features": features.astype(np.float32)}
    checks = {}
    for s in CONTEXTS:
        logits, proposals = dflash_reference.draft_block(weights, config, features[:s].astype(np.float64), embed,
                                                         embed, ids[s])
        goldens[f"logits_{s}"], goldens[f"proposals_{s}"] = logits.astype(np.float32), proposals.astype(np.int32)
        top2 = np.sort(logits, axis=-1)[:, -2:]
        checks[f"min_top1_top2_margin_{s}"] = round(float((top2[:, 1] - top2[:, 0]).min()), 4)
        block = torch.from_numpy(embed)[dflash_model.block_ids(torch.tensor([ids[s]]), torch_draft.config)]
        with torch.no_grad():
            hidden = torch_draft(torch.from_numpy(features[:s]).double()[None], block, torch.arange(s)[None],
                                 torch.arange(s, s + CONFIG["block_size"])[None])
        checks[f"torch_vs_numpy_{s}"] = float(np.abs((hidden[0, 1:] @ torch.from_numpy(embed).T).numpy() - logits).max())
    return goldens, checks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("tests/data"))
    args = ap.parse_args()
    target_dir, out = args.data / TARGET, args.data / NAME
    target_config = json.loads((target_dir / "config.json").read_text())
    tokenizer = json.loads((target_dir / "tokenizer.json").read_text())
    mask_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "<|endoftext|>")
    draft = random_draft(target_config, mask_id)
    dflash_model.save(draft, out)

    embed = dflash_reference.read_safetensors(target_dir / "model.safetensors")["model.embed_tokens.weight"]
    config, weights = dflash_reference.load_draft(out)
    torch_draft = dflash_model.load(out, torch.float64)
    for attempt in range(20):  # the first sequence whose proposals are clear (engine tolerance ~2e-3)
        goldens, checks = make_goldens(target_dir, config, weights, torch_draft, embed, SEED + attempt)
        if min(v for k, v in checks.items() if k.startswith("min_top1")) >= 0.05:
            break
    checks["ids_seed"] = SEED + attempt
    np.savez_compressed(out / "goldens.npz", **goldens)
    meta = {"seed": SEED, "target": TARGET, "contexts": list(CONTEXTS), "mask_token": "<|endoftext|>",
            "checks": checks, "torch": torch.__version__}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print(json.dumps({"out": str(out), "bytes": sizes, "total": sum(sizes.values()), "checks": checks}, indent=1))


if __name__ == "__main__":
    main()
