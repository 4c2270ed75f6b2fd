#!/usr/bin/env bash
# The GPU checks of a change in one device call (repo root; carry .whl):
#   1. the library built as pytest_gpu.sh builds it (75;90);
#   2. the 27B bench (decode batch 1/2/8, prefill 4K/32K, the depth table);
#   3. `pytest -m gpu` on the two GPU test files (the server tests need the openai client, which
#      the GPU machine lacks): every op test against its CPU twin, memcheck on the op tests, the
#      transformers goldens on the GPU. PYTEST_K: a -k expression (e.g.
#      "not twins" skips the full-size op binaries, ~190 s);
#   4. SM75=1: the sm_75 PTX-JIT op tests (SM75_FILTER: only these ops), with the time left.
# LIMIT (default 600) is the call's time limit: each stage stops in time for the next and
# appends to summary.txt, so a late stage running out leaves the rest. Returns summary.txt +
# logs.tgz only.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; L=/tmp/one_call_logs; rm -rf "$L"; mkdir -p "$L"; S="$OUT/summary.txt"
LIMIT="${LIMIT:-600}"; t0=$SECONDS
left() { echo $((LIMIT - $1 - (SECONDS - t0))); }  # seconds left, keeping $1 for what follows
OUT="$L" BUILD_ONLY=1 bash tools/gpu/pytest_gpu.sh > "$L/build_lib.log" 2>&1 || { echo "build FAILED" >> "$S"; }
echo "== built at $((SECONDS - t0)) s" >> "$S"
export PYENGINE_LIBRARY="$ROOT/build/dev/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site:${PYTHONPATH:-}"
timeout "$(left "${TESTS_S:-150}")" python3 tools/bench_gpu.py --decode-tokens 48 --out "$L/bench.json" 2>&1 \
  | grep -v "memory plan" > "$L/bench.log"
{ echo "== bench at $((SECONDS - t0)) s"; grep -v '^{' "$L/bench.log"; } >> "$S"
{ echo "== pytest -m gpu ${PYTEST_K:+-k \"$PYTEST_K\"}"
  OUT="$L" timeout "$(left "${SM75_S:-10}")" bash tools/gpu/pytest_gpu.sh tests/test_gpu_model.py tests/test_gpu_ops.py \
    -q ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tail -8
  echo "== pytest done at $((SECONDS - t0)) s"; } >> "$S"
if [ "${SM75:-0}" = 1 ]; then
  echo "== sm75 at $((SECONDS - t0)) s" >> "$S"
  OUT="$L" FILTER="${SM75_FILTER:-}" timeout "$(left 5)" bash tools/gpu/sm75_tests.sh >> "$S" 2>&1
fi
echo "== done at $((SECONDS - t0)) s" >> "$S"
tar czf /tmp/logs.tgz -C "$L" . && mv /tmp/logs.tgz "$OUT/logs.tgz"
cat "$S"
