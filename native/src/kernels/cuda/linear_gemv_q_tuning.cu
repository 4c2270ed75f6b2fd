// The quantized GEMV's host side that is not a launch (linear_gemv_q.cu launches): the tuning and
// its environment switches, the rows per warp and what the kernels support.
#include <algorithm>

#include "core/env.h"
#include "kernels/cuda/linear_gemv_q.cuh"

namespace pe {
namespace cuda {
namespace gemv_q {

GemvTuning g_tuning = [] {
  // A/B switch for tools/bench_gpu.py (whole decode steps): PYENGINE_GEMV_PDL=0/1.
  GemvTuning t;
  t.pdl = env_int("PYENGINE_GEMV_PDL", t.pdl) != 0;
  t.pdl_prefetch_steps = env_int("PYENGINE_GEMV_PDL_PREFETCH", t.pdl_prefetch_steps);
  t.stream_k = env_int("PYENGINE_GEMV_STREAM_K", t.stream_k) != 0;
  t.stream_k_balance_pct = env_int("PYENGINE_GEMV_STREAM_K_BALANCE", t.stream_k_balance_pct);
  t.stream_k_min_steps = env_int("PYENGINE_GEMV_STREAM_K_MIN_STEPS", t.stream_k_min_steps);
  t.stream_k_quantum = env_int("PYENGINE_GEMV_STREAM_K_QUANTUM", t.stream_k_quantum);
  t.fp8_stage_one_wave = env_int("PYENGINE_GEMV_STAGE_ONE_WAVE", t.fp8_stage_one_wave);
  t.roll = env_int("PYENGINE_GEMV_ROLL", t.roll);
  t.preload = env_int("PYENGINE_GEMV_PRELOAD", t.preload);
  t.stream_k_spin = env_int("PYENGINE_GEMV_STREAM_K_SPIN", t.stream_k_spin) != 0;
  t.x_early = env_int("PYENGINE_GEMV_X_EARLY", t.x_early);
  return t;
}();

int swiglu_rows_per_warp(const WeightView& w) { return w.tile ? w.tile / 8 : std::max(2, gemv_rows_per_warp(w.rows)); }

}  // namespace gemv_q

namespace {
inline bool aligned(const void* p, int a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }
}  // namespace

using gemv_q::g_tuning;

int gemv_rows_per_warp(int64_t rows) {
  return g_tuning.rows_per_warp > 0 ? g_tuning.rows_per_warp : rows >= 4224 ? 4 : rows >= 2048 ? 2 : 1;
}

bool gemv_q_supported(const float* x, const WeightView& w) {
  if (!aligned(x, 16) || !aligned(w.data, 16)) return false;
  switch (w.dtype) {
    case DType::FP8_E4M3: return w.cols % 16 == 0 && w.block % 128 == 0;
    case DType::I8: return w.cols % 16 == 0;
    case DType::NVFP4: return w.cols % 32 == 0 && aligned(w.group_scale, 2);
    default: return false;
  }
}

void linear_gemv_set_tuning(const GemvTuning& t) { g_tuning = t; }
GemvTuning linear_gemv_tuning() { return g_tuning; }

bool gemv_q_swiglu_supported(const float* x, const WeightView& w, int64_t up0, int64_t inter) {
  if (!gemv_q_supported(x, w) || inter <= 0 || up0 < inter || up0 + inter > w.rows) return false;
  const int T = gemv_q::swiglu_rows_per_warp(w);
  if (T < 2 || up0 % 8 != 0) return false;
  if (w.tile && up0 % (8 * T) != 0) return false;                 // the up rows start a row block's tiles
  if (w.dtype == DType::FP8_E4M3 && up0 % w.block != 0) return false;  // and a block-scale row
  return true;
}

}  // namespace cuda
}  // namespace pe
