"""Trains the pyengine default model (Qwen3.5 hybrid + MTP head) within a wall-clock budget per call.

Each call resumes from --resume (if it holds a state), trains until --minutes have passed since
the process started (minus a margin to evaluate and save) or the whole schedule is done, then
writes the state (ckpt.py) and the loss curve (loss.csv, appended across calls) to --out.

Schedule: linear warm-up over --warmup-steps, then cosine decay to --min-lr-ratio of --lr as a
function of TRAINING TIME: progress = trained seconds / (--total-minutes * 60), summed over calls.
Design decision: the budget is wall-clock minutes on the GPU machine, not steps, so a time-based
cosine ends exactly when the planned calls end, whatever the throughput turns out to be;
--final-call makes it end at this call's deadline whatever was planned.

  python3 tools/default_model/train.py --minutes 8 --total-minutes 20 --resume .train/ckpt --out "$OUT"
"""

import time

_PROCESS_STARTED = time.time()  # the call's budget includes the imports below

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path

import torch

import ckpt
import data
import evaluate
from model import DefaultModel, make_config, n_params

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CSV_FIELDS = ["call", "step", "tokens", "trained_s", "lr", "loss", "lm_loss", "mtp_loss", "tok_per_s",
              "code_ppl", "prose_ppl", "wiki_chat_ppl", "code_mtp_accept1", "prose_mtp_accept1", "arith_acc"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=REPO / ".train" / "corpus")
    ap.add_argument("--tokenizer", type=Path, default=REPO / ".train" / "tokenizer")
    ap.add_argument("--resume", type=Path, default=None, help="state dir from the previous call (may be empty)")
    ap.add_argument("--out", type=Path, required=True, help="where to write the state and loss.csv")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/pyengine_default_model_tokens"))
    ap.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of this call")
    ap.add_argument("--total-minutes", type=float, default=None,
                    help="training time of the whole schedule (default: the state's, else 20)")
    ap.add_argument("--final-call", action="store_true",
                    help="end the schedule with this call: the cosine reaches its floor at this call's deadline")
    ap.add_argument("--save-margin-s", type=float, default=45.0, help="reserved for the final eval and save")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="loss = lm + w * mtp")
    ap.add_argument("--weights", default=data.DEFAULT_WEIGHTS, help="mixture, by rows")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-rows", type=int, default=64)
    ap.add_argument("--n-arith-eval", type=int, default=200, help="held-out arithmetic chats at the end (0: skip)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (costs start-up time)")
    return ap.parse_args(argv)


def lr_at(args, step: int, trained_s: float) -> float:
    warm = min(1.0, (step + 1) / args.warmup_steps)
    progress = min(1.0, trained_s / (args.total_minutes * 60))
    cosine = args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return args.lr * warm * cosine


def make_optimizer(model, args, device):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def read_csv(resume: Path | None) -> list[dict]:
    if resume is None or not (resume / "loss.csv").exists():
        return []
    return list(csv.DictReader(io.StringIO((resume / "loss.csv").read_text())))


def write_csv(path: Path, rows: list[dict]):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def evaluate_heldout(model, heldout_windows, args, device, amp_dtype) -> dict:
    row = {}
    for source, windows in heldout_windows.items():
        m = evaluate.heldout_metrics(model, windows, 16, device, amp_dtype)
        row[f"{source}_ppl"] = round(m["ppl"], 4)
        if source != "wiki_chat":
            row[f"{source}_mtp_accept1"] = round(m["mtp_accept1"], 4)
    return row


def main(argv=None):
    started = _PROCESS_STARTED
    args = parse_args(argv)
    deadline = started + args.minutes * 60
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    amp_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.set_float32_matmul_precision("high")  # TF32 for the few fp32 matmuls outside autocast

    resuming = ckpt.exists(args.resume)
    meta = ckpt.load_meta(args.resume) if resuming else {}
    if args.total_minutes is None:
        args.total_minutes = meta.get("total_minutes", 20.0)
    tokenizer_file = args.tokenizer / "tokenizer.json"
    vocab_size = len(json.loads(tokenizer_file.read_text())["model"]["vocab"])
    if resuming:
        from transformers import Qwen3_5TextConfig
        config = Qwen3_5TextConfig.from_dict(meta["config"])
        assert config.vocab_size == vocab_size, (config.vocab_size, vocab_size)
    else:
        config = make_config(vocab_size, args.preset)

    torch.manual_seed(args.seed + meta.get("calls", 0))
    model = DefaultModel(config).to(device)
    optimizer = make_optimizer(model, args, device)
    step, tokens_seen, trained_s = meta.get("step", 0), meta.get("tokens", 0), meta.get("trained_s", 0.0)
    if resuming:
        tensors = ckpt.load_tensors(args.resume)
        model.load_checkpoint_tensors({k: v.float() for k, v in ckpt.model_tensors(tensors).items()})
        ckpt.restore_optimizer(model, optimizer, tensors, step)
        torch.set_rng_state(torch.tensor(meta["torch_rng"], dtype=torch.uint8))
    call = meta.get("calls", 0) + 1
    print(f"call {call}: device {device}, params {n_params(model) / 1e6:.2f}M, step {step}, "
          f"trained {trained_s:.0f}s of {args.total_minutes * 60:.0f}s", flush=True)

    t0 = time.time()
    train_streams = data.load_streams(args.corpus, tokenizer_file, "train", args.cache)
    heldout_streams = data.load_streams(args.corpus, tokenizer_file, "heldout", args.cache)
    print(f"tokenized in {time.time() - t0:.1f}s: train {json.dumps(data.stream_stats(train_streams))}", flush=True)
    row_len = args.seq_len + 2  # the MTP target of the last position is token T+1
    sampler = data.Sampler(train_streams, data.parse_weights(args.weights), args.batch_size, row_len, args.seed)
    heldout_windows = {s: data.eval_windows(heldout_streams[s][0], row_len, args.eval_rows)
                       for s in ("code", "prose", "wiki_chat") if s in heldout_streams}
    forward = torch.compile(model) if args.compile else model

    if args.final_call:
        args.total_minutes = (trained_s + max(0.0, deadline - time.time() - args.save_margin_s)) / 60
        print(f"final call: schedule ends at {args.total_minutes:.2f} training minutes", flush=True)
    rows = read_csv(args.resume)
    model.train()
    step_s, interval_t, interval_tokens, interval_steps = None, time.time(), 0, 0
    loss_acc = torch.zeros(3, device=device)
    while trained_s < args.total_minutes * 60:
        step_started = time.time()
        if step_s is not None and step_started + step_s + args.save_margin_s > deadline:
            break
        lr = lr_at(args, step, trained_s)
        for group in optimizer.param_groups:
            group["lr"] = lr
        tokens = sampler.batch(step).to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
            lm_loss, mtp_loss, _, _ = forward(tokens)
            loss = lm_loss + args.mtp_weight * mtp_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_acc += torch.stack([loss.detach(), lm_loss.detach(), mtp_loss.detach()]).float()
        step, interval_steps = step + 1, interval_steps + 1
        n_tokens = tokens.shape[0] * args.seq_len
        tokens_seen, interval_tokens = tokens_seen + n_tokens, interval_tokens + n_tokens
        is_log_step = step % args.log_every == 0 or step == 1
        if is_log_step and device.type == "cuda":
            torch.cuda.synchronize()
        step_s = time.time() - step_started  # the schedule counts training time, not evaluation
        trained_s += step_s
        if is_log_step:
            now = time.time()
            losses = (loss_acc / interval_steps).tolist()
            row = {"call": call, "step": step, "tokens": tokens_seen, "trained_s": round(trained_s, 1),
                   "lr": f"{lr:.3e}", "loss": round(losses[0], 4), "lm_loss": round(losses[1], 4),
                   "mtp_loss": round(losses[2], 4), "tok_per_s": round(interval_tokens / (now - interval_t))}
            if step % args.eval_every == 0:
                row.update(evaluate_heldout(model, heldout_windows, args, device, amp_dtype))
            rows.append(row)
            print(json.dumps(row), flush=True)
            loss_acc.zero_()
            interval_t, interval_tokens, interval_steps = time.time(), 0, 0

    final = {"call": call, "step": step, "tokens": tokens_seen, "trained_s": round(trained_s, 1)}
    final.update(evaluate_heldout(model, heldout_windows, args, device, amp_dtype))
    if args.n_arith_eval > 0 and time.time() + 5 < deadline:  # --save-margin-s covers it
        from transformers import AutoTokenizer
        hf_tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        questions = json.loads((HERE / "data" / "heldout_arith.json").read_text())[: args.n_arith_eval]
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
            acc, replies = evaluate.arith_accuracy(model.lm, hf_tokenizer, questions, device)
        final["arith_acc"] = round(acc, 4)
        print("sample reply:", json.dumps(replies[0]), flush=True)
    rows.append(final)
    print(json.dumps(final), flush=True)

    meta = {"config": config.to_dict(), "calls": call, "step": step, "tokens": tokens_seen,
            "trained_s": trained_s, "total_minutes": args.total_minutes, "args": {k: str(v) for k, v in vars(args).items()},
            "torch_rng": torch.get_rng_state().tolist(), "torch": torch.__version__}
    paths = ckpt.save(args.out, model, optimizer, meta)
    write_csv(args.out / "loss.csv", rows)
    print(f"saved {[p.name for p in paths] + ['loss.csv']} "
          f"({sum(p.stat().st_size for p in paths) / 1e6:.1f} MB) in {time.time() - started:.0f}s total", flush=True)


if __name__ == "__main__":
    sys.exit(main())
