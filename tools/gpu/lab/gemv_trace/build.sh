#!/usr/bin/env bash
# The library with per-block timestamps in the quantized GEMV, for gemv_trace.py (repo root on the
# GPU machine):
#   tools/gpu/lab/gemv_trace/build.sh [BUILD_DIR]   (default build/trace; ARCH=90 by default)
# Copies CMakeLists.txt and native/ to BUILD_DIR/src, adds gemv_trace.cuh as
# kernels/cuda/linear_gemv_q_trace.cuh, applies gemv_trace.patch (the stamps in the kernel body)
# and builds BUILD_DIR/libpyengine.so. Then:
#   PYENGINE_LIBRARY=build/trace/libpyengine.so PYTHONPATH=. python3 tools/gpu/lab/gemv_trace/gemv_trace.py
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../../.." && pwd)"; cd "$ROOT"
HERE=tools/gpu/lab/gemv_trace
B="${1:-build/trace}"; ARCH="${ARCH:-90}"
rm -rf "$B/src"; mkdir -p "$B/src"
tar -cf - CMakeLists.txt native | tar -xf - -C "$B/src"
cp "$HERE/gemv_trace.cuh" "$B/src/native/src/kernels/cuda/linear_gemv_q_trace.cuh"
patch -d "$B/src" -p1 < "$HERE/gemv_trace.patch"
cmake -S "$B/src" -B "$B" -G Ninja -DPYENGINE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" > /dev/null
cmake --build "$B" --target pyengine
echo "built $B/libpyengine.so"
