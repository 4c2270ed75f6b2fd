#!/usr/bin/env bash
# Issues 42 and 47's GPU checks in one device call, with nothing compiled there.
#
# Dev machine (repo root): pack the libraries into DEST (an ignored folder the call carries):
#   tools/gpu/prefill_call.sh pack BUILD90 [BUILD75] DEST
# BUILD90: a CUDA build of this tree for sm_90 with CUTLASS found and the op harness, e.g.
#   cmake -S . -B build/cu90 -G Ninja -DPYENGINE_CUDA=ON -DPYENGINE_TESTS=ON \
#     -DCMAKE_CUDA_ARCHITECTURES=90-real -DCMAKE_BUILD_TYPE=Release && ninja -C build/cu90 pyengine test_backend_ops
# (`pip install nvidia-cutlass` first: the sm_90 FP8 GEMM); BUILD75 (optional): a build for 75 only
# (-DCMAKE_CUDA_ARCHITECTURES=75), the first users' kernels, run on the H100 / H200 by PTX JIT.
# The pack: lib90.so.xz (BUILD90's archives relinked whole, so the op harness finds every kernel),
# test_backend_ops.xz (linked against it), lib75.so.xz; WHEELS' cffi and pycparser (default .whl).
# The call's working tree is limited to 64 MiB with the carried folder: with lib90 the DFlash draft
# (pyengine/default_model/dflash/model.safetensors) has to stay behind, with both libraries the
# default model's weights too (pyengine/default_model/model.safetensors; no part here reads them).
#
# GPU machine (repo root, DEST carried): tools/gpu/prefill_call.sh run DEST
# runs, each part within its cap and what is left of LIMIT (default 590 s), into OUT/summary.txt:
#   ops       test_backend_ops --backend cuda (PE_TEST_SMALL) "linear fp8 sm90" and "cuda linear"
#   prefill   bench_gpu.py 4K / 32K with the per-kernel breakdown (42 must-show 1, 3's decode), the
#             model option prefill_weight_copy on; prefill_untile: 4K with it off (A/B)
#   hf        transformers bf16 eager at 4K in the same call (42 must-show 1's baseline)
#   sm75      the 75-only library's 4K prefill and its breakdown (42 must-show 2; the PTX JIT of a
#             fresh machine takes over 120 s of it)
#   scene54k  bench_stall_free.py --shape27b --long 54000: the prefill time and a short request's
#             first-token time during it (42 must-show 4)
#   stall     bench_stall_free.py --shape27b --long 32768 --chunk 512, 1 and 4 decoders, max_step_ms
#             0 / 55 / 60 (47 must-show 1); stall_pc: 0 / 60 with the prefix cache on
# PARTS (names above, in the order to run; default: all in this order) picks and orders them.
set -u -o pipefail
mode="${1:?pack BUILD90 [BUILD75] DEST | run DEST}"
if [ "$mode" = pack ]; then
  set -e
  shift
  B90="$(cd "$1" && pwd)"; B75=""; [ $# -ge 3 ] && B75="$(cd "$2" && pwd)"
  DEST="${!#}"; mkdir -p "$DEST/whl"; P="$(cd "$DEST" && pwd)"; S="$B90/prefill_call"; mkdir -p "$S"
  . "$(dirname "$0")/relink.sh"
  CU=$(cuda_lib_dir "$B90")
  relink_whole "$B90" libpyengine_cuda.a "$S/libpyengine.so"
  c++ -O3 "$B90/native/CMakeFiles/test_backend_ops.dir/tests/test_backend_ops.cpp.o" -o "$S/test_backend_ops" \
    -L"$S" -lpyengine -Wl,-rpath,'$ORIGIN' -L"$CU" -lcudart_static -lrt -lpthread -ldl
  strip -o "$S/lib90.so" "$S/libpyengine.so" && xz -9 -T2 -c "$S/lib90.so" > "$P/lib90.so.xz"
  strip -o "$S/tbo" "$S/test_backend_ops" && xz -9 -c "$S/tbo" > "$P/test_backend_ops.xz"
  [ -n "$B75" ] && strip -o "$S/lib75.so" "$B75/libpyengine.so" && xz -9 -T2 -c "$S/lib75.so" > "$P/lib75.so.xz"
  WH="${WHEELS:-.whl}"; cp "$WH"/cffi-*.whl "$WH"/pycparser-*.whl "$P/whl/"
  cp "$0" "$P/prefill_call.sh"
  du -cb "$P" | tail -1
  exit 0
fi

P="$(cd "${2:?DEST}" && pwd)"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; [ -d "$ROOT/tools" ] || ROOT="$PWD"; cd "$ROOT"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/prefill_call; rm -rf $L; mkdir -p $L/b; S="$OUT/summary.txt"
t0=$SECONDS; el() { echo $((SECONDS - t0)); }; LIMIT=${LIMIT:-590}
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d $d ] && PATH=$PATH:$d; done
export PYTHONUNBUFFERED=1 CUDA_CACHE_MAXSIZE=1073741824
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$P"/whl/*.whl \
  > $L/wheels.log 2>&1
for f in "$P"/*.xz; do xz -dc "$f" > "$L/b/$(basename "$f" .xz)"; done
mv $L/b/lib90.so $L/b/libpyengine.so && chmod +x $L/b/test_backend_ops
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$S"
export LD_LIBRARY_PATH=$L/b PYTHONPATH=$ROOT:/tmp/site PYENGINE_LIBRARY=$L/b/libpyengine.so
run() { local name=$1 limit=$2; shift 2; local left=$((LIMIT - $(el))); [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -le 5 ] && { echo "== $name skipped (no time left)" >> "$S"; return; }
  timeout "$limit" "$@" 2>&1 | grep -vE "memory plan|UserWarning|_warn_once" > $L/$name.log
  echo "== $name rc $? at $(el) s" >> "$S"; grep -vE '^\{| ok$' $L/$name.log | tail -40 >> "$S"; }
part() {
  case $1 in
    ops_fp8) PE_TEST_SMALL=1 run ops_fp8 40 $L/b/test_backend_ops --backend cuda "linear fp8 sm90" ;;
    ops_linear) PE_TEST_SMALL=1 run ops_linear 60 $L/b/test_backend_ops --backend cuda "cuda linear" ;;
    prefill) run prefill 110 python3 tools/bench_gpu.py --skip-depth --prefill-sizes 4096 32768 --prefill-breakdown \
      --prefill-weight-copy on --out $L/prefill.json ;;
    prefill_untile) run prefill_untile 60 python3 tools/bench_gpu.py --skip-depth --prefill-sizes 4096 \
      --prefill-breakdown --prefill-weight-copy off --out $L/prefill_untile.json ;;
    hf) run hf 110 python3 tools/bench_gpu.py --skip-engine --skip-depth --prefill-sizes 4096 --hf --out $L/hf.json ;;
    sm75) [ -f $L/b/lib75.so ] && PYENGINE_LIBRARY=$L/b/lib75.so run sm75 400 python3 tools/bench_gpu.py --skip-depth \
      --prefill-sizes 4096 --prefill-breakdown --out $L/sm75.json ;;
    scene54k) run scene54k 90 python3 tools/bench_stall_free.py --shape27b --long 54000 --chunk 512 --decoders 1 \
      --max_step_ms 0 --prefill-weight-copy on --out $L/scene54k.json ;;
    stall) run stall 200 python3 tools/bench_stall_free.py --shape27b --long 32768 --chunk 512 --decoders 1 4 \
      --max_step_ms 0 55 60 --prefill-weight-copy on --out $L/stall.json ;;
    stall_pc) run stall_pc 150 python3 tools/bench_stall_free.py --shape27b --long 32768 --chunk 512 --decoders 1 4 \
      --max_step_ms 0 60 --prefill-weight-copy on --prefix-cache --out $L/stall_pc.json ;;
    *) echo "== unknown part $1" >> "$S" ;;
  esac
}
for p in ${PARTS:-ops_fp8 ops_linear prefill prefill_untile hf sm75 scene54k stall stall_pc}; do part $p; done
tar czf "$OUT/prefill_call_logs.tgz" -C $L --exclude=b .
cat "$S"
