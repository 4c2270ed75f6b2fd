// The sm_90 FP8 prefill GEMM's entry points (linear_gemm_fp8_sm90.cu, compiled for sm_90a and
// linked only where CMake defines PE_WITH_CUTLASS_SM90: native/cutlass_sm90.cmake). The dispatch
// (linear_gemm.cu) calls them; nothing else does.
//
// Math (W8A8, what vLLM / SGLang run for block-FP8 checkpoints):
//   xs[g][t] = max(amax(x[t, 128 g .. 128 g + 127]), 1e-10) / 448
//   xq[t, k] = e4m3_rn_satfinite(x[t, k] / xs[k / 128][t])
//   out[t, r] = sum_k xq[t, k] xs[k / 128][t] * W[r, k] block_scale[r / 128][k / 128]
// (divisions rounded to nearest, as cpu::fp8_group_quantize). The products of one 128-k block
// accumulate on the tensor cores (wgmma), then are scaled by xs * block_scale and added in fp32
// registers (CUTLASS 4's KernelTmaWarpSpecializedCooperativeFP8Blockwise).
//
// Workspace, carved in this order (256-byte aligned parts): the weight in row-major order when it
// is in the GEMV tile layout without a row-major copy (w.rowmajor; rows x cols bytes; the kernel's
// TMA reads K-major rows), xq (n x cols bytes), xs (ceil(cols / 128) x scale_ld(n) floats),
// CUTLASS's own (none expected for this schedule).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

typedef struct CUstream_st* cudaStream_t;

namespace pe {
namespace cuda {
namespace fp8sm90 {

// The compiled configurations: block tile 128 tokens x 128 weight rows x 128 k, cooperative (two
// consumer warpgroups), cluster 1 x 1 or 1 x 2 (an x tile multicast to two weight tiles).
constexpr int kCoop128 = 1, kCoop128Cluster2 = 2, kVariants = 2;

// FP8_E4M3 with 128 x 128 block scales, rows % 4 == 0 (16-byte output rows), cols % 16 == 0,
// 16-byte aligned data; row-major or any GEMV tile layout. n and 16-byte alignment of x and out
// are the caller's to check.
bool weight_supported(const WeightView& w);
// Whether a call untiles w into the workspace (tiled, no row-major copy).
inline bool untiles(const WeightView& w) { return w.tile != 0 && !w.rowmajor; }
size_t workspace_bytes(int64_t n, int64_t rows, int64_t cols, bool tiled);
// out[n, w.rows] as above. Throws pe::Error where CUTLASS refuses or a launch fails.
void linear(const float* x, int64_t n, const WeightView& w, float* out, void* workspace, size_t workspace_size,
            int variant, cudaStream_t stream);

}  // namespace fp8sm90
}  // namespace cuda
}  // namespace pe
