"""Acceptance of a DFlash draft at T = 0, simulated offline in PyTorch.

Given the target's own greedy reply y to a prompt (gen.npz's eval split, generated in fp32),
speculative decoding at T = 0 reproduces y, and its steps are determined:
  prefill commits y[P] (P = prompt length); a step at `start` drafts the block
  [y[start], MASK ...] with the target's features of positions < start as context; draft k
  (k = 1 .. n_draft) is accepted while every earlier one was and it equals y[start+k]; the step
  commits the accepted drafts plus the target's bonus token, so start += accepted + 1.
The features of positions < start are the same whether the target computed them during earlier
verify steps or in one forward over y (causal model), so one target forward and one parallel
draft forward with an anchor at every position (dflash_model.forward_blocks) give every step's
proposals; the walk over them is exact. Near the end of y a step commits at most what is left.

Reported: tau = tokens committed per step (mean accepted length incl. the bonus token), per source
and overall; per-position conditional acceptance P(draft k ok | drafts 1..k-1 ok); tau when only
the first n drafts of each block are used (n = 1 .. bs-1: a shorter verify).

  python3 tools/default_model/dflash_eval.py --draft DIR --data DIR_WITH_gen.npz [--model pyengine/default_model]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import dflash_model
import dflash_target
from dflash_data import unpack


@torch.no_grad()
def proposals(draft, target, seq: np.ndarray, prompt_len: int, device, chunk: int = 128) -> np.ndarray:
    """[T] tokens -> [T, bs-1] argmax drafts of the block anchored at each position >= prompt_len
    (rows before prompt_len are unused)."""
    c = draft.config
    ids = torch.from_numpy(seq).to(device)[None]
    feats = dflash_target.features(target, ids, c.target_layer_ids)
    out = np.zeros((len(seq), c.block_size - 1), dtype=np.int64)
    embed = lambda x: dflash_target.embed(target, x)
    for a0 in range(prompt_len, len(seq) - 1, chunk):
        anchors = torch.arange(a0, min(a0 + chunk, len(seq) - 1), device=device)[None]
        hidden = dflash_model.forward_blocks(draft, embed, feats, ids, anchors)[0, :, 1:]
        out[anchors[0].cpu().numpy()] = dflash_target.lm_head(target, hidden).argmax(-1).cpu().numpy()
    return out


def walk(seq: np.ndarray, prompt_len: int, props: np.ndarray, n_draft: int):
    """-> (steps, tokens committed by steps, attempts[k], accepts[k]) for drafts 1..n_draft."""
    attempts, accepts = np.zeros(n_draft, np.int64), np.zeros(n_draft, np.int64)
    start, steps, committed, last = prompt_len, 0, 0, len(seq) - 1
    while start < last:
        left = last - start
        accepted = 0
        for k in range(1, min(n_draft, left) + 1):
            attempts[k - 1] += 1
            if props[start, k - 1] != seq[start + k]:
                break
            accepts[k - 1] += 1
            accepted += 1
        new = min(accepted + 1, left)
        steps, committed, start = steps + 1, committed + new, start + new
    return steps, committed, attempts, accepts


def acceptance(draft, target, sequences, prompt_lens, sources, source_names, device) -> dict:
    n_draft = draft.config.block_size - 1
    per_source: dict = {}
    for seq, p, s in zip(sequences, prompt_lens, sources):
        if len(seq) - p < 2:
            continue
        props = proposals(draft, target, seq, int(p), device)
        acc = per_source.setdefault(source_names[s], {"sequences": 0, "steps": np.zeros(n_draft, np.int64),
                                                      "committed": np.zeros(n_draft, np.int64),
                                                      "attempts": np.zeros(n_draft, np.int64),
                                                      "accepts": np.zeros(n_draft, np.int64)})
        acc["sequences"] += 1
        for n in range(1, n_draft + 1):
            steps, committed, attempts, accepts = walk(seq, int(p), props, n)
            acc["steps"][n - 1] += steps
            acc["committed"][n - 1] += committed
            if n == n_draft:
                acc["attempts"] += attempts
                acc["accepts"] += accepts
    total = {k: sum((v[k] for v in per_source.values()), start=np.zeros(n_draft, np.int64))
             for k in ("steps", "committed", "attempts", "accepts")}
    total["sequences"] = sum(v["sequences"] for v in per_source.values())
    return {name: summary(v) for name, v in sorted(per_source.items())} | {"all": summary(total)}


def summary(acc: dict) -> dict:
    steps = np.maximum(acc["steps"], 1)
    return {"sequences": int(acc["sequences"]), "tau": round(float(acc["committed"][-1] / steps[-1]), 3),
            "steps": int(acc["steps"][-1]), "tokens": int(acc["committed"][-1]),
            "accept_per_position": [round(float(a / max(t, 1)), 4) for a, t in zip(acc["accepts"], acc["attempts"])],
            "tau_by_n_draft": [round(float(c / s), 3) for c, s in zip(acc["committed"], steps)]}


def evaluate(draft, target, data, device, max_sequences: int | None = None) -> dict:
    """fp32 target and draft, no TF32: the acceptance a float32 engine would see."""
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        seqs = unpack(data, "eval")[:max_sequences]
        draft_mode = draft.training
        draft.eval()
        result = acceptance(draft, target, seqs, data["eval_prompt_len"], data["eval_source"],
                            [str(s) for s in data["sources"]], device)
        draft.train(draft_mode)
        return result
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", type=Path, required=True, help="DFlash directory (config.json, model.safetensors)")
    ap.add_argument("--data", type=Path, required=True, help="directory with gen.npz (its eval split)")
    ap.add_argument("--model", type=Path, default=REPO / "pyengine" / "default_model")
    ap.add_argument("--max-sequences", type=int, default=None)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    target = dflash_target.load(args.model, device)
    draft = dflash_model.load(args.draft).to(device)
    result = evaluate(draft, target, np.load(args.data / "gen.npz"), device, args.max_sequences)
    for name, row in result.items():
        print(json.dumps({"prompts": name, **row}))


if __name__ == "__main__":
    sys.exit(main())
