// Embedding lookup and the weight-row decoder shared with linear.
//
// embedding: out[i, :] = fp32(table[ids[i], :]), table [V, H] in F32/F16/BF16 (FP8 with block
// scales also works through the same decoder). Parallel over tokens.
// weight_rows_to_f32: rows of a WeightView -> dense fp32 rows; FP8 e4m3 rows are decoded by table
// lookup and multiplied by the block scale of each 128-wide (w.block) column block, so a row
// block is converted once and reused by every token (see linear.cpp).
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {

void weight_rows_to_f32(const WeightView& w, int64_t row0, int64_t n_rows, float* dst) {
  const int64_t cols = w.cols;
  switch (w.dtype) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: {
      const size_t es = dtype_size(w.dtype);
      const char* src = static_cast<const char*>(w.data) + static_cast<size_t>(row0 * cols) * es;
      to_f32(w.dtype, src, n_rows * cols, dst);
      return;
    }
    case DType::FP8_E4M3: {
      if (!w.block_scale || w.block <= 0)
        throw std::invalid_argument("weight_rows_to_f32: FP8 weight without block scales");
      const uint8_t* src = static_cast<const uint8_t*>(w.data);
      const int64_t blk = w.block;
      const int64_t n_col_blocks = (cols + blk - 1) / blk;
      for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t row = row0 + r;
        float* d = dst + r * cols;
        to_f32(DType::FP8_E4M3, src + row * cols, cols, d);
        const float* scale = w.block_scale + (row / blk) * n_col_blocks;
        for (int64_t cb = 0; cb < n_col_blocks; ++cb) {
          const float s = scale[cb];
          const int64_t end = std::min(cols, (cb + 1) * blk);
          for (int64_t j = cb * blk; j < end; ++j) d[j] *= s;
        }
      }
      return;
    }
    default:
      throw std::invalid_argument(std::string("weight_rows_to_f32: unsupported weight dtype ") +
                                  dtype_name(w.dtype));
  }
}

void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  const int64_t H = table.cols;
  parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) weight_rows_to_f32(table, ids[i], 1, out + i * H);
      },
      std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)));
}

}  // namespace cpu
}  // namespace pe
