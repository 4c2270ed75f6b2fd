"""Goldens of the shipped default model from transformers (fp32 forward of the bf16 weights).

python tools/default_model/make_goldens.py  ->  tests/data/default_model_goldens.npz
Two prompts: a short chat (logits of every position) and a longer Python snippet (logits of its
last 8 positions, to keep the file small), and greedy continuations of both.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "pyengine" / "default_model"
OUT = REPO / "tests" / "data" / "default_model_goldens.npz"
CODE = '''def merge_sorted(a, b):
    """Merge two sorted lists into one sorted list."""
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
'''


@torch.no_grad()
def main() -> None:
    tok = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16).float().eval()
    chat = tok.apply_chat_template([{"role": "user", "content": "Compute 478 + 56."}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=True)
    out = {}
    for name, text, keep in (("chat", chat, None), ("code", CODE, 8)):
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        logits = model(ids).logits[0]
        out[f"{name}_ids"] = ids[0].numpy().astype(np.int32)
        out[f"{name}_logits"] = (logits if keep is None else logits[-keep:]).numpy().astype(np.float32)
        gen = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        out[f"{name}_greedy_ids"] = gen[0, ids.shape[1]:].numpy().astype(np.int32)
    np.savez_compressed(OUT, **out)
    import transformers

    print(json.dumps({"out": str(OUT), "bytes": OUT.stat().st_size, "transformers": transformers.__version__,
                      "torch": torch.__version__, **{k: list(v.shape) for k, v in out.items()}}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
