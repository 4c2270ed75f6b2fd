#!/usr/bin/env bash
# The agent features on the GPU in one call: the CUDA sampler with grammar masks against the CPU
# (test_backend_ops, the sample cases), the gpu-marked structured-output tests (masks in the CUDA sampler), and
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
cmake --build "$BUILD" -j"$(nproc)" --target test_backend_ops >> "$OUT/build.log" 2>&1 || { echo "test build FAILED"; exit 1; }
"$BUILD/test_backend_ops" --backend cuda sample > "$OUT/test_sampling.log" 2>&1; echo "test_backend_ops sample rc=$?"
tail -6 "$OUT/test_sampling.log"
python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q tests/test_gpu_structured.py 2>&1 | tail -5
python3 tools/agent_session.py --shape 27b --device cuda --tool-tokens 3000 --max-model-len 65536 \
  --json "$OUT/agent_27b.json" --png "$OUT/agent_27b.png" 2>&1 | grep -v "memory plan" | tail -20
