#!/usr/bin/env bash
# Session 5, device call 2: the defaults picked from call 1 (FP8 GEMV by cvt on sm_89+, NVFP4
# decode attention v4, the row norms with every load before any store, the gated norm fused into
# gdn_decode): op tests, bench_kernels norm/gemv, the 27B decode bench with the depth table
# (must-show 4). Returns summary.txt + logs.tgz only (the device call brings back a few files).
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; L=/tmp/s5logs; rm -rf "$L"; mkdir -p "$L"
TESTS="test_cuda_linear test_cuda_ops test_cuda_attention test_cuda_gdn_decode" BENCH="norm gemv" DECODE=1 DEPTH=1 \
  OUT="$L" bash tools/gpu/kernel_ab.sh > "$L/kernel_ab.out" 2>&1
{
  cat "$L/kernel_ab.out"
  for t in test_cuda_linear test_cuda_ops test_cuda_attention test_cuda_gdn_decode; do
    echo "== $t"; grep -E "FAIL|NOTE|tests passed" "$L/ab_$t.log" | head -20
  done
  echo "== bench norm"; cat "$L/ab_bench_norm.log"
  echo "== bench gemv (n=1)"; grep -E "n=1 " "$L/ab_bench_gemv.log" | grep -E "fp8|i8 " | grep -vE "eager"
} > "$OUT/summary.txt" 2>&1
tar czf /tmp/logs.tgz -C "$L" . && mv /tmp/logs.tgz "$OUT/logs.tgz"
tail -80 "$OUT/summary.txt"
