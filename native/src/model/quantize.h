// On-load weight quantization: a dense F32/F16/BF16 matrix -> I8, FP8 e4m3 or NVFP4, in the
// layouts of WeightView (kernels/ops.h), so cpu::linear and cuda::linear take the result as is.
//
// Recipes (design decisions, one place):
//   I8       symmetric per output row: scale = absmax(row) / 127, q = round(w / scale) (nearest,
//            ties to even). Rows are the GEMV's unit, so the scale folds into the output.
//   FP8_E4M3 128 x 128 blocks, scale = absmax(block) / 448, q = e4m3(w / scale) (nearest even):
//            the layout of the DeepSeek / Qwen FP8 checkpoints (block_scale = weight_scale_inv).
//   NVFP4    NVIDIA's two-level recipe: global_scale = absmax(all) / (448 * 6); per 16 values of
//            a row, group = e4m3(absmax(16) / 6 / global_scale); q = e2m1(w / (fp8(group) *
//            global_scale)) (nearest, ties to even, saturating at 6). cols must be a multiple of 16.
// An all-zero row / block / matrix gets scale 1 (so zeros stay zeros and nothing divides by 0).
// Threads: runs on the core/threadpool.h pool (parallel over rows or row blocks); callable from
// any thread. Errors: std::invalid_argument naming the problem (unsupported source or target
// dtype, NVFP4 with cols % 16 != 0, a non-finite source value, null data).
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/ops.h"

namespace pe {

struct QuantizedMatrix {
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  int64_t block = 128;              // FP8 block edge
  std::vector<uint8_t> data;        // I8 / FP8: rows * cols bytes; NVFP4: rows * cols / 2
  std::vector<float> scales;        // FP8: block scales [ceil(rows/block) * ceil(cols/block)];
                                    // I8: row scales [rows]
  std::vector<uint8_t> group_scale; // NVFP4: e4m3 scales [rows * cols / 16]
  float global_scale = 1.0f;        // NVFP4
  // A view of this matrix (host pointers into the vectors above; valid while *this lives and
  // is not modified).
  WeightView view() const;
};

// src: host matrix of dtype F32, F16 or BF16; target: I8, FP8_E4M3 or NVFP4.
QuantizedMatrix quantize_matrix(const WeightView& src, DType target);

}  // namespace pe
