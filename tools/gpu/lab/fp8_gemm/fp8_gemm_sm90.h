// Lab: the prefill linear as a W8A8 FP8 GEMM on Hopper's wgmma (CUTLASS 4.2's sm90 blockwise-scaled
// kernel), for FP8_E4M3 weights with 128 x 128 block scales (the checkpoints' format):
//
//   xq[t, k], xs[k / 128][t] = quantize(x)   one fp32 scale per token per 128 columns:
//                                             xs = max(amax, 1e-10) / 448, xq = e4m3_rn(x / xs)
//                                             (vLLM / SGLang per_token_group_quant_fp8, group 128,
//                                             column-major scales)
//   out[t, r] = sum_k xq[t, k] xs[k / 128][t] * W[r, k] block_scale[r / 128][k / 128]
//
// with x [n, cols] fp32 and out [n, rows] fp32, what pe::cuda::linear_gemm reads and writes. The
// products of one 128-k block accumulate on the tensor cores, then are scaled by xs * block_scale
// and added to fp32 registers (CUTLASS's "promotion" per 128 k).
//
// Layouts. W: row-major [rows, cols] (WeightView::tile == 0; the library keeps FP8 weights in the
// GEMV tile layout, so an integration needs a row-major copy for this path). block_scale as the
// library stores it ([ceil(rows/128)][ceil(cols/128)] row-major) is CUTLASS's K-major SFB: no
// relayout. xs is CUTLASS's M-major SFA ([ceil(cols/128)][xs_ld], xs_ld = n rounded up to 4: the
// scale TMA wants 16-byte strides; pad entries are written as 0).
// Requirements: cols % 16 == 0, rows % 4 == 0, 16-byte aligned x, out, W; w.block == 128.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"  // pe::WeightView (plain struct; nothing of the library is linked)

namespace pe {
namespace cuda {
namespace fp8sm90 {

// The GEMM's compiled configurations (tile tokens x weight rows x k, cluster, schedule).
enum Variant : int32_t {
  kAuto = 0,           // vLLM's choice: kStreamK128C2 where cols > 3 rows, else kCoop128C2
  kCoop128 = 1,        // 128 x 128 x 128, cluster 1x1x1, cooperative (2 consumer warpgroups)
  kCoop128C2 = 2,      // 128 x 128 x 128, cluster 1x2x1 (an x tile multicast to 2 weight tiles)
  kPingpong64 = 3,     // 64 x 128 x 128, cluster 1x1x1, ping-pong (consumers alternate tiles)
  kStreamK128C2 = 4,   // kCoop128C2 with the stream-K scheduler (k split to balance the last wave)
  kNumVariants = 5,
};
const char* variant_name(int32_t v);

// Error codes (0 ok): the arguments break a requirement above / CUTLASS refused or failed.
constexpr int32_t kErrArgs = -1, kErrCutlass = -2, kErrCuda = -3;

// Bytes of the workspace linear needs for n tokens (xq, xs and CUTLASS's own), 256-aligned parts.
size_t workspace_bytes(int64_t n, int64_t rows, int64_t cols);
// The row stride (floats) of xs for n tokens.
inline int64_t scale_ld(int64_t n) { return (n + 3) / 4 * 4; }

// x [n, cols] fp32 -> xq [n, cols] e4m3 (row-major), xs [ceil(cols/128)][scale_ld(n)] fp32.
int32_t quantize_x(const float* x, int64_t n, int64_t cols, uint8_t* xq, float* xs, cudaStream_t stream);

// out[n, w.rows] = dequant(xq, xs) * dequant(W)^T (xq, xs as quantize_x writes them). workspace:
// at least gemm_workspace_bytes; may be null when that is 0.
size_t gemm_workspace_bytes(int64_t n, int64_t rows, int64_t cols, int32_t variant);
int32_t gemm(const uint8_t* xq, const float* xs, int64_t n, const WeightView& w, float* out, void* workspace,
             int32_t variant, cudaStream_t stream);

// The whole linear: quantize_x into the workspace, then gemm. Same arguments as
// pe::cuda::linear_gemm plus the workspace (workspace_bytes(n, w.rows, w.cols), caller-owned, not
// shared with a concurrent call) and the variant. Asynchronous on stream; returns 0 or an error code.
int32_t linear(const float* x, int64_t n, const WeightView& w, float* out, void* workspace, size_t workspace_size,
               int32_t variant, cudaStream_t stream);

}  // namespace fp8sm90
}  // namespace cuda
}  // namespace pe
