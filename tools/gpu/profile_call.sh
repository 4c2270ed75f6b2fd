#!/usr/bin/env bash
# Profiles for the next kernel work in one device call (repo root; carry .whl; ~250 s):
#   1. ncu sections (speed of light, warp states, instructions, memory, occupancy, launch) of the
#      four GEMVs of a GDN layer (FP8, n = 1) inside a 27B decode step: ncu_gemv.txt;
#   2. per-kernel time of decode steps of the depth table's model (8 attention layers, 1,024-token
#      context) with fp16 and with fp8_e4m3 KV (the quantized KV's cost at 1K): profile_<kv>.txt, and
#      ncu sections of that model's decode attention kernels: ncu_attn_<kv>.txt;
#   3. per-kernel time of batch-1 decode steps of the 64-layer 27B model: profile_27b.txt.
# ncu runs with --clock-control none (the device's METHOD.md: leave the clocks alone).
# summary.txt gathers the key lines; the logs come back as logs.tgz (a device call returns few files).
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; S="$OUT/summary.txt"; L=/tmp/profile_logs; rm -rf "$L"; mkdir -p "$L"
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done
t0=$SECONDS
# A timed-out ncu run is killed as a group (setsid + timeout -k), and any profiled process left is
# killed before the next: one that lives on keeps the GPU's memory.
reap() { pkill -9 -f profile_decode.py 2>/dev/null; sleep 1; }
BUILD_ONLY=1 OUT="$L" bash tools/gpu/pytest_gpu.sh > "$L/build_lib.log" 2>&1 || { echo "build FAILED" >> "$S"; cat "$S"; exit 1; }
export PYENGINE_LIBRARY="$ROOT/build/dev/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site:${PYTHONPATH:-}"
echo "== built at $((SECONDS - t0)) s" >> "$S"
# 1. A 27B decode step launches 4 quantized GEMVs per layer x 64 layers (the bf16 lm_head is
# another kernel; the 16-token prefill runs the GEMM): skip two steps, take layer 0 (GDN) of the third.
timeout -k 5 200 setsid ncu --clock-control none --kernel-name regex:gemv_q_kernel --launch-skip 512 --launch-count 4 \
  --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy \
  --section MemoryWorkloadAnalysis --section LaunchStats \
  python3 tools/gpu/profile_decode.py --steps 4 > "$L/ncu_gemv.txt" 2> "$L/ncu_gemv.err"
echo "== ncu gemv rc=$? at $((SECONDS - t0)) s" >> "$S"
reap
grep -E "gemv_q_kernel|Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc A|Registers Per|Achieved Occupancy|No Eligible|Warp Cycles Per Issued" \
  "$L/ncu_gemv.txt" | head -80 >> "$S"
# 2. The depth model at 1K: the last 400 kernels are the last ~4 decode steps.
for kv in fp16 fp8_e4m3; do
  timeout -k 5 150 setsid ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 tools/gpu/profile_decode.py --kv "$kv" \
    --attention-layers 8 --prompt 1024 --steps 6 > "$L/ncu_$kv.csv" 2> "$L/ncu_$kv.err"
  reap
  python3 tools/gpu/profile_decode.py --summarize "$L/ncu_$kv.csv" --last 400 > "$L/profile_$kv.txt" 2>&1
  { echo "== $kv KV, 1K context, last 400 kernels, at $((SECONDS - t0)) s"; head -25 "$L/profile_$kv.txt"; } >> "$S"
  # Two decode steps' attention kernels (the prefill's are attention_prefill_*), with sections.
  timeout -k 5 120 setsid ncu --clock-control none --kernel-name regex:"attention_decode|attention_combine" --launch-skip 16 \
    --launch-count 4 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    python3 tools/gpu/profile_decode.py --kv "$kv" --attention-layers 8 --prompt 1024 --steps 4 \
    > "$L/ncu_attn_$kv.txt" 2> "$L/ncu_attn_$kv.err"
  reap
  { echo "== ncu attention $kv rc=$? at $((SECONDS - t0)) s"
    grep -E "attention_|Duration|Memory Throughput|Issue Slots Busy|Executed Ipc A|Registers Per|Achieved Occupancy|No Eligible|Warp Cycles Per Issued|Executed Instructions  " \
      "$L/ncu_attn_$kv.txt" | head -60; } >> "$S"
done
# 3. The 64-layer 27B model, batch 1: the window skips the load, the prefill and the first steps.
timeout -k 5 150 setsid ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 3000 --launch-count 1500 \
  python3 tools/gpu/profile_decode.py > "$L/ncu_27b.csv" 2> "$L/ncu_27b.err"
python3 tools/gpu/profile_decode.py --summarize "$L/ncu_27b.csv" > "$L/profile_27b.txt" 2>&1
{ echo "== 27B batch 1, at $((SECONDS - t0)) s"; head -25 "$L/profile_27b.txt"; } >> "$S"
tar czf /tmp/profile_logs.tgz -C "$L" . && mv /tmp/profile_logs.tgz "$OUT/logs.tgz"
cat "$S"
