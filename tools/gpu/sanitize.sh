#!/usr/bin/env bash
# compute-sanitizer on the CUDA op harness (native/tests/test_backend_ops --backend cuda), small sizes (PE_TEST_SMALL=1):
#   memcheck (out-of-bounds and misaligned accesses, leaks), racecheck (shared-memory hazards),
#   synccheck (barriers misused) and initcheck (reads of uninitialized device memory).
# Usage (repo root, on the GPU machine): tools/gpu/sanitize.sh [tools...] [-- binaries...]
#   TOOLS default "memcheck racecheck synccheck initcheck"; OUT (default /tmp/out) gets
#   sanitize_<tool>_<binary>.log and summary.txt; BUILD (default /tmp/pe_build_san) the build;
#   LIMIT (default 570) the seconds the whole script may take (the rest is SKIPPED, so a device
#   call of 600 s always returns a summary). Exit status 0 only when every run was clean.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; BUILD="${BUILD:-/tmp/pe_build_san}"; LIMIT="${LIMIT:-570}"; mkdir -p "$OUT"
S="$OUT/summary.txt"; : > "$S"; t0=$SECONDS; rc_all=0
tools=(); bins=()
while [ $# -gt 0 ]; do [ "$1" = "--" ] && { shift; bins=("$@"); break; }; tools+=("$1"); shift; done
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck synccheck initcheck)
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done
SAN="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
if ! { cmake -S . -B "$BUILD" $GEN -DPYENGINE_CUDA=ON -DPYENGINE_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="${ARCHS:-90}" \
         > "$OUT/sanitize_build.log" 2>&1 && cmake --build "$BUILD" -j"$(nproc)" >> "$OUT/sanitize_build.log" 2>&1; }; then
  echo "build FAILED (sanitize_build.log)" | tee -a "$S"; exit 1
fi
echo "== built in $((SECONDS - t0)) s" >> "$S"
[ ${#bins[@]} -gt 0 ] || bins=("$BUILD"/test_backend_ops)
for tool in "${tools[@]}"; do
  extra=""
  [ "$tool" = memcheck ] && extra="--leak-check full"
  for b in "${bins[@]}"; do
    n=$(basename "$b"); log="$OUT/sanitize_${tool}_${n}.log"
    left=$((LIMIT - (SECONDS - t0)))
    if [ $left -lt 20 ]; then printf "%-10s %-24s SKIPPED (time)\n" "$tool" "$n" >> "$S"; rc_all=1; continue; fi
    # shellcheck disable=SC2086
    PE_TEST_SMALL=1 timeout "$((left - 5))" "$SAN" --tool "$tool" $extra --error-exitcode 9 "$b" --backend cuda > "$log" 2>&1
    rc=$?
    summary=$(grep -Eo "(ERROR|RACECHECK) SUMMARY: [0-9]+[^.]*" "$log" | tail -1)
    fails=$(grep -c "FAIL$" "$log")
    if [ $rc = 0 ] && [ "$fails" = 0 ]; then verdict=clean; else verdict="FAILED rc=$rc, $fails failed cases"; rc_all=1; fi
    printf "%-10s %-24s %s (%s, %d s)\n" "$tool" "$n" "$verdict" "${summary:-no summary}" "$((SECONDS - t0))" >> "$S"
  done
done
cat "$S"
exit $rc_all
