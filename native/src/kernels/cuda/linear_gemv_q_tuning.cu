// The quantized GEMV's host side that is not a launch (linear_gemv_q.cu launches): the tuning, the
// rows per warp and what the kernels support.
#include <algorithm>

#include "kernels/cuda/linear_gemv_q.cuh"

namespace pe {
namespace cuda {
namespace gemv_q {

GemvTuning g_tuning;

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
