#!/usr/bin/env bash
# Builds the FP8 GEMM lab (fp8_gemm_lab.cu: CUTLASS sm_90a W8A8 GEMM + this tree's
# pe::cuda::linear_gemm as the baseline, compiled in) and packs it for a GPU machine:
#
#   tools/gpu/lab/fp8_gemm/build.sh DEST        (repo root; nvcc 12.4+ / 13; ~3 min on 2 cores)
#
# DEST (an ignored folder the device call carries, e.g. .ab/fp8pack) gets
#   fp8_gemm_lab.xz   the lab, stripped, static cudart and libstdc++ (needs the driver and glibc 2.36)
#   src.tar.xz        its sources and the CUTLASS headers it includes: run.sh builds from them where
#                     the binary does not start (an older glibc on the GPU machine's image)
#   run.sh, BUILD_INFO
# The GPU machine runs `bash DEST/run.sh DEST [lab args]` (run.sh says more).
# CUTLASS: the headers of the nvidia-cutlass wheel (CUTLASS_WHEEL, default the 4.2.0.0 one in
# /tmp/cutl), unpacked once into .ab/cutlass (ignored). BUILD (default .ab/fp8build) holds the
# objects; JOBS (default 2) compiles at once; BASELINE=0 leaves the library's GEMM out; DEST "-"
# builds BUILD/fp8_gemm_lab only (what run.sh does on the GPU machine).
set -euo pipefail
DEST="${1:?usage: build.sh DEST}"
L=tools/gpu/lab/fp8_gemm
WHEEL="${CUTLASS_WHEEL:-/tmp/cutl/nvidia_cutlass-4.2.0.0-py3-none-any.whl}"
CU=.ab/cutlass
B="${BUILD:-.ab/fp8build}"
mkdir -p "$B"
if [ ! -d "$CU/cutlass_library/source/include" ]; then
  mkdir -p "$CU"
  python3 - "$WHEEL" "$CU" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("cutlass_library/source/")
                               and ("/include/" in n or "/examples/67_" in n)])
EOF
fi
INC="-I $CU/cutlass_library/source/include -I $CU/cutlass_library/source/tools/util/include -I native/src -I native/include -I $L"
SM90A="-gencode arch=compute_90a,code=sm_90a"
NV="nvcc -std=c++17 -O3 -DNDEBUG -DPE_WITH_CUDA=1 --expt-relaxed-constexpr $INC"
LABDEF=""
[ "${BASELINE:-1}" = 0 ] && LABDEF=-DPE_LAB_NO_BASELINE
t0=$SECONDS
pids=()
join() { for p in "${pids[@]}"; do wait "$p"; done; pids=(); }  # fails (set -e) when a job failed
bg() {
  if [ "${#pids[@]}" -ge "${JOBS:-2}" ]; then join; fi
  "$@" &
  pids+=($!)
}
# The four CUTLASS parts take about a minute each; the library's GEMM (its CMake flags: -O3
# --use_fast_math, sm_90) and the lab's main half that.
rm -f "$B"/*.o "$B/fp8_gemm_lab"
OBJS=""
for part in 0 1 2 3; do
  bg $NV $SM90A -DPE_FP8_PART=$part -c $L/fp8_gemm_sm90.cu -o "$B/gemm_p$part.o"
  OBJS="$OBJS $B/gemm_p$part.o"
done
if [ -z "$LABDEF" ]; then
  bg $NV --use_fast_math -gencode arch=compute_90,code=sm_90 -c native/src/kernels/cuda/linear_gemm.cu \
    -o "$B/linear_gemm.o"
  OBJS="$OBJS $B/linear_gemm.o"
fi
bg $NV $SM90A $LABDEF -c $L/fp8_gemm_lab.cu -o "$B/lab.o"
join
nvcc -cudart static -Xcompiler=-static-libstdc++,-static-libgcc $OBJS "$B/lab.o" -o "$B/fp8_gemm_lab"
strip "$B/fp8_gemm_lab"
echo "built $B/fp8_gemm_lab in $((SECONDS - t0)) s"
[ "$DEST" = - ] && exit 0

mkdir -p "$DEST"
xz -9 -T2 -c "$B/fp8_gemm_lab" > "$DEST/fp8_gemm_lab.xz"
# The sources run.sh would build from: every file under this tree the three translation units
# include (nvcc -M), the CUTLASS headers among them.
deps() { $NV $SM90A "$@" -M | tr ' \\' '\n\n' | grep -v -e '^/' -e ':$' -e '^$' -e '\.o$' || true; }
{
  for part in 0 1 2 3; do deps -DPE_FP8_PART=$part $L/fp8_gemm_sm90.cu; done
  deps $L/fp8_gemm_lab.cu
  deps native/src/kernels/cuda/linear_gemm.cu
  ls $L/*
} | sed 's#^\./##' | sort -u > "$B/src.list"
tar -cJf "$DEST/src.tar.xz" -T "$B/src.list"
cp $L/run.sh "$DEST/run.sh"
{
  echo "commit $(git rev-parse HEAD 2> /dev/null || echo '?')$(git diff --quiet HEAD -- $L native/src 2> /dev/null || echo ' + local changes')"
  echo "nvcc $(nvcc --version | grep -o 'release [0-9.]*')"
  echo "cutlass $(basename "$WHEEL")"
  echo "baseline ${BASELINE:-1}"
} > "$DEST/BUILD_INFO"
ls -l "$DEST"
