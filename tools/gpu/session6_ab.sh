#!/usr/bin/env bash
# A session-6 A/B call (repo root; carry .whl): build (75;90); the op tests in TESTS (default
# test_cuda_linear: every GEMV path, stream-K and not); bench_kernels --only for each BENCH
# section (default gemv: the "nosk" rows beside the default); the 27B decode bench with the depth
# table (fp16 measured again last, the run's drift); decode again with PYENGINE_GEMV_STREAM_K=0.
# Returns summary.txt + logs.tgz only.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; L=/tmp/s6logs; rm -rf "$L"; mkdir -p "$L"; S="$OUT/summary.txt"
t0=$SECONDS
TESTS="${TESTS:-test_cuda_linear}" BENCH="${BENCH-gemv}" DECODE=1 DEPTH="${DEPTH:-1}" OUT="$L" timeout 480 \
  bash tools/gpu/kernel_ab.sh >> "$S" 2>&1
export PYENGINE_LIBRARY="$ROOT/build/dev/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site:${PYTHONPATH:-}"
PYENGINE_GEMV_STREAM_K=0 timeout 60 python3 tools/bench_gpu.py --skip-depth --prefill-sizes --decode-tokens 48 2>&1 \
  | grep -E "^decode" | sed 's/^/[no stream-k] /' >> "$S"
for s in ${BENCH-gemv}; do
  { echo "== bench $s (graph-timed)"; grep -E "^(gemv|attn|gemm|norm)" "$L/ab_bench_$s.log"; } >> "$S"
done
echo "== done at $((SECONDS - t0)) s" >> "$S"
tar czf /tmp/logs.tgz -C "$L" . && mv /tmp/logs.tgz "$OUT/logs.tgz"
grep -vE "^(gemv|attn decode)" "$S"
