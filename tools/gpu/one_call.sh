#!/usr/bin/env bash
# Every issue-6 check that fits one device call (600 s), for the end of a session: build (75;90)
# + test_cuda_linear (the GEMV's default PDL path and the no-PDL path); the full 27B bench
# (decode, prefill 4K/32K, depth table) and a decode A/B without PDL; the sm_75 PTX-JIT op tests;
# memcheck on the op tests (`pytest -m gpu -k memcheck`). Each stage
# has its own time limit and appends to summary.txt, so a late stage running out leaves the rest.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; L=/tmp/one_call_logs; rm -rf "$L"; mkdir -p "$L"; S="$OUT/summary.txt"
t0=$SECONDS
TESTS="test_cuda_linear" BENCH="" DECODE=0 OUT="$L" bash tools/gpu/kernel_ab.sh >> "$S" 2>&1
export PYENGINE_LIBRARY="$ROOT/build/dev/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site:${PYTHONPATH:-}"
# While the GPU runs the bench: every op test of build/dev (memcheck) and the compute_75 build.
( cmake --build build/dev -j"$(nproc)" > "$L/build_all.log" 2>&1
  cmake -S . -B build/sm75 -G Ninja -DPYENGINE_CUDA=ON -DPYENGINE_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="75-virtual" \
    > "$L/build_sm75_pre.log" 2>&1 && cmake --build build/sm75 -j"$(nproc)" >> "$L/build_sm75_pre.log" 2>&1 ) &
BG=$!
timeout 200 python3 tools/bench_gpu.py --decode-tokens 48 --out "$L/bench.json" 2>&1 | grep -v "memory plan" > "$L/bench.log"
{ echo "== bench at $((SECONDS - t0)) s"; grep -v '^{' "$L/bench.log"; } >> "$S"
PYENGINE_GEMV_PDL=0 timeout 60 python3 tools/bench_gpu.py --skip-depth --prefill-sizes --decode-tokens 48 2>&1 \
  | grep -E "^decode" | sed 's/^/[no pdl] /' >> "$S"
wait $BG
echo "== sm75 at $((SECONDS - t0)) s" >> "$S"
OUT="$L" timeout 170 bash tools/gpu/sm75_tests.sh >> "$S" 2>&1
echo "== memcheck at $((SECONDS - t0)) s" >> "$S"
# The memcheck test of `pytest -m gpu` (tests/test_gpu_ops.py), as check_all.sh runs it.
OUT="$L" timeout $((555 - (SECONDS - t0))) bash tools/gpu/pytest_gpu.sh tests/test_gpu_ops.py -q -k memcheck \
  2>&1 | tail -5 >> "$S"
echo "== done at $((SECONDS - t0)) s" >> "$S"
tar czf /tmp/logs.tgz -C "$L" . && mv /tmp/logs.tgz "$OUT/logs.tgz"
cat "$S"
