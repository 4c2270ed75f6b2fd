"""Exports a training state (ckpt.py) as a Hugging Face-layout checkpoint directory:
config.json (qwen3_5_text, mtp_num_hidden_layers 1), model.safetensors (bf16, with mtp.*),
tokenizer.json, tokenizer_config.json (chat template), generation_config.json.
Then reloads it with transformers and checks its logits against the training model.

  python tools/default_model/export.py --state .train/ckpt --out pyengine/default_model
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3_5TextConfig

import ckpt
from train_tokenizer import SPECIAL_TOKENS
from model import DefaultModel

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MAX_BYTES = 40_000_000
DROP_CONFIG_KEYS = {"_name_or_path", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
                    "is_encoder_decoder", "id2label", "label2id", "problem_type", "output_attentions", "dtype"}


def config_json(config: Qwen3_5TextConfig) -> dict:
    out = {k: v for k, v in config.to_dict().items() if k not in DROP_CONFIG_KEYS}
    out.update(architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", torch_dtype="bfloat16",
               mtp_num_hidden_layers=1, use_cache=True)
    return dict(sorted(out.items()))


def write_checkpoint(state_dir: Path, tokenizer_dir: Path, out: Path) -> Qwen3_5TextConfig:
    meta = ckpt.load_meta(state_dir)
    config = Qwen3_5TextConfig.from_dict(meta["config"])
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in ckpt.model_tensors(ckpt.load_tensors(state_dir)).items()}
    assert any(k.startswith("mtp.") for k in tensors), "no MTP tensors in the state"
    out.mkdir(parents=True, exist_ok=True)
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config_json(config), indent=2) + "\n")
    generation = {"eos_token_id": [config.eos_token_id, config.pad_token_id], "pad_token_id": config.pad_token_id,
                  "do_sample": False, "max_new_tokens": 512}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, out / name)
    unmark_tags(out)
    return config


def unmark_tags(out: Path) -> None:
    """The BPE trainer marks every added token special; the reasoning and tool tags must not be
    (as in Qwen's tokenizer), or decode(skip_special_tokens=True) drops them and a client can no
    longer separate reasoning from content."""
    keep = {tok for tok, special in SPECIAL_TOKENS if special}
    tok = json.loads((out / "tokenizer.json").read_text())
    for entry in tok["added_tokens"]:
        entry["special"] = entry["content"] in keep
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    for entry in cfg.get("added_tokens_decoder", {}).values():
        entry["special"] = entry["content"] in keep
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


@torch.no_grad()
def check(out: Path, state_dir: Path, config: Qwen3_5TextConfig) -> dict:
    """Reloads the export with transformers; its logits must equal the training model's (bf16 weights)."""
    tokenizer = AutoTokenizer.from_pretrained(out)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ours = DefaultModel(config).eval()
    ours.load_checkpoint_tensors({k: v.to(torch.bfloat16).float()
                                  for k, v in ckpt.model_tensors(ckpt.load_tensors(state_dir)).items()})
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 + 34?"}],
                                           tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    diff = (hf(ids).logits - ours.lm(ids).logits).abs().max().item()
    assert diff < 1e-4, f"reloaded logits differ by {diff}"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        n_mtp = sum(k.startswith("mtp.") for k in f.keys())
    generated = hf.generate(ids, max_new_tokens=24, do_sample=False)
    size = sum(p.stat().st_size for p in out.iterdir())
    assert size <= MAX_BYTES, f"{size} bytes > {MAX_BYTES}"
    return {"max_logit_diff": diff, "mtp_tensors": n_mtp, "bytes": size,
            "sample": tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=False)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", type=Path, default=REPO / ".train" / "ckpt")
    ap.add_argument("--tokenizer", type=Path, default=REPO / ".train" / "tokenizer")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    config = write_checkpoint(args.state, args.tokenizer, args.out)
    print(json.dumps(check(args.out, args.state, config), indent=1))


if __name__ == "__main__":
    sys.exit(main())
