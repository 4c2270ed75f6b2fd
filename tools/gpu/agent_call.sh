#!/usr/bin/env bash
# Issue 41 on the GPU in one call: the CUDA grammar-mask op against its CPU twin
# (test_cuda_sampling), the gpu-marked structured-output tests (masks in the CUDA sampler), and
# the agent session on the 27B shape with dummy FP8 weights (15 turns, tool results of 3,000
# tokens; its JSON and, where matplotlib is installed, its plot go to $OUT).
#   ../shared/device/wheels.sh llguidance==1.9.1     (here, once: the wheel the GPU machine lacks)
#   tools/gpu/agent_call.sh                          (device call from the repo root, carry .whl)
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
BUILD="${BUILD:-build/dev}"
BUILD_ONLY=1 BUILD="$BUILD" tools/gpu/pytest_gpu.sh || exit 1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PYENGINE_LIBRARY="$ROOT/$BUILD/libpyengine.so" PYTHONPATH="$ROOT:${PYTHONPATH:-}"
cmake --build "$BUILD" -j"$(nproc)" --target test_cuda_sampling >> "$OUT/build.log" 2>&1 || { echo "test build FAILED"; exit 1; }
"$BUILD/test_cuda_sampling" > "$OUT/test_cuda_sampling.log" 2>&1; echo "test_cuda_sampling rc=$?"; tail -4 "$OUT/test_cuda_sampling.log"
grep "token mask" "$OUT/test_cuda_sampling.log" | tail -6
python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q tests/test_gpu_structured.py 2>&1 | tail -5
python3 tools/agent_session.py --shape 27b --device cuda --tool-tokens 3000 --max-model-len 65536 \
  --json "$OUT/agent_27b.json" --png "$OUT/agent_27b.png" 2>&1 | grep -v "memory plan" | tail -20
