"""The MTP head's draft acceptance, measured offline on held-out text (PyTorch on the CPU).

The engine has no MTP forward yet, so this runs the training model of model.py (transformers'
Qwen3_5ForCausalLM + the MTP module) with the exported weights (pyengine/default_model).

What is measured (greedy speculative decoding, as vLLM's qwen3_5_mtp proposer chains the head):
  1. Prompts: --prompts windows of --prompt-len tokens at evenly spaced offsets of a held-out
     stream (.train/corpus/heldout/{code,prose}, documents joined by <|endoftext|>).
  2. The main model continues each prompt greedily for --gen tokens (its own KV/recurrent cache,
     no EOS stop). y = prompt + continuation is then the model's own greedy text.
  3. One full forward over y gives the final-NORMED hidden H[p] (what vLLM feeds the MTP layer).
  4. Draft chain from position t (y[t+1] is the token the main model just produced):
       step 1: MTP(H[t], embed(y[t+1])) at position t            -> draft d1, compared with y[t+2]
       step k: MTP(out_{k-1}, embed(d_{k-1})) at position t+k-1 -> draft dk, compared with y[t+k+1]
     where out_{k-1} is the MTP layer's output hidden (after its norm) of the previous step. The
     MTP attention layer sees its cache of step-1 entries (H[s], embed(y[s+1])) for s <= t (the
     prompt and the accepted text) plus the chain's own earlier entries. Given drafts 1..k-1
     accepted, d_{k-1} = y[t+k], so all chains are computed at once by teacher forcing with a
     block attention mask (checked against a per-chain causal run with --check).
  Reported per position k = 1..4: conditional acceptance P(dk ok | d1..d(k-1) ok) and cumulative
  P(d1..dk all ok), over chain starts t where all 5 greedy tokens y[t+1..t+5] are generated ones.

Also reported, for comparison with train.py's in-training metric: position-1 acceptance with
teacher forcing on the real held-out text (MTP top-1 at t given the real y[t+1] versus the main
model's top-1 at t+1), over consecutive --window-token windows.

  python3 tools/default_model/mtp_acceptance.py [--model pyengine/default_model] [--check]
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
EOT_ID = 0


def load_model(model_dir: Path):
    from model import DefaultModel
    from safetensors.torch import load_file
    from transformers import Qwen3_5TextConfig

    config = Qwen3_5TextConfig.from_json_file(str(model_dir / "config.json"))
    model = DefaultModel(config)
    model.load_checkpoint_tensors(
        {k: v.float() for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    )
    return model.eval()


def heldout_stream(corpus: Path, source: str, tokenizer_file: Path) -> np.ndarray:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    with lzma.open(corpus / "heldout" / f"{source}.jsonl.xz", "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids += enc.ids + [EOT_ID]
    return np.asarray(ids, dtype=np.int64)


@torch.no_grad()
def greedy_continue(lm, prompts: torch.Tensor, n: int) -> torch.Tensor:
    out = lm(input_ids=prompts, use_cache=True)
    tokens = [out.logits[:, -1].argmax(-1)]
    for _ in range(n - 1):
        out = lm(input_ids=tokens[-1][:, None], past_key_values=out.past_key_values, use_cache=True)
        tokens.append(out.logits[:, -1].argmax(-1))
    return torch.cat([prompts, torch.stack(tokens, 1)], 1)


def rope(model, positions: torch.Tensor, like: torch.Tensor):
    """positions [B, L] -> the (cos, sin) the decoder layers take (Qwen3.5 uses 3 identical rows)."""
    return model.lm.model.rotary_emb(like, positions[None].expand(3, *positions.shape))


def mtp_inputs(model, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
    mtp = model.mtp
    e = mtp.pre_fc_norm_embedding(model.lm.model.embed_tokens(next_tokens))
    return mtp.fc(torch.cat([e, mtp.pre_fc_norm_hidden(hidden)], dim=-1))


def mtp_layer(
    model, u: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """One MTP decoder layer + norm over entries u [B, L, H]; mask [L, L] bool (True: attend) or causal."""
    pe = rope(model, positions, u)
    attn_mask = None if mask is None else mask[None, None].expand(u.shape[0], 1, *mask.shape)
    return model.mtp.norm(model.mtp.layers[0](u, position_embeddings=pe, attention_mask=attn_mask))


def chain_mask(n: int, steps: int) -> torch.Tensor:
    """Entries (j, p), j = 1..steps, p = 0..n-1, laid out j-major. Entry (j, p) belongs to the chain
    starting at t = p - j + 1 and attends to step-1 entries (1, q <= t) and to (i, t + i - 1), 2 <= i <= j."""
    idx = torch.arange(n)
    mask = torch.zeros(steps * n, steps * n, dtype=torch.bool)
    for j in range(1, steps + 1):
        rows = slice((j - 1) * n, j * n)
        t = idx - (j - 1)
        mask[rows, :n] = idx[None, :] <= t[:, None]  # step-1 cache of positions 0..t
        for i in range(2, j + 1):
            cols = (i - 1) * n + (t + i - 1)  # (i, t + i - 1)
            ok = t >= 0
            mask[(j - 1) * n + idx[ok], cols[ok]] = True
    mask |= torch.eye(
        steps * n, dtype=torch.bool
    )  # chains starting before 0 (unused) attend to themselves: no NaN
    return mask


@torch.no_grad()
def chained_drafts(model, y: torch.Tensor, hidden: torch.Tensor, steps: int) -> torch.Tensor:
    """y [B, n], hidden [B, n, H] -> drafts [B, steps, n]: drafts[:, k-1, t] is draft k of the chain
    starting at t (teacher-forced inputs y). Entries whose inputs run past y are garbage (not used)."""
    B, n = y.shape
    lm_head = model.lm.lm_head
    nxt = torch.cat([y[:, 1:], y[:, -1:]], 1)  # y[p+1] (the last one is a dummy)
    pos = torch.arange(n)[None].expand(B, n)
    entries = [mtp_inputs(model, hidden, nxt)]  # step 1 at position p: (H[p], embed(y[p+1]))
    positions = [pos]
    drafts = []
    out = None
    for k in range(1, steps + 1):
        u = torch.cat(entries, 1)
        out = mtp_layer(model, u, torch.cat(positions, 1), chain_mask(n, k))
        last = out[:, (k - 1) * n :]  # step-k outputs at positions p = t + k - 1
        d = lm_head(last).argmax(-1)  # draft k of chain t = p - k + 1
        drafts.append(torch.roll(d, shifts=-(k - 1), dims=1))  # index by t
        if k < steps:
            prev = torch.cat([last[:, :1], last[:, :-1]], 1)  # out_k at p-1 feeds entry (k+1, p)
            entries.append(mtp_inputs(model, prev, nxt))
            positions.append(pos)
    return torch.stack(drafts, 1)


@torch.no_grad()
def check_chain(
    model,
    y: torch.Tensor,
    hidden: torch.Tensor,
    drafts: torch.Tensor,
    starts: list[int],
    steps: int,
):
    """Recompute chains one at a time as a plain causal sequence [E1[0..t], E2[t+1], ..., Ek[t+k-1]]."""
    lm_head = model.lm.lm_head
    bad = 0
    for t in starts:
        e1 = mtp_inputs(model, hidden[:1, : t + 1], y[:1, 1 : t + 2])
        entries, pos = [e1], list(range(t + 1))
        d_prev = None
        for k in range(1, steps + 1):
            out = mtp_layer(model, torch.cat(entries, 1), torch.tensor([pos]), None)
            d = lm_head(out[:, -1]).argmax(-1)
            bad += int(d.item() != drafts[0, k - 1, t].item())
            d_prev = out[:, -1:]
            entries.append(mtp_inputs(model, d_prev, y[:1, t + k + 1 : t + k + 2]))
            pos.append(t + k)
    return bad


def chain_stats(drafts: torch.Tensor, y: torch.Tensor, t0: int, t1: int, steps: int) -> dict:
    """Acceptance over chain starts t in [t0, t1): draft k is right when it equals y[t+k+1]."""
    ok = torch.stack(
        [drafts[:, k - 1, t0:t1] == y[:, t0 + k + 1 : t1 + k + 1] for k in range(1, steps + 1)], 1
    )
    alive = torch.ones_like(ok[:, 0])
    conditional, cumulative = [], []
    for k in range(steps):
        accepted = alive & ok[:, k]
        conditional.append(accepted.sum().item() / max(1, alive.sum().item()))
        cumulative.append(accepted.float().mean().item())
        alive = accepted
    mean_accepted = sum(cumulative)  # expected drafts accepted per step with a 4-token chain
    return {
        "chains": int(ok.shape[0] * ok.shape[2]),
        "conditional": [round(x, 4) for x in conditional],
        "cumulative": [round(x, 4) for x in cumulative],
        f"mean_accepted_of_{steps}": round(mean_accepted, 3),
    }


@torch.no_grad()
def teacher_forced_accept1(model, stream: np.ndarray, window: int, max_tokens: int) -> dict:
    n = min(len(stream) // window, max(1, max_tokens // window))
    agree = count = 0
    for w in range(n):
        y = torch.from_numpy(stream[w * window : (w + 1) * window])[None]
        hidden = model.lm.model(input_ids=y, use_cache=False).last_hidden_state
        main = model.lm.lm_head(hidden).argmax(-1)
        out = mtp_layer(
            model, mtp_inputs(model, hidden[:, :-1], y[:, 1:]), torch.arange(window - 1)[None], None
        )
        mtp = model.lm.lm_head(out).argmax(-1)
        agree += (mtp[:, :-1] == main[:, 1:-1]).sum().item()  # both predict y[t+2]
        count += window - 2
    return {"accept1": round(agree / count, 4), "positions": count, "window": window}


def distinct_4grams(cont: torch.Tensor) -> float:
    grams = total = 0
    for row in cont.tolist():
        g = [tuple(row[i : i + 4]) for i in range(len(row) - 3)]
        grams += len(set(g))
        total += len(g)
    return grams / total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", type=Path, default=REPO / "pyengine" / "default_model")
    ap.add_argument("--corpus", type=Path, default=REPO / ".train" / "corpus")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per source")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--gen", type=int, default=128, help="greedy tokens per prompt")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--window", type=int, default=512, help="teacher-forced windows")
    ap.add_argument("--tf-tokens", type=int, default=32768, help="teacher-forced tokens per source")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument(
        "--check", action="store_true", help="verify the batched chains against per-chain runs"
    )
    ap.add_argument("--out", type=Path, default=HERE / "card" / "mtp_acceptance.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    command = (
        "python3 tools/default_model/mtp_acceptance.py"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    )
    t_start = time.time()
    model = load_model(args.model)
    summary: dict = {
        "command": command,
        "model": str(args.model),
        "torch_threads": torch.get_num_threads(),
        "prompts_per_source": args.prompts,
        "prompt_len": args.prompt_len,
        "gen": args.gen,
    }
    for source in ("code", "prose"):
        t0 = time.time()
        stream = heldout_stream(args.corpus, source, args.model / "tokenizer.json")
        P, G, K = args.prompt_len, args.gen, args.steps
        offsets = np.linspace(0, len(stream) - P - 1, args.prompts).astype(int)
        prompts = torch.from_numpy(np.stack([stream[o : o + P] for o in offsets]))
        y = greedy_continue(model.lm, prompts, G)
        with torch.no_grad():
            hidden = model.lm.model(input_ids=y, use_cache=False).last_hidden_state
            full_argmax = model.lm.lm_head(hidden[:, P - 1 : -1]).argmax(-1)
        mismatch = (full_argmax != y[:, P:]).sum().item()
        drafts = chained_drafts(model, y, hidden, K)
        # chain starts t with y[t+1..t+K+1] all generated: t in [P-1, P+G-K-1)
        result = chain_stats(drafts, y, P - 1, P + G - K - 1, K)
        result["greedy_text_distinct_4grams"] = round(distinct_4grams(y[:, P:]), 3)
        result["full_vs_incremental_argmax_mismatches"] = f"{mismatch} of {y[:, P:].numel()}"
        if args.check:
            starts = [P - 1, P + 7, P + G // 2, P + G - K - 2]
            result["check_mismatches"] = check_chain(model, y, hidden, drafts, starts, K)
        result["teacher_forced_real_text"] = teacher_forced_accept1(
            model, stream, args.window, args.tf_tokens
        )
        result["seconds"] = round(time.time() - t0, 1)
        summary[source] = result
        print(f"{source}: {json.dumps(result)}", file=sys.stderr, flush=True)
    summary["seconds"] = round(time.time() - t_start, 1)
    summary["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
