#!/usr/bin/env bash
# The GPU checks (repo root, on the GPU machine); each stage can be left out so the work
# fits the device's per-call limit:
#   1. pytest -m gpu: tests/test_gpu_model.py (model on CUDA vs transformers and the CPU engine,
#      KV dtypes, weight formats, CUDA graphs, 1,000 requests) and tests/test_gpu_ops.py (every
#      CUDA op vs its CPU twin; memcheck when MEMCHECK=1)                   (SKIP_PYTEST=1: off)
#   2. SM75=1: the op tests built as compute_75 PTX only and JIT-compiled, so the sm_75 code path
#      (m16n8k8 mma, no sm_80 instructions) runs on this GPU, at small sizes
#   3. tools/bench_gpu.py (27B dummy FP8: decode, prefill, KV depth table; --hf in BENCH_ARGS for
#      transformers)                                                         (SKIP_BENCH=1: off)
#   4. PROFILE=1: per-kernel time of 27B batch-1 decode steps under ncu (tools/gpu/profile_decode.py);
#      NCU_CACHE=all flushes the caches before each kernel (ncu's default),
#      NCU_CACHE=none (default here) keeps them as the step left them, as in a real decode step
# Env: OUT (default /tmp/out), BENCH_ARGS (extra bench flags), PYTEST_ARGS.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export ARCHS="${ARCHS:-75;90}"
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done
t0=$SECONDS
if [ "${SKIP_PYTEST:-0}" != 1 ]; then
  sel="not memcheck"; [ "${MEMCHECK:-0}" = 1 ] && sel=""
  bash tools/gpu/pytest_gpu.sh tests/test_gpu_model.py tests/test_gpu_ops.py -q -s -rA ${PYTEST_ARGS:-} ${sel:+-k "$sel"} \
    > "$OUT/pytest_full.log" 2>&1
  grep -E "passed|failed|error|rel |kv |weight_quant|requests:|FAIL" "$OUT/pytest_full.log" | tail -60
  echo "== pytest stage done at $((SECONDS - t0)) s"
else
  BUILD_ONLY=1 bash tools/gpu/pytest_gpu.sh || exit 1
fi
nm -C build/dev/libpyengine.so | grep -c " [TW] std::ostream" | sed 's/^/exported std::ostream symbols: /'
if [ "${SM75:-0}" = 1 ]; then
  OUT="$OUT" bash tools/gpu/sm75_tests.sh; echo "== sm_75 stage done at $((SECONDS - t0)) s"
fi
export PYENGINE_LIBRARY="$ROOT/build/dev/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site:${PYTHONPATH:-}"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 tools/bench_gpu.py --out "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | grep -v "memory plan" | tee "$OUT/bench.log" | tail -45
  echo "== bench done at $((SECONDS - t0)) s"
fi
if [ "${PROFILE:-0}" = 1 ]; then
  ncu --clock-control none --cache-control "${NCU_CACHE:-none}" --metrics gpu__time_duration.sum --csv \
    --launch-skip 5000 --launch-count 1450 \
    python3 tools/gpu/profile_decode.py > "$OUT/ncu.csv" 2> "$OUT/ncu.err" || tail -5 "$OUT/ncu.err"
  python3 tools/gpu/profile_decode.py --summarize "$OUT/ncu.csv" | tee "$OUT/profile.txt" | head -30
fi
