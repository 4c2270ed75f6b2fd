#!/usr/bin/env bash
# The session-6 candidates on this branch in one device call (repo root; carry .whl):
#   build (75;90); test_cuda_ops / _attention / _gdn_decode / _glue / _linear (every kernel now
#   launched with launch_pdl, and the depth-chosen decode-attention defaults); bench_kernels
#   --only attn; the 27B decode bench with the depth table, then again with PYENGINE_PDL=0 (the
#   GEMV keeps its own PDL) for the A/B. A second call runs `tools/gpu/pytest_gpu.sh` (the
#   goldens) before main takes the branch. Returns summary.txt + logs.tgz only.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; L=/tmp/s6logs; rm -rf "$L"; mkdir -p "$L"; S="$OUT/summary.txt"
t0=$SECONDS
TESTS="test_cuda_ops test_cuda_attention test_cuda_gdn_decode test_cuda_glue test_cuda_linear" BENCH="attn" \
  DECODE=1 DEPTH=1 OUT="$L" timeout 480 bash tools/gpu/kernel_ab.sh >> "$S" 2>&1
export PYENGINE_LIBRARY="$ROOT/build/dev/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site:${PYTHONPATH:-}"
PYENGINE_PDL=0 timeout 60 python3 tools/bench_gpu.py --skip-depth --prefill-sizes --decode-tokens 48 2>&1 \
  | grep -E "^decode" | sed 's/^/[PYENGINE_PDL=0] /' >> "$S"
{ echo "== bench attn (graph-timed)"; grep -vE "eager" "$L/ab_bench_attn.log"; echo "== done at $((SECONDS - t0)) s"; } >> "$S"
tar czf /tmp/logs.tgz -C "$L" . && mv /tmp/logs.tgz "$OUT/logs.tgz"
cat "$S"
