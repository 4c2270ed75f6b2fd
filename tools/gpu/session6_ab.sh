#!/usr/bin/env bash
# The session-6 A/B call (repo root; carry .whl): build (75;90); test_cuda_attention (with the
# split-length cases) and test_cuda_linear; bench_kernels --only attn (variants and the
# "msk=N" split-length rows to 8K); the 27B decode bench with the depth table (fp16 measured
# again last, the run's drift). Returns summary.txt + logs.tgz only.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; L=/tmp/s6logs; rm -rf "$L"; mkdir -p "$L"; S="$OUT/summary.txt"
t0=$SECONDS
TESTS="${TESTS:-test_cuda_attention test_cuda_linear}" BENCH="attn" \
  DECODE=1 DEPTH=1 OUT="$L" timeout 560 bash tools/gpu/kernel_ab.sh >> "$S" 2>&1
{ echo "== bench attn (graph-timed, depth <= 8K)"; grep -E "^attn decode .*depth=(1024|8192)" "$L/ab_bench_attn.log"
  echo "== done at $((SECONDS - t0)) s"; } >> "$S"
tar czf /tmp/logs.tgz -C "$L" . && mv /tmp/logs.tgz "$OUT/logs.tgz"
grep -vE "^attn decode" "$S"
