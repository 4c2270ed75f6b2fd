#!/usr/bin/env bash
# The op harness (test_backend_ops --backend cuda) built as compute_75 PTX only, so the driver
# JIT-compiles the sm_75 code path (m16n8k8 mma, no sm_80 instructions) and runs it on whatever
# GPU this is; small sizes
# (PE_TEST_SMALL=1). Repo root; logs in $OUT (build_sm75.log, tests_sm75.log); prints one summary
# line "sm_75 PTX JIT: ..." and exits non-zero on a failure. Env: OUT, B75 (build dir), JOBS,
# FILTER (an op name filter of the harness, e.g. "attention"; default: every op).
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; B75="${B75:-build/sm75}"; JOBS="${JOBS:-$(nproc)}"; mkdir -p "$OUT"
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
if ! { cmake -S . -B "$B75" $GEN -DPYENGINE_CUDA=ON -DPYENGINE_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="75-virtual" \
         > "$OUT/build_sm75.log" 2>&1 &&
       cmake --build "$B75" -j"$JOBS" --target test_backend_ops >> "$OUT/build_sm75.log" 2>&1; }; then
  echo "sm_75 PTX JIT: build FAILED (build_sm75.log)"; tail -20 "$OUT/build_sm75.log"; exit 1
fi
: > "$OUT/tests_sm75.log"; rc=0
PE_TEST_SMALL=1 timeout 300 "$B75/test_backend_ops" --backend cuda ${FILTER:-} >> "$OUT/tests_sm75.log" 2>&1 ||
  { rc=1; echo "### FAILED test_backend_ops" >> "$OUT/tests_sm75.log"; }
echo "sm_75 PTX JIT: $([ $rc = 0 ] && echo ok || echo FAILED), $(tail -1 "$OUT/tests_sm75.log")," \
     "$(grep -c ' ok$' "$OUT/tests_sm75.log") cases ok, $(grep -c 'FAIL' "$OUT/tests_sm75.log") FAIL lines$(grep -q 'SKIP: no CUDA device' "$OUT/tests_sm75.log" && echo ' (SKIP: no CUDA device)')"
grep -E "FAIL" "$OUT/tests_sm75.log" | head -10
exit $rc
