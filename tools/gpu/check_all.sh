#!/usr/bin/env bash
# The issue-6 GPU checks in one call (repo root, on the GPU machine):
#   1. pytest -m gpu: tests/test_gpu_model.py (model on CUDA vs transformers and the CPU engine,
#      KV dtypes, weight formats, 1,000 requests) and tests/test_gpu_ops.py (every CUDA op vs its
#      CPU twin; memcheck when MEMCHECK=1)
#   2. tools/bench_gpu.py (27B dummy FP8: decode, prefill, KV depth table; --hf for transformers)
# Env: OUT (default /tmp/out), BENCH_ARGS (extra bench flags), PYTEST_ARGS.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export ARCHS="${ARCHS:-75;90}"
sel="not memcheck"; [ "${MEMCHECK:-0}" = 1 ] && sel=""
bash tools/gpu/pytest_gpu.sh tests/test_gpu_model.py tests/test_gpu_ops.py -q -s -rA ${PYTEST_ARGS:-} ${sel:+-k "$sel"} \
  > "$OUT/pytest_full.log" 2>&1
grep -E "passed|failed|error|rel |kv |weight_quant|requests:|FAIL" "$OUT/pytest_full.log" | tail -60
nm -C build/dev/libpyengine.so | grep -c " [TW] std::ostream" | sed 's/^/exported std::ostream symbols: /'
export PYENGINE_LIBRARY="$ROOT/build/dev/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site:${PYTHONPATH:-}"
python3 tools/bench_gpu.py --out "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | grep -v "memory plan" | tee "$OUT/bench.log" | tail -40
