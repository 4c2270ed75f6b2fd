#!/usr/bin/env bash
# A/B of source trees or build options in one device call (repo root on the GPU machine; carry .whl):
#   VARIANTS="base:.ab/base= new=" TESTS="test_backend_ops" FILTER=linear BENCH=gemv ROUNDS=2 DEPTHS="1024 65536" \
#     OUT=$OUT tools/gpu/lab/build_ab.sh
# builds the library once per variant, all in parallel (sm_90 only: the A/B is about the H200's
# speed). A variant is name=CUDA flags (commas for spaces); name:DIR=flags builds the source tree
# in DIR instead of the repo, e.g. a branch exported before the call (1.4 MB; .ab is git-ignored:
# carry it) with
#   mkdir -p .ab/base && git archive BRANCH CMakeLists.txt native tools | tar -x -C .ab/base
# Then: each TESTS binary on each variant (PE_TEST_SMALL=1 unless FULL=1); bench_kernels --only
# BENCH per variant (BENCH empty: none); ROUNDS times over the variants in turn (so drift of the
# machine shows up between rounds rather than between variants) the 27B decode bench (batch 1, 2,
# 8; DECODE=0: none) and, with DEPTHS (e.g. "1024"), the depth bench at those depths
# (DEPTH_ROUNDS rounds a run, default 2). Prints summary.txt (rows tagged [name]); the
# per-variant logs stay in $OUT.
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"; cd "$ROOT"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; S="$OUT/summary.txt"; t0=$SECONDS
VARIANTS="${VARIANTS:?set VARIANTS, e.g. \"base= other=-DNAME=1\"}"; TESTS="${TESTS:-}"; BENCH="${BENCH-}"
for d in /opt/torch/.venv/bin /opt/venv/bin /usr/local/cuda/bin; do [ -d "$d" ] && PATH="$PATH:$d"; done
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/wheels.log" 2>&1
fi
names=(); n=0
for v in $VARIANTS; do n=$((n + 1)); done
jobs=$(( $(nproc) / (n > 0 ? n : 1) )); [ "$jobs" -lt 1 ] && jobs=1
for v in $VARIANTS; do
  name="${v%%=*}"; flags="${v#*=}"; flags="${flags//,/ }"; src=.
  case "$name" in *:*) src="${name#*:}"; name="${name%%:*}";; esac
  names+=("$name")
  ( cmake -S "$src" -B "build/ab_$name" -G Ninja -DPYENGINE_CUDA=ON -DPYENGINE_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_CUDA_FLAGS="$flags" > "$OUT/build_$name.log" 2>&1 &&
    cmake --build "build/ab_$name" -j"$jobs" --target pyengine $TESTS ${BENCH:+bench_kernels} >> "$OUT/build_$name.log" 2>&1
    echo "build $name ($flags): rc=$?" >> "$S" ) &
done
wait
echo "== built at $((SECONDS - t0)) s" >> "$S"
for name in "${names[@]}"; do
  for t in $TESTS; do
    env $([ "${FULL:-0}" = 1 ] || echo PE_TEST_SMALL=1) timeout 240 "build/ab_$name/$t" --backend cuda ${FILTER:-} \
      > "$OUT/${t}_$name.log" 2>&1
    echo "$t [$name]: rc=$? $(tail -1 "$OUT/${t}_$name.log")" >> "$S"
  done
  if [ -n "$BENCH" ]; then
    timeout 150 "build/ab_$name/bench_kernels" --only "$BENCH" > "$OUT/bench_${BENCH}_$name.log" 2>&1
    echo "bench_kernels --only $BENCH [$name]: rc=$? ($OUT/bench_${BENCH}_$name.log)" >> "$S"
  fi
done
for r in $(seq "${ROUNDS:-2}"); do
  for name in "${names[@]}"; do
    [ "${DECODE:-1}" = 1 ] || continue
    PYENGINE_LIBRARY="$ROOT/build/ab_$name/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site" timeout 90 \
      python3 tools/bench_gpu.py --skip-depth --prefill-sizes --decode-tokens 48 2>&1 | grep -E "^decode" \
      | sed "s/^/[$name, round $r] /" >> "$S"
  done
  for name in "${names[@]}"; do
    [ -n "${DEPTHS:-}" ] || continue
    PYENGINE_LIBRARY="$ROOT/build/ab_$name/libpyengine.so" PYTHONPATH="$ROOT:/tmp/site" timeout 120 \
      python3 tools/bench_gpu.py --skip-engine --depths $DEPTHS --depth-rounds "${DEPTH_ROUNDS:-2}" 2>&1 \
      | grep -E "^  (fp16|bf16|fp8_e4m3|int8|fp4) " | tr -s ' ' | tr '\n' ';' | sed "s/^/[$name, run $r] /;s/$/\n/" >> "$S"
  done
done
echo "== done at $((SECONDS - t0)) s" >> "$S"
cat "$S"
