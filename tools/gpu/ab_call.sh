#!/usr/bin/env bash
# One A/B device call (repo root; carry .whl): build (75;90) and run the op tests in TESTS
# (the op harness, ops matching FILTER, default linear); bench_kernels --only for each BENCH section (default gemv); the 27B
# decode bench (batch 1, 2, 8; DEPTH=1 adds the depth table) with the default tuning, then once
# more for each assignment in DECODE_ENVS (e.g. "PYENGINE_GEMV_PREFETCH=1 PYENGINE_GEMV_STREAM_K=0",
# one decode-only run each; "A=1,B=2" sets both; repeat words for interleaved rounds); TIMELINE_ENVS
# as DECODE_ENVS ("-": none), the step's kernel timeline under each; with PROFILE_KV (e.g. "fp16
# fp8_e4m3") the per-kernel time of decode steps of the depth table's model at 1K context (ncu) for
# each KV dtype; with PYTEST_K (a -k
# expression) `pytest -m gpu` on tests/test_gpu_model.py with that selection (e.g. "graphs").
# Returns summary.txt + logs.tgz only (the device call brings back few files).
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; L=/tmp/ablogs; rm -rf "$L"; mkdir -p "$L"; S="$OUT/summary.txt"
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done
t0=$SECONDS
FILTER="${FILTER-linear}" BENCH="${BENCH-gemv}" DECODE=1 DEPTH="${DEPTH:-0}" OUT="$L" timeout 420 \
  bash tools/gpu/kernel_ab.sh >> "$S" 2>&1
export PYENGINE_LIBRARY="$ROOT/build/dev/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site:${PYTHONPATH:-}"
for assign in ${DECODE_ENVS:-}; do
  env ${assign//,/ } timeout 75 python3 tools/bench_gpu.py --skip-depth --prefill-sizes --decode-tokens 48 2>&1 \
    | grep -E "^decode" | sed "s/^/[$assign] /" >> "$S"
  echo "== $assign done at $((SECONDS - t0)) s" >> "$S"
done
# TIMELINE_ENVS: timeline_decode.py (CUPTI) under each assignment, its table to logs/timeline_N.log.
i=0
for assign in ${TIMELINE_ENVS:-}; do
  i=$((i + 1)); [ "$assign" = - ] && assign=PYENGINE_NONE=0
  env ${assign//,/ } timeout 120 python3 tools/gpu/timeline_decode.py --steps 20 > "$L/timeline_$i.log" 2>&1
  { echo "== timeline [$assign] at $((SECONDS - t0)) s"; grep -E "^(step wall|gaps|engine token)" "$L/timeline_$i.log"; } >> "$S"
done
for kv in ${PROFILE_KV:-}; do
  # Killed as a group on timeout, so no process keeps the GPU's memory for the next one.
  timeout -k 5 120 setsid ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 tools/gpu/profile_decode.py --kv "$kv" --attention-layers 8 --prompt 1024 --steps 6 \
    > "$L/ncu_$kv.csv" 2> "$L/ncu_$kv.err"
  pkill -9 -f profile_decode.py; sleep 1
  { echo "== $kv KV, 1K context, last 400 kernels (~4 steps), at $((SECONDS - t0)) s"
    python3 tools/gpu/profile_decode.py --summarize "$L/ncu_$kv.csv" --last 400 2>&1 | head -25; } >> "$S"
done
if [ -n "${PYTEST_K:-}" ]; then
  { echo "== pytest -m gpu -k \"$PYTEST_K\" (tests/test_gpu_model.py)"
    timeout 240 python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" tests/test_gpu_model.py -k "$PYTEST_K" -q -s \
      > "$L/pytest.log" 2>&1
    grep -E "max \||passed|failed|Error" "$L/pytest.log" | tail -20
    echo "== pytest done at $((SECONDS - t0)) s"; } >> "$S"
fi
for s in ${BENCH-gemv}; do
  { echo "== bench $s (graph-timed)"; grep -E "^(gemv|attn|gemm|norm)" "$L/ab_bench_$s.log"; } >> "$S"
done
echo "== done at $((SECONDS - t0)) s" >> "$S"
tar czf /tmp/logs.tgz -C "$L" . && mv /tmp/logs.tgz "$OUT/logs.tgz"
grep -vE "^(gemv|attn decode)" "$S"
