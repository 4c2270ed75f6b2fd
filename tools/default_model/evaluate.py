"""Quick in-training measures (the shipped figures are measured later with pyengine's own engine).

  heldout_metrics: perplexity of the main model and of the MTP head on held-out windows, and the
      MTP head's position-1 acceptance under teacher forcing: how often argmax of the MTP logits
      at t equals the main model's argmax at t+1 (both predict token t+2).
  arith_accuracy: exact answers on the held-out arithmetic chats (greedy, thinking on).

Run standalone on an exported checkpoint:
  python tools/default_model/evaluate.py --model DIR [--n-arith 200]
"""

import argparse
import json
import math
import re
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


@torch.no_grad()
def heldout_metrics(model, windows: torch.Tensor, batch_size: int, device, autocast_dtype) -> dict:
    lm_total = mtp_total = agree = count = 0.0
    model.eval()
    for i in range(0, len(windows), batch_size):
        tokens = windows[i:i + batch_size].to(device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype != torch.float32):
            lm_loss, mtp_loss, lm_logits, mtp_logits = model(tokens)
        n = tokens.shape[0]
        lm_total, mtp_total, count = lm_total + lm_loss.item() * n, mtp_total + mtp_loss.item() * n, count + n
        agree += (mtp_logits[:, :-1].argmax(-1) == lm_logits[:, 1:].argmax(-1)).float().mean().item() * n
    model.train()
    return {"ppl": math.exp(lm_total / count), "mtp_ppl": math.exp(mtp_total / count), "mtp_accept1": agree / count}


def last_integer(text: str):
    found = re.findall(r"-?\d+", text.split("</think>")[-1].replace(",", ""))
    return int(found[-1]) if found else None


@torch.no_grad()
def arith_accuracy(lm, tokenizer, questions: list[dict], device, batch_size: int = 100,
                   max_new_tokens: int = 224) -> tuple[float, list[str]]:
    """Greedy replies; the longest correct held-out reply is 165 tokens."""
    lm.eval()
    tokenizer.padding_side = "left"
    correct, replies = 0, []
    for i in range(0, len(questions), batch_size):
        chunk = questions[i:i + batch_size]
        prompts = [tokenizer.apply_chat_template(q["messages"], tokenize=False, add_generation_prompt=True,
                                                 enable_thinking=q.get("enable_thinking", True)) for q in chunk]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        out = lm.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        for q, seq in zip(chunk, out[:, enc["input_ids"].shape[1]:]):
            reply = tokenizer.decode(seq, skip_special_tokens=True)
            replies.append(reply)
            correct += last_integer(reply) == q["answer"]
    lm.train()
    return correct / len(questions), replies


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="exported checkpoint dir")
    ap.add_argument("--n-arith", type=int, default=200)
    ap.add_argument("--questions", type=Path, default=HERE / "data" / "heldout_arith.json")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    lm = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    questions = json.loads(args.questions.read_text())[: args.n_arith]
    acc, replies = arith_accuracy(lm, tokenizer, questions, torch.device("cpu"), batch_size=50)
    print(json.dumps({"arith_accuracy": acc, "n": len(questions), "first_reply": replies[0]}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
