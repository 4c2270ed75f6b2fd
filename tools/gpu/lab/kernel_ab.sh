#!/usr/bin/env bash
# One short device call for kernel work (repo root on the GPU machine; carry .whl for DECODE=1):
#   build the library and the named op tests (archs 75;90), run each test, bench_kernels --only
#   for each BENCH section (A/B rows of the kernels behind tuning hooks), and with DECODE=1 the 27B
#   decode bench (batch 1, 2, 8). Logs in $OUT/ab_*.log; the summary lines print.
#   FILTER="linear" BENCH="gemv attn" DECODE=1 OUT=$OUT tools/gpu/lab/kernel_ab.sh
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; B=build/dev
TESTS="test_backend_ops"; FILTER="${FILTER-linear}"; BENCH="${BENCH-gemv}"; DECODE="${DECODE:-0}"  # BENCH="": none
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done
t0=$SECONDS
# The library (and the wheels in /tmp/site) as pytest_gpu.sh builds them, then the named targets.
BUILD="$B" BUILD_ONLY=1 OUT="$OUT" bash tools/gpu/pytest_gpu.sh > "$OUT/ab_build.log" 2>&1 &&
  cmake --build $B -j"$(nproc)" --target $TESTS ${BENCH:+bench_kernels} >> "$OUT/ab_build.log" 2>&1 ||
  { echo "build FAILED"; grep -E "error" "$OUT/ab_build.log" "$OUT/build.log" | head -20; exit 1; }
echo "== build ok at $((SECONDS - t0)) s"
for t in $TESTS; do
  timeout 240 $B/$t --backend cuda $FILTER > "$OUT/ab_$t.log" 2>&1
  echo "== $t rc=$? $(tail -1 "$OUT/ab_$t.log") at $((SECONDS - t0)) s"; grep -E "FAIL|NOTE" "$OUT/ab_$t.log" | head -8
done
for s in $BENCH; do
  timeout 150 $B/bench_kernels --only "$s" > "$OUT/ab_bench_$s.log" 2>&1
  echo "== bench $s rc=$? at $((SECONDS - t0)) s"
done
if [ "$DECODE" = 1 ]; then
  # DEPTH=1 adds the depth table (decode step per KV dtype at 1K..64K).
  PYENGINE_LIBRARY="$ROOT/$B/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site" \
    python3 tools/bench_gpu.py $([ "${DEPTH:-0}" = 1 ] || echo --skip-depth) --prefill-sizes --decode-tokens 48 \
    > "$OUT/ab_decode_full.log" 2>&1
  grep -vE '^\{' "$OUT/ab_decode_full.log" | tail -30 | tee "$OUT/ab_decode.log"
  echo "== decode bench done at $((SECONDS - t0)) s"
fi
