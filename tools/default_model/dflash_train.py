"""Trains the DFlash draft of the default model in one time-boxed call (SpecForge's recipe,
MODEL_SPEC.md §6), then measures its acceptance and saves it in the DFlash format.

Each step: B sequences (prompt + the model's own reply, from dflash_data.py generate) go through
the frozen target (bf16 autocast on the GPU), whose layer outputs at target_layer_ids are the
context features; up to --anchors random anchor positions per sequence, inside the reply, each
start a block [y[a], MASK x (bs-1)] that sees the context before a and itself
(dflash_model.forward_blocks); the loss is the cross-entropy of block position k (1 .. bs-1)
against y[a+k], weighted exp(-(k-1)/gamma), over labels inside the sequence. AdamW, linear
warm-up over the first --warmup-frac of the call's training time, then cosine to
--min-lr-ratio at its end. At the end: acceptance on the eval split (dflash_eval.py).

Output (--out): draft/config.json, draft/model.safetensors (bf16), train_log.csv, result.json
(config, steps, tokens, losses, acceptance).

  python3 tools/default_model/dflash_train.py --data DIR_WITH_gen.npz --minutes 4.5 --out DIR

On the CPU (no GPU): fp32 throughout (autocast is CUDA-only), --threads sets torch's threads, and
the target's features are computed one sequence at a time over its own length (--features auto ->
per-sequence on the CPU): right padding changes nothing before a sequence's end (causal target),
and the padded batch forward spent about half its time on padding. --save-every-minutes writes the
draft (and train_log.csv) during training, so a run stopped early leaves a usable checkpoint.
"""


from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

_PROCESS_STARTED = time.time()

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import dflash_eval
import dflash_model
import dflash_target
from dflash_data import unpack

# Design decisions (README "DFlash draft"): mask = <|endoftext|> (id 0); block 8; 2 layers in the
# target's attention shape; features of target layers 1, 3, 5, 7 (all four pairs of the 8 layers).
MASK_TOKEN_ID = 0
DRAFT_SHAPE = {"num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 64,
               "intermediate_size": 1024}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, nargs="+", required=True, help="directories with gen.npz")
    ap.add_argument("--model", type=Path, default=REPO / "pyengine" / "default_model")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--init", type=Path, default=None, help="start from this DFlash directory's weights")
    ap.add_argument("--minutes", type=float, default=4.5, help="budget of this process, eval and save included")
    ap.add_argument("--save-margin-s", type=float, default=50.0, help="reserved for the eval and save")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=DRAFT_SHAPE["num_hidden_layers"])
    ap.add_argument("--target-layers", default="1,3,5,7")
    ap.add_argument("--intermediate-size", type=int, default=DRAFT_SHAPE["intermediate_size"])
    ap.add_argument("--heads", type=int, default=DRAFT_SHAPE["num_attention_heads"])
    ap.add_argument("--kv-heads", type=int, default=DRAFT_SHAPE["num_key_value_heads"])
    ap.add_argument("--head-dim", type=int, default=DRAFT_SHAPE["head_dim"])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--anchors", type=int, default=64, help="blocks per sequence per step (at most)")
    ap.add_argument("--max-len", type=int, default=768, help="sequences are cut to this many tokens")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup-frac", type=float, default=0.04)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--gamma", type=float, default=7.0, help="position k weighs exp(-(k-1)/gamma)")
    ap.add_argument("--eval-max-sequences", type=int, default=None)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--features", choices=("auto", "padded", "per-sequence"), default="auto",
                    help="target features over the padded batch or one sequence at a time (auto: CPU per-sequence)")
    ap.add_argument("--save-every-minutes", type=float, default=0.0, help="also save the draft during training (0: off)")
    return ap.parse_args(argv)


def load_sequences(dirs: list[Path], max_len: int):
    """Train sequences with at least two reply tokens inside max_len: (tokens, prompt_len) pairs."""
    rows = []
    for d in dirs:
        data = np.load(d / "gen.npz")
        for seq, p in zip(unpack(data, "train"), data["train_prompt_len"]):
            seq = seq[:max_len]
            if len(seq) - int(p) >= 2:
                rows.append((seq, int(p)))
    return rows


def make_batch(rows, step: int, args, device):
    """-> ids [B, T] (right-padded), lengths [B], anchors [B, N], keep [B, N]; a function of (seed, step)."""
    rng = np.random.default_rng([args.seed, step])
    chosen = [rows[i] for i in rng.integers(len(rows), size=args.batch_size)]
    width = max(len(s) for s, _ in chosen)
    width = -(-width // 16) * 16
    n = min(args.anchors, max(len(s) - 1 - p for s, p in chosen))
    ids = np.full((len(chosen), width), dflash_target.PAD_ID, dtype=np.int64)
    anchors = np.zeros((len(chosen), n), dtype=np.int64)
    keep = np.zeros((len(chosen), n), dtype=bool)
    for i, (seq, p) in enumerate(chosen):
        ids[i, :len(seq)] = seq
        valid = np.arange(p, len(seq) - 1)  # an anchor needs one label after it
        pick = np.sort(rng.choice(valid, size=min(n, len(valid)), replace=False))
        anchors[i, :len(pick)], keep[i, :len(pick)] = pick, True
    lengths = np.asarray([len(s) for s, _ in chosen])
    as_t = lambda x: torch.from_numpy(x).to(device, non_blocking=True)
    return as_t(ids), as_t(lengths), as_t(anchors), as_t(keep)


def batch_features(target, ids, lengths, layer_ids, per_sequence: bool) -> torch.Tensor:
    """The frozen target's features [B, T, n*H]: one padded forward, or each sequence over its own
    length (zeros after it; those positions are never context: a block's context ends before its
    anchor, inside the sequence)."""
    if not per_sequence:
        return dflash_target.features(target, ids, layer_ids)
    rows = [dflash_target.features(target, ids[i:i + 1, :int(n)], layer_ids)[0] for i, n in enumerate(lengths)]
    feats = rows[0].new_zeros(ids.shape[0], ids.shape[1], rows[0].shape[-1])
    for i, r in enumerate(rows):
        feats[i, :r.shape[0]] = r
    return feats


def block_loss(draft, target, ids, lengths, anchors, keep, gamma: float, feats=None):
    """Weighted CE over block positions 1..bs-1 -> (loss, top-1 accuracy per position [bs-1])."""
    bs = draft.config.block_size
    if feats is None:
        feats = dflash_target.features(target, ids, draft.config.target_layer_ids)
    hidden = dflash_model.forward_blocks(draft, lambda x: dflash_target.embed(target, x), feats, ids, anchors)
    logits = dflash_target.lm_head(target, hidden[:, :, 1:])  # [B, N, bs-1, V]
    offsets = torch.arange(1, bs, device=ids.device)
    label_pos = anchors[:, :, None] + offsets  # [B, N, bs-1]
    valid = keep[:, :, None] & (label_pos < lengths[:, None, None])
    labels = torch.gather(ids, 1, label_pos.clamp(max=ids.shape[1] - 1).flatten(1)).view_as(label_pos)
    ce = F.cross_entropy(logits.flatten(0, 2).float(), labels.flatten(), reduction="none").view_as(label_pos)
    weights = valid * torch.exp(-(offsets - 1).float() / gamma)
    loss = (ce * weights).sum() / weights.sum().clamp_min(1e-6)
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels) & valid
        accuracy = correct.sum((0, 1)).float() / valid.sum((0, 1)).clamp_min(1)
    return loss, accuracy


def lr_at(args, progress: float) -> float:
    if progress < args.warmup_frac:
        return args.lr * max(progress / args.warmup_frac, 0.01)
    rest = (progress - args.warmup_frac) / max(1e-9, 1 - args.warmup_frac)
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, rest))))


def make_draft(args, target_config, device) -> dflash_model.DFlashDraft:
    if args.init is not None:
        return dflash_model.load(args.init).to(device)
    layer_ids = [int(x) for x in args.target_layers.split(",")]
    assert all(0 <= i < target_config.num_hidden_layers for i in layer_ids), layer_ids
    config = dflash_model.DFlashConfig(
        hidden_size=target_config.hidden_size, vocab_size=target_config.vocab_size, block_size=args.block_size,
        mask_token_id=MASK_TOKEN_ID, target_layer_ids=layer_ids,
        num_target_layers=target_config.num_hidden_layers, rms_norm_eps=target_config.rms_norm_eps,
        rope_theta=float(target_config.rope_parameters["rope_theta"]),
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, intermediate_size=args.intermediate_size)
    return dflash_model.DFlashDraft(config).to(device)


def write_log(out: Path, log: list) -> None:
    if log:
        out.mkdir(parents=True, exist_ok=True)
        with (out / "train_log.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(log[-1]))
            writer.writeheader()
            writer.writerows(log)


def main(argv=None):
    args = parse_args(argv)
    deadline = _PROCESS_STARTED + args.minutes * 60
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    amp = {"device_type": device.type, "dtype": torch.bfloat16, "enabled": device.type == "cuda"}
    torch.manual_seed(args.seed)
    torch.set_float32_matmul_precision("high")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    per_sequence = args.features == "per-sequence" or (args.features == "auto" and device.type == "cpu")

    target = dflash_target.load(args.model, device)
    draft = make_draft(args, target.config, device)
    rows = load_sequences(args.data, args.max_len)
    n_reply = sum(len(s) - p for s, p in rows)
    print(f"device {device}, draft {dflash_model.n_params(draft) / 1e6:.2f}M params, "
          f"{len(rows)} sequences, {n_reply} reply tokens, loaded in {time.time() - _PROCESS_STARTED:.0f}s", flush=True)
    decay = [p for p in draft.parameters() if p.ndim >= 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": [p for p in draft.parameters() if p.ndim < 2], "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")

    train_start = time.time()
    train_budget = max(1.0, deadline - args.save_margin_s - train_start)
    log, step, blocks_seen = [], 0, 0
    acc_loss, acc_top1, interval_steps = 0.0, None, 0
    step_s = 0.0
    t_feats = 0.0
    next_save = train_start + args.save_every_minutes * 60 if args.save_every_minutes > 0 else math.inf
    while True:
        step_started = time.time()
        elapsed = step_started - train_start
        if elapsed + step_s >= train_budget:  # the next step would end past the budget
            break
        lr = lr_at(args, elapsed / train_budget)
        for group in optimizer.param_groups:
            group["lr"] = lr
        ids, lengths, anchors, keep = make_batch(rows, step, args, device)
        with torch.autocast(**amp):
            t0 = time.time()
            feats = batch_features(target, ids, lengths, draft.config.target_layer_ids, per_sequence)
            t_feats += time.time() - t0
            loss, top1 = block_loss(draft, target, ids, lengths, anchors, keep, args.gamma, feats)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step, interval_steps, blocks_seen = step + 1, interval_steps + 1, blocks_seen + int(keep.sum())
        step_s = time.time() - step_started
        acc_loss += loss.detach()
        acc_top1 = top1 if acc_top1 is None else acc_top1 + top1
        if step % args.log_every == 0 or step == 1:
            row = {"step": step, "seconds": round(time.time() - train_start, 1), "lr": f"{lr:.3e}",
                   "feature_s": round(t_feats, 1),
                   "loss": round(float(acc_loss) / interval_steps, 4), "blocks": blocks_seen,
                   **{f"top1_k{k + 1}": round(float(a) / interval_steps, 4) for k, a in enumerate(acc_top1)}}
            log.append(row)
            print(json.dumps(row), flush=True)
            acc_loss, acc_top1, interval_steps = 0.0, None, 0
        if time.time() >= next_save:
            dflash_model.save(draft, args.out / "draft")
            write_log(args.out, log)
            (args.out / "checkpoint.json").write_text(json.dumps({"step": step, "blocks_seen": blocks_seen,
                                                                  "seconds": round(time.time() - train_start, 1)}) + "\n")
            next_save += args.save_every_minutes * 60
    trained_s = time.time() - train_start

    eval_started = time.time()
    eval_data = np.load(args.data[0] / "gen.npz")
    result = {"config": draft.config.to_json(), "params": dflash_model.n_params(draft), "steps": step,
              "blocks_seen": blocks_seen, "trained_s": round(trained_s, 1), "train_sequences": len(rows),
              "train_reply_tokens": n_reply, "args": {k: str(v) for k, v in vars(args).items()},
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "last_log": log[-1] if log else None, "feature_s": round(t_feats, 1)}
    paths = dflash_model.save(draft, args.out / "draft")
    result["acceptance_T0"] = dflash_eval.evaluate(draft, target, eval_data, device, args.eval_max_sequences)
    result["eval_s"] = round(time.time() - eval_started, 1)
    result["draft_bytes"] = sum(p.stat().st_size for p in paths)
    write_log(args.out, log)
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"acceptance_T0": result["acceptance_T0"]["all"], "steps": step, "trained_s": result["trained_s"],
                      "eval_s": result["eval_s"], "total_s": round(time.time() - _PROCESS_STARTED, 1)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
