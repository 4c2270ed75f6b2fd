#!/usr/bin/env bash
# The prefill GEMM's before / after in one short device call, with nothing compiled there.
#
# Dev machine (repo root, nvcc; BUILD: a CUDA build of this tree's library for sm_90 configured
# with -DPYENGINE_NATIVE_ARCH=OFF, e.g. `cmake -S . -B build/cu90 -G Ninja -DPYENGINE_CUDA=ON
# -DPYENGINE_TESTS=ON -DPYENGINE_NATIVE_ARCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90 && ninja -C
# build/cu90 pyengine`):
#   tools/gpu/lab/linear_gemm/ab_prefill.sh pack BUILD DEST
# (WHEELS: a folder with the cffi and pycparser wheels the GPU machine lacks, default .whl) writes
# into DEST (an ignored folder of the checkout the device call sends, e.g. .ab/p42; ~17 MB):
#   libpyengine.so      BUILD's archives relinked with this tree's linear_gemm.cu (sm_90)
#   libgemm_v0.so       v0's entry points (linear_gemm_v0.cu), libgemm_t2 / t5.so the lab's tiles t2 /
#                       t5 (linear_gemm_tile.cu), libgemm_75.so this tree's linear_gemm.cu as
#                       compute_75 PTX: preloaded (LD_PRELOAD), they take the place of the library's
#                       pe::cuda::linear_gemm (an exported symbol its linear calls through the PLT)
#   test_backend_ops, bench_kernels, linear_gemm_lab   linked against libpyengine.so
#   src.tar.xz          this tree's pyengine/, tools/ and native/include/ (bench_gpu.py's Python side)
# GPU machine (repo root, DEST carried; OUT for the logs):
#   tools/gpu/lab/linear_gemm/ab_prefill.sh run DEST      (or: bash DEST/ab_prefill.sh run DEST)
# runs, as time allows (the call ends by ~455 s): the lab (v0 and the tiles on the 27B shapes);
# the op harness's linear cases on CUDA (test_backend_ops --backend cuda linear: GEMV, GEMM tiles,
# tile layouts, 27B shapes); its small linear cases again on the compute_75 PTX GEMM (JIT); the
# engine (bench_gpu.py --prefill-breakdown, 4K and 32K) with the lab's fastest tile of t1 (the
# library's) / t2 / t5, then with v0 preloaded (the before); bench_kernels --only gemm; the 4K
# prefill with the GEMM from compute_75 PTX.
set -u -o pipefail
mode="${1:?pack BUILD DEST | run DEST}"
if [ "$mode" = pack ]; then
  set -e
  B="$(cd "$2" && pwd)"; mkdir -p "$3"; P="$(cd "$3" && pwd)"; S="$B/ab_prefill"; mkdir -p "$S" "$P/bin" "$P/whl"
  . tools/gpu/relink.sh
  CU=$(cuda_lib_dir "$B")
  CUDA="$CU/.."
  NV="nvcc -DPE_WITH_CUDA=1 -I native/include -I native/src -O3 -DNDEBUG -Xcompiler=-fPIC --use_fast_math -lineinfo -std=c++17"
  G90="--generate-code=arch=compute_90,code=[compute_90,sm_90]"; G75="--generate-code=arch=compute_75,code=[compute_75]"
  L=tools/gpu/lab/linear_gemm
  $NV $G90 -x cu -c native/src/kernels/cuda/linear_gemm.cu -o "$S/linear_gemm.cu.o" &
  $NV $G90 -x cu -c $L/linear_gemm_v0.cu -o "$S/gemm_v0.o" &
  $NV $G75 -x cu -c native/src/kernels/cuda/linear_gemm.cu -o "$S/gemm_75.o" &
  wait
  $NV $G90 -DPE_LAB_BM=128 -DPE_LAB_BN=128 -DPE_LAB_BK=32 -DPE_LAB_MINB=2 -x cu -c $L/linear_gemm_tile.cu -o "$S/gemm_t2.o" &
  $NV $G90 -DPE_LAB_BM=128 -DPE_LAB_BN=256 -DPE_LAB_BK=64 -DPE_LAB_MINB=1 -x cu -c $L/linear_gemm_tile.cu -o "$S/gemm_t5.o" &
  cp "$B/libpyengine_cuda.a" "$S/" && (cd "$S" && ar r libpyengine_cuda.a linear_gemm.cu.o)
  relink_whole "$B" "$S/libpyengine_cuda.a" "$S/libpyengine.so"  # with this tree's linear_gemm.cu
  wait
  for v in v0 75 t2 t5; do nvcc -shared -Xcompiler=-fPIC "$S/gemm_$v.o" -L"$S" -lpyengine -o "$S/libgemm_$v.so"; done
  LINK="-L$S -lpyengine -Wl,-rpath,\$ORIGIN -L$CU -lcudart_static -lrt -lpthread -ldl"
  g++ -std=c++17 -O2 -DPE_WITH_CUDA=1 -I native/include -I native/src -I native/tests -isystem "$CUDA/include" \
    native/tests/test_backend_ops.cpp -o "$S/test_backend_ops" $LINK &
  $NV $G90 -x cu -c tools/gpu/bench_patterns.cu -o "$S/bench_patterns.o" &
  for f in bench_kernels bench_kernels_gemm; do
    g++ -std=c++17 -O3 -DPE_WITH_CUDA=1 -I native/include -I native/src -isystem "$CUDA/include" -c tools/gpu/$f.cpp \
      -o "$S/$f.o" &
  done
  nvcc -O3 -std=c++17 -arch=sm_90 --use_fast_math -lineinfo -I native/include -I native/src $L/linear_gemm_lab.cu \
    -o "$S/linear_gemm_lab" -L"$S" -lpyengine -Xlinker -rpath -Xlinker '$ORIGIN' &
  wait
  g++ "$S/bench_kernels.o" "$S/bench_kernels_gemm.o" "$S/bench_patterns.o" -o "$S/bench_kernels" $LINK
  rm -f "$P"/bin/*
  for f in libpyengine.so libgemm_v0.so libgemm_75.so libgemm_t2.so libgemm_t5.so test_backend_ops bench_kernels linear_gemm_lab; do
    xz -T2 -9 -c "$S/$f" > "$P/bin/$f.xz"
  done
  git ls-files -co --exclude-standard pyengine tools native/include | grep -v default_model | tar -cJf "$P/src.tar.xz" -T -
  cp "$0" "$P/ab_prefill.sh"
  WH="${WHEELS:-.whl}"; [ -d "$WH" ] && cp "$WH"/cffi-*.whl "$WH"/pycparser-*.whl "$P/whl/" 2>/dev/null || true
  du -cb "$P" | tail -1
  exit 0
fi

# ---- run (GPU machine) ----
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
P="$(cd "${2:?DEST}" && pwd)"; W=/tmp/ab_prefill; mkdir -p $W/bin
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d $d ] && PATH=$PATH:$d; done
t0=$SECONDS; ts() { echo "== $* at $((SECONDS - t0)) s"; }
left() { [ $((SECONDS - t0)) -lt "$1" ]; }
tl() { local r=$((455 - SECONDS + t0)); echo $(( $1 < r ? $1 : (r > 5 ? r : 5) )); }  # a step's timeout
ls "$P"/whl/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site "$P"/whl/*.whl > "$OUT/wheels.log" 2>&1
cd $W && tar -xJf "$P/src.tar.xz" && for f in "$P"/bin/*.xz; do xz -dc "$f" > "bin/$(basename "$f" .xz)"; done && chmod +x bin/*
export LD_LIBRARY_PATH=$W/bin PYTHONPATH=$W:/tmp/site PYTHONUNBUFFERED=1 CUDA_CACHE_MAXSIZE=1073741824
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
L=$W/bin/libpyengine.so
ts lab sm_90
timeout "$(tl 100)" bin/linear_gemm_lab > "$OUT/lab90.log" 2>&1; echo "rc=$?"
grep -E "FAIL|fp8 gate|bf16 bf16|^  |failures" "$OUT/lab90.log" | head -40
# The engine's "after" runs the lab's fastest tile of those the library or a preload takes.
best=$(awk '/one layer of each/ {f = 1; next} f && /^  (t1|t2|t5) / {print $(NF - 1), $1}' "$OUT/lab90.log" | sort -n | head -1 | cut -d' ' -f2)
PRE=""; [ -n "$best" ] && [ "$best" != t1 ] && [ -f "$W/bin/libgemm_$best.so" ] && PRE=$W/bin/libgemm_$best.so
echo "after runs tile ${best:-t1} (${PRE:-no preload})"
# The op harness's cases whose op name contains "linear" (linear, cuda linear, cuda linear_swiglu);
# all sizes on the library's GEMM, the small ones (PE_TEST_SMALL) on a preloaded one.
T="bin/test_backend_ops --backend cuda linear"
ts tests sm_90
timeout "$(tl 150)" $T > "$OUT/test90.log" 2>&1
echo "test_backend_ops linear: rc=$? $(tail -1 "$OUT/test90.log")"; grep -E "FAIL" "$OUT/test90.log" | head -5
if [ -n "$PRE" ]; then
  LD_PRELOAD=$PRE PE_TEST_SMALL=1 timeout "$(tl 90)" $T > "$OUT/test90_$best.log" 2>&1
  echo "test_backend_ops linear (small) on $best: rc=$? $(tail -1 "$OUT/test90_$best.log")"
  grep -E "FAIL" "$OUT/test90_$best.log" | head -5
fi
# The sm_75 parts only where the pack has the compute_75 GEMM (it can be left out to fit a call).
G75=$W/bin/libgemm_75.so; [ -f $G75 ] || { G75=""; echo "no libgemm_75.so in the pack: sm_75 parts skipped"; }
ts tests sm_75 GEMM by PTX JIT
[ -n "$G75" ] && { LD_PRELOAD=$G75 PE_TEST_SMALL=1 timeout "$(tl 120)" $T > "$OUT/test75.log" 2>&1
  echo "sm75 test_backend_ops linear (small): rc=$? $(tail -1 "$OUT/test75.log")"; grep -E "FAIL" "$OUT/test75.log" | head -5; }
BG="tools/bench_gpu.py --skip-depth --prefill-sizes 4096 32768 --prefill-breakdown"
ts engine after
LD_PRELOAD=$PRE PYENGINE_LIBRARY=$L timeout "$(tl 150)" python3 $BG --out "$OUT/after.json" > "$OUT/after.log" 2>&1
echo "rc=$?"; grep -vE "^\{" "$OUT/after.log" | tail -30
ts engine before, v0 GEMM preloaded
left 290 && {
  LD_PRELOAD=$W/bin/libgemm_v0.so PYENGINE_LIBRARY=$L timeout "$(tl 150)" python3 $BG --out "$OUT/before.json" > "$OUT/before.log" 2>&1
  echo "rc=$?"; grep -vE "^\{" "$OUT/before.log" | tail -24; }
ts bench_kernels gemm
left 350 && {
  timeout "$(tl 60)" bin/bench_kernels --only gemm > "$OUT/bench_gemm.log" 2>&1
  echo "rc=$?"; grep -E "^device|copy|gemm" "$OUT/bench_gemm.log" | tail -30; }
ts engine, GEMM from compute_75 PTX
[ -n "$G75" ] && left 370 && {
  LD_PRELOAD=$W/bin/libgemm_75.so PYENGINE_LIBRARY=$L timeout "$(tl 120)" python3 tools/bench_gpu.py --skip-depth \
    --prefill-sizes 4096 --prefill-breakdown --out "$OUT/sm75gemm.json" > "$OUT/sm75gemm.log" 2>&1
  echo "rc=$?"; grep -E "prefill|gemm|TFLOP" "$OUT/sm75gemm.log" | tail -12; }
ts done
