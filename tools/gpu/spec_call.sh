#!/usr/bin/env bash
# Issue 38's GPU speed checks in one device call (repo root): the 27B verify / decode step ratios
# (bench_spec_gpu.py), then the default model's tokens/s with spec off / MTP / DFlash at batch 1
# (engine option cuda_graphs off and on) and 8 (bench_spec.py --device cuda), then the step times
# around rejections (spec_step_times.py --device cuda). Each part gets at most its cap and what is
# left of LIMIT. The library: LIB_XZ (an sm_90 build made on the dev machine,
# e.g. -DCMAKE_CUDA_ARCHITECTURES=90-real, stripped and xz'd so it travels with the tree: ~7 MB),
# else built here (tools/gpu/pytest_gpu.sh, ~140 s on the H200). Wheels from WHEELS (default .whl;
# cffi and pycparser are all the benchmarks need). LIMIT (default 590): the call's seconds.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/spec_call; rm -rf $L; mkdir -p $L; S="$OUT/summary.txt"
t0=$SECONDS; el() { echo $((SECONDS - t0)); }; LIMIT=${LIMIT:-590}
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d $d ] && PATH=$PATH:$d; done
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$S"
if [ -n "${LIB_XZ:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${WHEELS:-.whl}"/*.whl > $L/wheels.log 2>&1
  xz -dc "$LIB_XZ" > /tmp/libpyengine.so && LIB=/tmp/libpyengine.so
else
  ARCHS=90 BUILD_ONLY=1 OUT=$L bash tools/gpu/pytest_gpu.sh > $L/build.log 2>&1 || echo "build FAILED" >> "$S"
  LIB=$ROOT/build/dev/libpyengine.so
fi
echo "== library at $(el) s" >> "$S"
export PYENGINE_LIBRARY=$LIB PYTHONPATH=$ROOT:/tmp/site
run() { local name=$1 limit=$2; shift 2; local left=$((LIMIT - $(el))); [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -le 5 ] && { echo "== $name skipped (no time left)" >> "$S"; return; }
  timeout "$limit" "$@" 2>&1 | grep -v "memory plan" > $L/$name.log
  echo "== $name rc $? at $(el) s" >> "$S"; grep -v '^{' $L/$name.log >> "$S"; }
run bench_27b 150 python3 tools/bench_spec_gpu.py --k 3 7 --batch 1 8 --tokens 64 --accepted-length 2.52
run bench_b1 150 python3 tools/bench_spec.py --device cuda --runs 3
run bench_b8 120 python3 tools/bench_spec.py --device cuda --runs 3 --batch 8
run bench_b1_graphs 120 python3 tools/bench_spec.py --device cuda --runs 3 --cuda-graphs
run step_times 100 python3 tools/spec_step_times.py --device cuda
tar czf "$OUT/spec_call_logs.tgz" -C $L .
cat "$S"
