#!/usr/bin/env bash
# GPU machine (sm_90: H100 / H200): runs the FP8 GEMM lab packed by build.sh. Needs nothing of the
# checkout but the pack:
#
#   bash DEST/run.sh DEST [fp8_gemm_lab args: --reps R --quick --no-pe]
#
# Where the packed binary does not start (it wants glibc 2.36), it is built from the pack's
# src.tar.xz with the machine's nvcc first (~2 min on 16 cores; build.log). Logs go to OUT
# (default /tmp/out): gpu.txt (nvidia-smi), fp8_gemm_lab.log (the lab's output), BUILD_INFO. The
# lab itself should take well under a minute (it is cut at 300 s); where it dies of a CUDA error,
# each GEMM variant is run alone after it (fp8_gemm_lab_v*.log).
set -u -o pipefail
P="$(cd "${1:-$(dirname "$0")}" && pwd)"
shift || true
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
W="$(mktemp -d /tmp/fp8_gemm_lab.XXXXXX)"
cp "$P/BUILD_INFO" "$OUT/" 2> /dev/null && cat "$P/BUILD_INFO"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader |
  tee "$OUT/gpu.txt"
xz -dc "$P/fp8_gemm_lab.xz" > "$W/fp8_gemm_lab" && chmod +x "$W/fp8_gemm_lab"
help="$("$W/fp8_gemm_lab" --help 2>&1)"  # the usage line (exit 2), or the loader's complaint
if [[ "$help" != *usage:* ]]; then
  echo "packed binary does not start here (${help%%$'\n'*}); building it"
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -d $d ] && PATH=$PATH:$d; done
  mkdir -p "$W/src" && tar -xJf "$P/src.tar.xz" -C "$W/src"
  (cd "$W/src" && BUILD="$W/build" JOBS=$(nproc) bash tools/gpu/lab/fp8_gemm/build.sh -) > "$OUT/build.log" 2>&1 ||
    { echo "build failed:"; tail -30 "$OUT/build.log"; exit 1; }
  tail -1 "$OUT/build.log"
  cp "$W/build/fp8_gemm_lab" "$W/fp8_gemm_lab"
fi
t0=$SECONDS
timeout 300 "$W/fp8_gemm_lab" "$@" > "$OUT/fp8_gemm_lab.log" 2>&1
rc=$?
cat "$OUT/fp8_gemm_lab.log"
echo "fp8_gemm_lab rc=$rc ($((SECONDS - t0)) s)"
# A CUDA error ends the process (the context is lost): then each GEMM variant alone, so one that
# faults does not hide the others.
if [ $rc -ne 0 ] && [ $# -eq 0 ] && grep -q "CUDA error" "$OUT/fp8_gemm_lab.log"; then
  for v in 1 2 3 4; do
    [ $((SECONDS - t0)) -lt 360 ] || break
    timeout 90 "$W/fp8_gemm_lab" --variants $v --reps 5 > "$OUT/fp8_gemm_lab_v$v.log" 2>&1
    echo "== variant $v alone: rc=$?"
    grep -vE "^columns" "$OUT/fp8_gemm_lab_v$v.log" | tail -n 14
  done
fi
exit $rc
