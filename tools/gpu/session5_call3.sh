#!/usr/bin/env bash
# Session 5, device call 3: K split over clusters (auto for grids under one wave) and PDL for the
# quantized GEMV. Op tests (forced splits 2/3 and PDL inside test_cuda_linear), bench_kernels
# gemv, the 27B decode bench three ways (default; PYENGINE_GEMV_PDL=1; PYENGINE_GEMV_SPLITS=1),
# then `pytest -m gpu` with PDL on (the goldens through the split and PDL paths).
# Returns summary.txt + logs.tgz only.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; L=/tmp/s5logs; rm -rf "$L"; mkdir -p "$L"
t0=$SECONDS
TESTS="test_cuda_linear test_cuda_ops test_cuda_gdn_decode" BENCH="gemv" DECODE=0 \
  OUT="$L" bash tools/gpu/kernel_ab.sh > "$L/kernel_ab.out" 2>&1
export PYENGINE_LIBRARY="$ROOT/build/dev/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site:${PYTHONPATH:-}"
for cfg in "dflt" "PYENGINE_GEMV_PDL=1" "PYENGINE_GEMV_SPLITS=1"; do
  echo "== decode $cfg at $((SECONDS - t0)) s" >> "$L/decode_ab.log"
  env $( [ "$cfg" = dflt ] || echo "$cfg" ) timeout 150 python3 tools/bench_gpu.py --skip-depth --prefill-sizes \
    --decode-tokens 48 2>&1 | grep -E "^decode|NVIDIA|Error|error" >> "$L/decode_ab.log"
done
PYENGINE_GEMV_PDL=1 OUT="$L" timeout $((560 - (SECONDS - t0))) bash tools/gpu/pytest_gpu.sh \
  tests/test_gpu_model.py tests/test_gpu_ops.py -q -s -rA -k "not memcheck" > "$L/pytest_full.log" 2>&1
{
  cat "$L/kernel_ab.out"
  for t in test_cuda_linear test_cuda_ops test_cuda_gdn_decode; do
    echo "== $t"; grep -E "FAIL|NOTE|tests passed" "$L/ab_$t.log" | head -20
  done
  cat "$L/decode_ab.log"
  echo "== pytest -m gpu (PDL on)"; grep -E "passed|failed|error|FAIL" "$L/pytest_full.log" | tail -30
  echo "== bench gemv"; grep -vE "eager" "$L/ab_bench_gemv.log" | grep -E "n=(1|8) " | grep -E "fp8|i8 |nvfp4"
  echo "== done at $((SECONDS - t0)) s"
} > "$OUT/summary.txt" 2>&1
tar czf /tmp/logs.tgz -C "$L" . && mv /tmp/logs.tgz "$OUT/logs.tgz"
head -60 "$OUT/summary.txt"
