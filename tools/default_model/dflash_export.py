"""Installs a trained DFlash draft next to the default model: <out>/config.json, model.safetensors
(bf16) and README.md (recipe + the acceptance measured by dflash_train.py, from its result.json).

Checks before writing: the config matches the target (hidden size, vocab, layer ids in range), the
package's weights stay under 50 MB with the draft, and the NumPy reference (dflash_reference.py)
and the torch model give the same block on the target's real features.

  python3 tools/default_model/dflash_export.py --train-out DIR --out pyengine/default_model/dflash
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import dflash_model
import dflash_reference
import dflash_target

PACKAGE_WEIGHTS_LIMIT = 50_000_000
CHECK_TEXT = ("<|im_start|>user\nWrite a Python function that returns the sum of a list.<|im_end|>\n"
              "<|im_start|>assistant\n<think>\n")


def check_config(config: dict, target_config: dict) -> None:
    dflash = config["dflash_config"]
    assert config["architectures"] == ["DFlashDraftModel"], config["architectures"]
    assert config["hidden_size"] == target_config["hidden_size"], "the draft reads the target's embeddings"
    assert config["vocab_size"] == target_config["vocab_size"]
    assert all(0 <= i < target_config["num_hidden_layers"] for i in dflash["target_layer_ids"])
    assert 0 <= dflash["mask_token_id"] < target_config["vocab_size"]


@torch.no_grad()
def check_reference(draft_dir: Path, model_dir: Path) -> float:
    """Max |torch - NumPy| over the block logits for one real prompt (both from the bf16 weights)."""
    from tokenizers import Tokenizer

    target = dflash_target.load(model_dir, torch.device("cpu"))
    draft = dflash_model.load(draft_dir, torch.float64)
    ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(CHECK_TEXT, add_special_tokens=False).ids
    tokens = torch.tensor([ids])
    feats = dflash_target.features(target, tokens[:, :-1], draft.config.target_layer_ids).double()
    embed = target.lm.model.embed_tokens.weight.double()
    s = tokens.shape[1] - 1
    hidden = draft(feats, embed[dflash_model.block_ids(tokens[:, -1], draft.config)],
                   torch.arange(s)[None], torch.arange(s, s + draft.config.block_size)[None])
    ours = (hidden[0, 1:] @ embed.T).numpy()
    config, weights = dflash_reference.load_draft(draft_dir)
    ref, _ = dflash_reference.draft_block(weights, config, feats[0].numpy(), embed.numpy(), embed.numpy(), ids[-1])
    return float(np.abs(ours - ref).max())


CARD = """# DFlash draft of the pyengine default model

A block-diffusion draft (DFlash, MODEL_SPEC.md §6) for speculative decoding of the default model in
the parent directory: one forward proposes `block_size - 1` tokens from the target's hidden states.
It has no embedding or lm_head: it uses the target's.

| field | value |
|---|---|
| layers | {layers} (hidden {hidden}, {heads}/{kv_heads} heads of {head_dim}, MLP {mlp}) |
| block_size | {block_size} |
| target_layer_ids | {layer_ids} (outputs of those decoder layers, before the final norm) |
| mask_token_id | {mask} (`<|endoftext|>`: the default model has no mask token) |

Trained with `tools/default_model/dflash_train.py` on the default model's own replies to prompts
made by the corpus's generators (`dflash_data.py`); recipe and commands in
`tools/default_model/README.md`, section "DFlash draft".
"""

ACCEPTANCE = """
## Acceptance at T = 0 (dflash_eval.py: offline, fp32, held-out prompts)

Trained {trained_s:.0f} s ({steps} steps, {sequences} sequences, {tokens:,} reply tokens) on {device}.

| prompts | sequences | tau (tokens per step) | acceptance of drafts 1..{n_draft}, conditional (%) |
|---|---:|---:|---|
{rows}

tau when only the first n drafts are verified (n = 1..{n_draft}, all prompts): {tau_by_n}
"""


def model_card(config: dict, result: dict | None) -> str:
    d = config["dflash_config"]
    card = CARD.format(layers=config["num_hidden_layers"], hidden=config["hidden_size"],
                       heads=config["num_attention_heads"], kv_heads=config["num_key_value_heads"],
                       head_dim=config["head_dim"], mlp=config["intermediate_size"], block_size=config["block_size"],
                       layer_ids=d["target_layer_ids"], mask=d["mask_token_id"])
    if result is None:
        return card + "\nAcceptance: not measured.\n"
    acc = result["acceptance_T0"]
    rows = "\n".join(f"| {name} | {row['sequences']} | {row['tau']} | "
                     f"{' / '.join(f'{100 * a:.0f}' for a in row['accept_per_position'])} |"
                     for name, row in acc.items())
    return card + ACCEPTANCE.format(trained_s=result["trained_s"], steps=result["steps"],
                                    sequences=result["train_sequences"], tokens=result["train_reply_tokens"],
                                    device=result["device"], n_draft=config["block_size"] - 1, rows=rows,
                                    tau_by_n=acc["all"]["tau_by_n_draft"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-out", type=Path, required=True, help="dflash_train.py's --out (draft/, result.json)")
    ap.add_argument("--model", type=Path, default=REPO / "pyengine" / "default_model")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    draft_dir = args.train_out / "draft"
    config = json.loads((draft_dir / "config.json").read_text())
    check_config(config, json.loads((args.model / "config.json").read_text()))
    diff = check_reference(draft_dir, args.model)
    assert diff < 1e-6, f"torch and the NumPy reference differ by {diff}"
    model_files = [p for p in args.model.iterdir() if p.is_file() and p.suffix == ".safetensors"]
    total = sum(p.stat().st_size for p in model_files) + (draft_dir / "model.safetensors").stat().st_size
    assert total < PACKAGE_WEIGHTS_LIMIT, f"package weights would be {total} bytes"
    result_path = args.train_out / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else None
    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(draft_dir / name, args.out / name)
    (args.out / "README.md").write_text(model_card(config, result))
    print(json.dumps({"out": str(args.out), "reference_max_diff": diff, "package_weight_bytes": total,
                      "draft_bytes": (args.out / "model.safetensors").stat().st_size}))


if __name__ == "__main__":
    sys.exit(main())
