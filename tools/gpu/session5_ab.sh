#!/usr/bin/env bash
# One device call for the session-5 candidates on this branch (repo root, GPU machine; carry .whl).
# Every candidate sits behind a tuning hook whose default is session 4's measured path, so this
# tests them all and prints old vs new side by side; main takes what passes and measures faster.
#   1. build (75;90) + test_cuda_linear (GEMV tunings: default, x in registers, all candidates;
#      GEMM variant 1 bit-equal to 0), test_cuda_attention (NVFP4 decode v4 bitwise = v0, v5),
#      test_cuda_ops, test_cuda_gdn_decode (the gated norm fused into gdn_decode);
#      bench_kernels --only gemv / norm / attn / gemm                       (tools/gpu/kernel_ab.sh)
#   2. the 27B decode bench with the defaults (session 4 on main: 69.6 tok/s at batch 1)
#   3. per-kernel decode time under ncu without the per-kernel cache flush (PROFILE=1)
# The decode bench and the profile run the fused GDN norm (it is not behind a hook); before main
# takes it, a second call runs `pytest -m gpu` (tools/gpu/pytest_gpu.sh, ~4 min) on the result.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
TESTS="test_cuda_linear test_cuda_attention test_cuda_ops test_cuda_gdn_decode" BENCH="gemv norm attn gemm" DECODE=1 OUT="$OUT" \
  bash tools/gpu/kernel_ab.sh
for s in gemv norm attn gemm; do
  echo "== bench $s (graph-timed rows)"; grep -vE "eager|^d2d|^device|bench done" "$OUT/ab_bench_$s.log" | head -150
done
PROFILE=1 SKIP_PYTEST=1 SKIP_BENCH=1 OUT="$OUT" bash tools/gpu/check_all.sh 2>&1 | tail -16
# The device call brings back a few files only: one summary and one archive of every log.
{
  for t in test_cuda_linear test_cuda_attention test_cuda_ops test_cuda_gdn_decode; do
    echo "== $t"; grep -E "FAIL|NOTE|tests passed" "$OUT/ab_$t.log" | head -20
  done
  echo "== decode"; cat "$OUT/ab_decode.log"
  for s in gemv norm attn gemm; do echo "== bench $s"; grep -vE "eager|bench done" "$OUT/ab_bench_$s.log"; done
  echo "== profile"; cat "$OUT/profile.txt" 2>/dev/null
} > "$OUT/summary.txt" 2>&1
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=summary.txt . && find . -type f ! -name logs.tgz ! -name summary.txt -delete)
