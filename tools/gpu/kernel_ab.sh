#!/usr/bin/env bash
# One short device call for kernel work (repo root on the GPU machine; carry .whl for DECODE=1):
#   build the library and the named op tests (archs 75;90), run each test, bench_kernels --only
#   for each BENCH section (A/B rows of the kernels behind tuning hooks), and with DECODE=1 the 27B
#   decode bench (batch 1, 2, 8). Logs in $OUT/ab_*.log; the summary lines print.
#   TESTS="test_cuda_linear test_cuda_ops" BENCH="gemv attn" DECODE=1 OUT=$OUT tools/gpu/kernel_ab.sh
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; B=build/dev
TESTS="${TESTS:-test_cuda_linear}"; BENCH="${BENCH:-gemv}"; DECODE="${DECODE:-0}"
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
t0=$SECONDS
cmake -S . -B $B $GEN -DPYENGINE_CUDA=ON -DPYENGINE_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="75;90" > "$OUT/ab_build.log" 2>&1 &&
  cmake --build $B -j"$(nproc)" --target pyengine $TESTS >> "$OUT/ab_build.log" 2>&1 ||
  { echo "build FAILED"; grep -E "error" "$OUT/ab_build.log" | head -20; exit 1; }
echo "== build ok at $((SECONDS - t0)) s"
for t in $TESTS; do
  timeout 240 $B/$t > "$OUT/ab_$t.log" 2>&1
  echo "== $t rc=$? $(tail -1 "$OUT/ab_$t.log") at $((SECONDS - t0)) s"; grep -E "FAIL|NOTE" "$OUT/ab_$t.log" | head -8
done
if [ -n "$BENCH" ]; then
  nvcc -std=c++17 -O2 -Inative/src -Inative/include tools/gpu/bench_kernels.cpp -Xlinker --start-group \
    $B/libpyengine_core.a $B/libpyengine_cuda.a -Xlinker --end-group -o $B/bench_kernels > "$OUT/ab_bench_build.log" 2>&1 ||
    { echo "bench build FAILED"; tail -5 "$OUT/ab_bench_build.log"; }
  for s in $BENCH; do
    timeout 150 $B/bench_kernels --only "$s" > "$OUT/ab_bench_$s.log" 2>&1
    echo "== bench $s rc=$? at $((SECONDS - t0)) s"
  done
fi
if [ "$DECODE" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
  PYENGINE_LIBRARY="$ROOT/$B/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site" \
    python3 tools/bench_gpu.py --skip-depth --prefill-sizes --decode-tokens 48 2>&1 | grep -E "decode|NVIDIA" | tee "$OUT/ab_decode.log"
  echo "== decode bench done at $((SECONDS - t0)) s"
fi
