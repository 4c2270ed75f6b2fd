#!/usr/bin/env bash
# Builds the lab programs (tools/gpu/lab/*/*_lab.cu) against a CUDA build of the library, from the
# repo root on a machine with nvcc:
#   tools/gpu/lab/build.sh [BUILD_DIR]    (default build/lab; ARCH=90 by default, e.g. ARCH=75)
# Configures and builds the library's static archives in BUILD_DIR, then links each lab file with
# them into BUILD_DIR/bin/<name>. The lab is not part of the library's CMake build: its kernels
# are the variants that lost, kept with their reference and benchmark (README.md here).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"; cd "$ROOT"
B="${1:-build/lab}"; ARCH="${ARCH:-90}"
cmake -S . -B "$B" -G Ninja -DPYENGINE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" > /dev/null
cmake --build "$B" --target pyengine_core pyengine_cuda
mkdir -p "$B/bin"
for src in tools/gpu/lab/*/*_lab.cu; do
  name="$(basename "$src" .cu)"
  nvcc -O3 -std=c++17 -arch="sm_$ARCH" --use_fast_math -lineinfo -I native/include -I native/src "$src" \
    -Xlinker --start-group "$B/libpyengine_core.a" "$B/libpyengine_cuda.a" -Xlinker --end-group \
    -lpthread -ldl -o "$B/bin/$name"
  echo "built $B/bin/$name"
done
