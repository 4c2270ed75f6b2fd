#!/usr/bin/env bash
# Builds the library with the CUDA backend on the GPU machine and runs `pytest -m gpu` against it.
#   tools/gpu/pytest_gpu.sh [pytest args...]        (repo root; OUT defaults to /tmp/out)
# Env: ARCHS (CMAKE_CUDA_ARCHITECTURES, default "75;90"), BUILD (default build/dev), BUILD_ONLY=1
# (build the library, install the wheels, run nothing), CMAKE_EXTRA (more -D options, e.g.
# -DCMAKE_BUILD_TYPE=RelWithDebInfo).
# Wheels the machine lacks (cffi, flask, ...) are taken from .whl when it is there
# (../shared/device/wheels.sh fetches them; name .whl in the device call's carry).
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
BUILD="${BUILD:-build/dev}"
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/wheels.log" 2>&1 && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
t0=$SECONDS
cmake -S . -B "$BUILD" $GEN -DPYENGINE_CUDA=ON -DPYENGINE_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="${ARCHS:-75;90}" \
  ${CMAKE_EXTRA:-} > "$OUT/build.log" 2>&1 && cmake --build "$BUILD" -j"$(nproc)" --target pyengine >> "$OUT/build.log" 2>&1 \
  || { echo "build FAILED"; grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
echo "build ok ($((SECONDS - t0)) s)"
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0  # the library (and wheels in /tmp/site) only
export PYENGINE_LIBRARY="$ROOT/$BUILD/libpyengine.so" PYTHONPATH="$ROOT:${PYTHONPATH:-}" PYENGINE_GPU_BUILD="$ROOT/$BUILD"
python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" "$@" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -40
