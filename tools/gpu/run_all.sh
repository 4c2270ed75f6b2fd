#!/usr/bin/env bash
# One-command GPU check of the CUDA kernels (for the lent H200 or any CUDA machine):
#   1. configure + build (CUDA archs 75;90, tests on)          -> $OUT/build.log
#   2. test_backend_ops --backend cuda (every CUDA op vs the CPU) -> $OUT/tests.log
#   3. the same tests built as compute_75 PTX only, so the driver JIT-compiles the sm_75 code
#      path (m16n8k8 mma, no sm_80 instructions) and runs it  -> $OUT/tests_sm75.log
#   4. compute-sanitizer memcheck on every test, small sizes  -> $OUT/memcheck_*.log
#   5. micro-benchmark vs measured copy bandwidth            -> $OUT/bench.log
# Every stage runs even if an earlier one failed (except those needing the build); a summary
# table prints last. Usage (repo root): tools/gpu/run_all.sh [--quick]   OUT defaults to /tmp/out.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${OUT:-/tmp/out}"
BUILD="${BUILD:-/tmp/pe_build_gpu}"
QUICK="${1:-}"
JOBS="${JOBS:-16}"
mkdir -p "$OUT"
declare -a NAMES RESULTS
record() { NAMES+=("$1"); RESULTS+=("$2"); echo "== $1: $2"; }
skipped() { grep -q "SKIP: no CUDA device" "$1" 2>/dev/null && echo " (SKIP: no CUDA device)"; }
t0=$SECONDS

# Build tools may live in the torch venv (cmake, ninja): take them if they are not on PATH.
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
nvcc --version >> "$OUT/gpu.txt" 2>&1

# 1. Build.
if cmake -S "$ROOT" -B "$BUILD" $GEN -DPYENGINE_CUDA=ON -DPYENGINE_TESTS=ON \
     -DCMAKE_CUDA_ARCHITECTURES="75;90" > "$OUT/build.log" 2>&1 &&
   cmake --build "$BUILD" -j"$JOBS" >> "$OUT/build.log" 2>&1; then
  record build "ok ($((SECONDS - t0)) s)"; BUILD_OK=1
else
  record build "FAILED (tail of build.log below)"; BUILD_OK=0; tail -20 "$OUT/build.log"
fi

# 2. CUDA tests.
if [ "$BUILD_OK" = 1 ]; then
  # The harness directly (the ctest -L gpu set), so each case line stays greppable.
  : > "$OUT/tests.log"; rc=0
  timeout 400 "$BUILD/test_backend_ops" --backend cuda >> "$OUT/tests.log" 2>&1 || { rc=1; echo "### rc=$?" >> "$OUT/tests.log"; }
  grep -h "FAIL" "$OUT/tests.log" | head -20
  record "tests (sm_90 SASS)" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc") $(grep -c ' ok$' "$OUT/tests.log") cases ok, $(grep -c 'FAIL$' "$OUT/tests.log") failed$(skipped "$OUT/tests.log")"
  # Worst normalized error per op (the tolerances are in cuda_ops.h).
  awk '/ rel /{for(i=1;i<=NF;i++) if($i=="rel") print $1, $(i+1), $0}' "$OUT/tests.log" |
    sort -k1,1 -k2,2gr | awk '!seen[$1]++' | cut -d' ' -f3- > "$OUT/worst.txt" || true
  # CPU tests still pass in this build.
  (cd "$BUILD" && ctest -LE gpu --timeout 300) > "$OUT/tests_cpu.log" 2>&1
  record "cpu tests" "$([ $? = 0 ] && echo ok || echo FAILED)"
fi

# 3. The sm_75 code path, JIT-compiled from compute_75 PTX (tools/gpu/sm75_tests.sh).
line=$(OUT="$OUT" B75="${BUILD}_sm75" JOBS="$JOBS" bash "$ROOT/tools/gpu/sm75_tests.sh" | head -1)
record "tests (sm_75 PTX JIT)" "${line#sm_75 PTX JIT: }"

# 4. compute-sanitizer memcheck, small sizes (skipped past 420 s: the device call ends at 600).
if [ "$BUILD_OK" = 1 ]; then
  SAN="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  for t in "$BUILD"/test_backend_ops; do [ -x "$t" ] || continue
    n=$(basename "$t")
    if [ $((SECONDS - t0)) -gt 420 ]; then record "memcheck $n" "SKIPPED (time)"; continue; fi
    PE_TEST_SMALL=1 timeout 150 "$SAN" --tool memcheck --leak-check full --error-exitcode 9 "$t" --backend cuda \
      > "$OUT/memcheck_$n.log" 2>&1
    rc=$?
    errs=$(grep -Eo "ERROR SUMMARY: [0-9]+" "$OUT/memcheck_$n.log" | tail -1)
    record "memcheck $n" "$([ $rc = 0 ] && echo clean || echo "FAILED rc=$rc") ${errs}"
  done
fi

# SASS facts (no cuobjdump on the developer machine): tensor-core and local-memory instructions
# per architecture in the library.
if [ "$BUILD_OK" = 1 ] && command -v cuobjdump >/dev/null; then
  for a in 75 90; do
    cuobjdump --dump-sass -arch sm_$a "$BUILD/libpyengine_cuda.a" > "$OUT/sass_sm$a.txt" 2>&1
    record "sass sm_$a" "HMMA $(grep -c HMMA "$OUT/sass_sm$a.txt"), LDSM $(grep -c LDSM "$OUT/sass_sm$a.txt"), LDL/STL $(grep -cE 'LDL|STL' "$OUT/sass_sm$a.txt")"
  done
fi

# 5. Micro-benchmark.
if [ "$BUILD_OK" = 1 ]; then
  if [ -x "$BUILD/bench_kernels" ]; then  # a CMake target of the test build above
    left=$((570 - (SECONDS - t0))); [ $left -lt 60 ] && QUICK=--quick; [ $left -lt 20 ] && left=20
    timeout $left "$BUILD/bench_kernels" $QUICK > "$OUT/bench.log" 2>&1
    record bench "$([ $? = 0 ] && echo ok || echo FAILED) (bench.log)"
  else
    record bench "not built (build.log)"
  fi
fi

echo
echo "================ bench (key lines) ================"
grep -E "copy|n=1$|n=8$|gemm|attn|gdn" "$OUT/bench.log" 2>/dev/null | grep -vE "n=2$|n=4$" | head -40
echo "================ worst test errors ================"
cat "$OUT/worst.txt" 2>/dev/null
echo "================ summary ($((SECONDS - t0)) s, logs in $OUT) ================"
for i in "${!NAMES[@]}"; do printf "%-34s %s\n" "${NAMES[$i]}" "${RESULTS[$i]}"; done
