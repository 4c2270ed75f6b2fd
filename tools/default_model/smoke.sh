#!/usr/bin/env bash
# End-to-end check of the pipeline on the CPU at a tiny scale (about 2 minutes once the corpus,
# tokenizer and token cache exist): train, resume, export, reload with transformers, generate.
# Usage (from the repo root): tools/default_model/smoke.sh [work dir, default /tmp/default_model_smoke]
set -euo pipefail
work=${1:-/tmp/default_model_smoke}
rm -rf "$work" && mkdir -p "$work"
tiny=(--preset tiny --seq-len 64 --batch-size 4 --warmup-steps 10 --log-every 20 --eval-every 40
      --eval-rows 4 --device cpu)
python3 tools/default_model/train.py "${tiny[@]}" --minutes 0.5 --total-minutes 1 --save-margin-s 5 \
    --n-arith-eval 0 --out "$work/call1"
python3 tools/default_model/train.py "${tiny[@]}" --minutes 0.75 --save-margin-s 15 --final-call \
    --n-arith-eval 4 --resume "$work/call1" --out "$work/call2"
python3 tools/default_model/export.py --state "$work/call2" --out "$work/export"
python3 tools/default_model/evaluate.py --model "$work/export" --n-arith 4
