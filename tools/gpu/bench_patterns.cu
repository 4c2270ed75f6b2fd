// Weight-streaming access patterns without the GEMV's arithmetic, for bench_kernels --only
// pattern: does the quantized GEMV's order of 16-byte loads (and its 2 blocks per SM) by itself
// reach the copy bandwidth, or is the bound its math and dependency chain? Each kernel reads a
// rows x cols byte matrix once with one pattern, all loads of a step first (as the GEMV does),
// and XORs what it read into one word per thread (written, so nothing is optimized away).
//   kind 0: the GEMV at 32 rows per warp (T = 4): block = 32 rows, warp w takes column steps w,
//           w + 8, ... of 128 bytes; lane (g, t) rows g + 8r (r < 4), bytes (c * 4 + t) * 16 (c < 2).
//   kind 1: the GEMV at 8 rows per warp (T = 1): block = 8 rows, steps of 512 bytes, c < 8.
//   kind 2: contiguous: warp w of block b reads 4 KB per step from its own contiguous slice.
//   kind 3, 4: kinds 0, 1 (same grid, same steps) over a tiled layout: each (row block, step)
//           tile of 8T rows x its step's bytes stored contiguously in the order the lanes load it,
//           so a step reads 4 KB in one run (the question: is the row-major order the loss?).
// blocks_per_sm: the grid's residency, set with dynamic shared memory the kernel does not use
// (the GEMV holds 2 blocks of 8 warps per SM by its registers).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/linear_common.cuh"  // load_stream: the GEMV's own weight load

using pe::cuda::load_stream;

namespace {


template <int T, bool kTiled>
__global__ void __launch_bounds__(256) gemv_pattern_kernel(const uint8_t* w, int64_t rows, int64_t cols,
                                                           uint32_t* sink) {
  constexpr int C = 8 / T, KB = 64 * C;  // chunks per row per step, bytes per row per step
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 8 * T;
  const int64_t n_it = cols / KB;
  uint32_t acc = 0;
  for (int64_t it = warp; it < n_it; it += 8) {
    uint4 raw[T][C];
#pragma unroll
    for (int r = 0; r < T; ++r)
#pragma unroll
      for (int c = 0; c < C; ++c)  // cols % KB == 0 (launch_weight_pattern): no guard
        raw[r][c] = load_stream(kTiled ? w + ((blockIdx.x * n_it + it) * (8 * T) * KB + ((r * C + c) * 32 + lane) * 16)
                                       : w + min(row0 + 8 * r + g, rows - 1) * cols + it * KB + (c * 4 + t) * 16);
    __syncwarp();  // keeps the XORs below every load of the step (else sm_80+ ptxas interleaves them)
#pragma unroll
    for (int r = 0; r < T; ++r)
#pragma unroll
      for (int c = 0; c < C; ++c) acc ^= raw[r][c].x ^ raw[r][c].y ^ raw[r][c].z ^ raw[r][c].w;
  }
  sink[static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x] = acc;
}

__global__ void __launch_bounds__(256) contiguous_pattern_kernel(const uint8_t* w, int64_t bytes, uint32_t* sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * 8, wid = static_cast<int64_t>(blockIdx.x) * 8 + warp;
  const int64_t steps = (bytes / 4096 + warps - 1) / warps;  // 4 KB steps per warp, in one slice
  uint32_t acc = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t base = (wid * steps + s) * 4096;
    if (base + 4096 > bytes) break;  // the tail past the last whole 4 KB is not read
    uint4 raw[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) raw[i] = load_stream(w + base + (i * 32 + lane) * 16);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 8; ++i) acc ^= raw[i].x ^ raw[i].y ^ raw[i].z ^ raw[i].w;
  }
  sink[static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x] = acc;
}

template <typename K>
size_t residency_smem(K kernel, int blocks_per_sm) {
  int dev = 0, smem = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  const size_t bytes = static_cast<size_t>(smem / blocks_per_sm) - 2048;  // a block's reserve
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  return bytes;
}

// Kinds 0, 1, 3, 4: one block per 8T rows.
template <int T, bool kTiled>
bool launch_rows(const uint8_t* p, int64_t rows, int64_t cols, int blocks_per_sm, uint32_t* sink, cudaStream_t stream) {
  const size_t smem = residency_smem(gemv_pattern_kernel<T, kTiled>, blocks_per_sm);
  gemv_pattern_kernel<T, kTiled><<<static_cast<unsigned>((rows + 8 * T - 1) / (8 * T)), 256, smem, stream>>>(
      p, rows, cols, sink);
  return true;
}

}  // namespace

// One pass of pattern `kind` over w (rows x cols bytes, cols % 512 == 0); sink: 256 words per block
// of the largest grid (rows / 8 blocks). Returns false for an unknown kind or such a shape.
bool launch_weight_pattern(int kind, const void* w, int64_t rows, int64_t cols, int blocks_per_sm, uint32_t* sink,
                           cudaStream_t stream) {
  const auto* p = static_cast<const uint8_t*>(w);
  if (cols % 512 != 0 || (rows * cols) % 16 != 0) return false;  // whole steps: the loads need no guard
  if ((kind == 3 && rows % 32 != 0) || (kind == 4 && rows % 8 != 0)) return false;  // whole tiles
  switch (kind) {
    case 0: return launch_rows<4, false>(p, rows, cols, blocks_per_sm, sink, stream);
    case 1: return launch_rows<1, false>(p, rows, cols, blocks_per_sm, sink, stream);
    case 3: return launch_rows<4, true>(p, rows, cols, blocks_per_sm, sink, stream);
    case 4: return launch_rows<1, true>(p, rows, cols, blocks_per_sm, sink, stream);
    case 2: {
      const size_t smem = residency_smem(contiguous_pattern_kernel, blocks_per_sm);
      int dev = 0, sms = 0;
      cudaGetDevice(&dev);
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      contiguous_pattern_kernel<<<static_cast<unsigned>(sms * blocks_per_sm), 256, smem, stream>>>(p, rows * cols, sink);
      return true;
    }
    default: return false;
  }
}
