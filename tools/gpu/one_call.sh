#!/usr/bin/env bash
# The end-of-session issue-6 checks in one device call (600 s; repo root; carry .whl):
#   1. `pytest -m gpu` on the two GPU test files (the server tests need the openai client, which
#      the GPU machine lacks) through pytest_gpu.sh (75;90 build): every op test against its CPU twin,
#      memcheck on the op tests, the transformers goldens on the GPU (must-show 1, 2, 5);
#   2. the 27B bench (decode batch 1/2/8, prefill 4K/32K, the depth table; must-show 3, 4);
#   3. SM75=1: the sm_75 PTX-JIT op tests, with the time left.
# Each stage has its own time limit and appends to summary.txt, so a late stage running out
# leaves the rest. Returns summary.txt + logs.tgz only.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; L=/tmp/one_call_logs; rm -rf "$L"; mkdir -p "$L"; S="$OUT/summary.txt"
t0=$SECONDS
{ echo "== pytest -m gpu"; OUT="$L" timeout "${PYTEST_S:-390}" bash tools/gpu/pytest_gpu.sh tests/test_gpu_model.py tests/test_gpu_ops.py -q \
    2>&1 | tail -8
  echo "== pytest done at $((SECONDS - t0)) s"; } >> "$S"
export PYENGINE_LIBRARY="$ROOT/build/dev/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site:${PYTHONPATH:-}"
timeout $((575 - (SECONDS - t0))) python3 tools/bench_gpu.py --decode-tokens 48 --out "$L/bench.json" 2>&1 \
  | grep -v "memory plan" > "$L/bench.log"
{ echo "== bench at $((SECONDS - t0)) s"; grep -v '^{' "$L/bench.log"; } >> "$S"
if [ "${SM75:-0}" = 1 ]; then
  echo "== sm75 at $((SECONDS - t0)) s" >> "$S"
  OUT="$L" timeout $((590 - (SECONDS - t0))) bash tools/gpu/sm75_tests.sh >> "$S" 2>&1
fi
echo "== done at $((SECONDS - t0)) s" >> "$S"
tar czf /tmp/logs.tgz -C "$L" . && mv /tmp/logs.tgz "$OUT/logs.tgz"
cat "$S"
