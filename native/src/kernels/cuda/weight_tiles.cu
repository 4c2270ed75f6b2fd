// tile_weight (cuda_ops.h): a row-major quantized weight rewritten in the GEMV tile layout
// (linear_common.cuh, tiled_offset), once at load time. One thread per 16-byte chunk: each reads
// its chunk of a row and writes it to its place in the row block's tiles. A last row block of
// fewer than R rows keeps the rest of its tiles as dst held them (zeros from Buffer): the GEMV
// computes those rows and writes none of them. gemv_tile_rows: the tile a weight gets.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {
namespace {

__global__ void tile_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t rows, int64_t row_bytes,
                            int tile) {
  const int64_t chunks_per_row = row_bytes / 16;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * chunks_per_row) return;
  const int64_t row = i / chunks_per_row, b = (i % chunks_per_row) * 16;
  dst[tiled_offset(row, b, row_bytes, tile) / 16] = src[i];
}

}  // namespace

int gemv_tile_rows(const WeightView& w) {
  const int tile = 8 * gemv_rows_per_warp(w.rows);  // the GEMV's rows per warp at this height
  const bool scales_ok = w.dtype != DType::FP8_E4M3 || w.block % 128 == 0;  // the GEMV's FP8 rule
  return tile_fits(w, tile) && scales_ok ? tile : 0;
}

size_t tiled_weight_bytes(const WeightView& w, int tile) {
  return dtype_bytes_for(w.dtype, (w.rows + tile - 1) / tile * tile * w.cols);
}

WeightView tile_weight(const WeightView& src, void* dst, int tile, cudaStream_t stream) {
  if (!src.data || src.tile != 0 || !tile_fits(src, tile))
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::tile_weight: needs a row-major FP8 / I8 / NVFP4 weight whose row bytes are a ",
         "multiple of 4096 / tile (tile 8, 16 or 32); got ", dtype_name(src.dtype), " ", src.rows, "x", src.cols,
         " (tile ", src.tile, "), tile ", tile);
  const int64_t row_bytes = static_cast<int64_t>(dtype_bytes_for(src.dtype, src.cols));
  const int64_t chunks = src.rows * row_bytes / 16;
  tile_kernel<<<grid_1d(chunks, 256), 256, 0, stream>>>(static_cast<const uint4*>(src.data), static_cast<uint4*>(dst),
                                                         src.rows, row_bytes, tile);
  PE_CUDA_LAUNCH_CHECK();
  WeightView v = src;
  v.data = dst;
  v.tile = tile;
  return v;
}

}  // namespace cuda
}  // namespace pe
