// The sm_90 FP8 prefill GEMM (math, layouts, workspace: linear_gemm_fp8_sm90.h): per call, the
// weight untiled into row-major order (where it is in the GEMV tile layout), x quantized per token
// per 128 columns, then CUTLASS 4's TMA + wgmma warp-specialized blockwise-scaled GEMM:
//   A = xq [n, cols] e4m3, K-major          SFA: 1 token x 128 k per scale, M-major (xs)
//   B = W [rows, cols] e4m3, K-major        SFB: 128 rows x 128 k per scale, K-major (block_scale,
//                                            the library's [ceil(rows/128)][ceil(cols/128)] as is)
//   D = out [n, rows] fp32, row-major       no C (beta = 0)
// Grown in tools/gpu/lab/fp8_gemm (its four configurations measured on an H100, tools/gpu/KERNELS.md
// "Prefill"); the two best are compiled here. Compiled for sm_90a only (CMake: cutlass_sm90.cmake).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_check.cuh"
#include "core/error.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"
#include "kernels/cuda/linear_common.cuh"
#include "kernels/cuda/linear_gemm_fp8_sm90.h"

namespace pe {
namespace cuda {
namespace fp8sm90 {
namespace {

constexpr float kE4M3Max = 448.0f;
constexpr float kAmaxFloor = 1e-10f;  // vLLM's eps: an all-zero group gets a tiny scale, not 0

// The row stride (floats) of xs for n tokens: the scale TMA wants 16-byte strides.
int64_t scale_ld(int64_t n) { return (n + 3) / 4 * 4; }
size_t align256(size_t b) { return (b + 255) / 256 * 256; }
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }


template <class TileShape, class ClusterShape>
struct BlockFp8Gemm {
  using E4M3 = cutlass::float_e4m3_t;
  using LayoutA = cutlass::layout::RowMajor;     // xq [n, cols]
  using LayoutB = cutlass::layout::ColumnMajor;  // W [rows, cols]: B(k, r) at r * cols + k
  using LayoutD = cutlass::layout::RowMajor;     // out [n, rows]
  static constexpr int kAlignAB = 16, kAlignD = 4;  // 16-byte TMA rows
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN, cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD, float, LayoutD, kAlignD,
      cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4M3, cute::tuple<LayoutA, LayoutSFA>, kAlignAB, E4M3,
      cute::tuple<LayoutB, LayoutSFB>, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const uint8_t* xq, const float* xs, int64_t n, const void* w,
                                            const float* block_scale, int64_t rows, int64_t cols, float* out,
                                            int sms) {
    const int M = static_cast<int>(n), N = static_cast<int>(rows), K = static_cast<int>(cols);
    // SFA spans scale_ld(n) tokens: the pad tokens' scales (0) load with their tile, never stored.
    const auto sfa = ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(static_cast<int>(scale_ld(n)), N, K, 1));
    const auto sfb = ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(M, N, K, 1));
    const auto sa = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(M, K, 1));
    const auto sb = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(N, K, 1));
    const auto sc = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, cute::make_shape(M, N, 1));
    const auto sd = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, cute::make_shape(M, N, 1));
    typename Gemm::Arguments a{cutlass::gemm::GemmUniversalMode::kGemm,
                               {M, N, K, 1},
                               {reinterpret_cast<const E4M3*>(xq), sa, static_cast<const E4M3*>(w), sb, xs, sfa,
                                block_scale, sfb},
                               {{}, nullptr, sc, out, sd}};
    a.epilogue.thread.alpha = 1.0f;
    a.epilogue.thread.beta = 0.0f;
    a.hw_info.sm_count = sms;
    return a;
  }

  static size_t workspace(int64_t n, int64_t rows, int64_t cols) {
    return Gemm::get_workspace_size(arguments(nullptr, nullptr, n, nullptr, nullptr, rows, cols, nullptr, sm_count()));
  }

  static void run(const uint8_t* xq, const float* xs, int64_t n, const void* w, const WeightView& v, float* out,
                  void* ws, cudaStream_t stream) {
    const auto a = arguments(xq, xs, n, w, v.block_scale, v.rows, v.cols, out, sm_count());
    Gemm gemm;
    cutlass::Status s = Gemm::can_implement(a);
    if (s == cutlass::Status::kSuccess) s = gemm.initialize(a, ws, stream);
    if (s == cutlass::Status::kSuccess) s = gemm.run(stream);
    if (s != cutlass::Status::kSuccess)
      fail(PE_ERR_INTERNAL, "cuda::linear (sm_90 FP8 GEMM): CUTLASS refused ", v.rows, "x", v.cols, " at ", n,
           " tokens: ", cutlassGetStatusString(s));
    PE_CUDA_LAUNCH_CHECK();
  }
};

using cute::_1;
using cute::_2;
using cute::_128;
using cute::Shape;
using Coop128 = BlockFp8Gemm<Shape<_128, _128, _128>, Shape<_1, _1, _1>>;
using Coop128Cluster2 = BlockFp8Gemm<Shape<_128, _128, _128>, Shape<_1, _2, _1>>;

// One warp per (128-column group g, token t), items in the order of xs (g major), so consecutive
// warps store consecutive scales; each lane quantizes 4 columns (cols % 16 == 0: all 4 in or out).
// Pad tokens t in [n, ld) get a 0 scale.
__global__ void quantize_kernel(const float* __restrict__ x, int64_t n, int64_t cols, int64_t groups, int64_t ld,
                                uint8_t* __restrict__ xq, float* __restrict__ xs) {
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t item = warp0; item < groups * ld; item += n_warps) {
    const int64_t g = item / ld, t = item % ld;
    if (t >= n) {
      if (lane == 0) xs[item] = 0.0f;
      continue;
    }
    const int64_t c = g * 128 + lane * 4;
    const bool in = c < cols;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (in) v = __ldg(reinterpret_cast<const float4*>(x + t * cols + c));
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    // Divisions rounded to nearest (as the CPU twin's); satfinite clamps to +-448.
    const float s = __fdiv_rn(fmaxf(amax, kAmaxFloor), kE4M3Max);
    if (in) {
      const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v.x, s), __fdiv_rn(v.y, s)), __NV_SATFINITE,
                                                   __NV_E4M3);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v.z, s), __fdiv_rn(v.w, s)), __NV_SATFINITE,
                                                   __NV_E4M3);
      *reinterpret_cast<uint32_t*>(xq + t * cols + c) = lo | (hi << 16);  // .x in the low byte
    }
    if (lane == 0) xs[item] = s;
  }
}

// The GEMV tile layout (tiled_offset, linear_common.cuh: tiles of R rows, each 4 KB step holding
// 512-byte runs of 8 rows x 64 bytes) -> row-major. One warp per (8 rows, 64 columns): lane l
// copies row 8 i + l / 4, bytes 64 j + 16 (l % 4) .. + 15, so the warp reads one 512-byte run and
// writes 8 rows of 64 bytes. row_bytes (= cols) is a multiple of 4096 / R >= 128.
__global__ void untile_kernel(const uint8_t* __restrict__ src, int64_t rows, int64_t row_bytes, int tile,
                              uint8_t* __restrict__ dst) {
  const int lane = threadIdx.x & 31;
  const int64_t blocks64 = row_bytes >> 6, items = ((rows + 7) >> 3) * blocks64;
  const int64_t warp0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t item = warp0; item < items; item += n_warps) {
    const int64_t row = (item / blocks64) * 8 + (lane >> 2), b = (item % blocks64) * 64 + (lane & 3) * 16;
    if (row >= rows) continue;
    const int64_t off = tiled_offset(row, b, row_bytes, tile);
    *reinterpret_cast<uint4*>(dst + row * row_bytes + b) = __ldg(reinterpret_cast<const uint4*>(src + off));
  }
}

unsigned grid_for(int64_t warps) {
  return static_cast<unsigned>(std::max<int64_t>(std::min<int64_t>((warps + 7) / 8, int64_t(sm_count()) * 16), 1));
}

}  // namespace

bool weight_supported(const WeightView& w) {
  return w.dtype == DType::FP8_E4M3 && w.block == 128 && w.block_scale && w.data && aligned16(w.data) &&
         w.rows > 0 && w.rows % 4 == 0 && w.rows < (int64_t(1) << 31) && w.cols > 0 && w.cols % 16 == 0 &&
         w.cols < (int64_t(1) << 31) && (w.tile == 0 || (w.cols % 128 == 0 && (w.tile == 8 || w.tile == 16 || w.tile == 32))) &&
         (!w.rowmajor || aligned16(w.rowmajor));
}

size_t workspace_bytes(int64_t n, int64_t rows, int64_t cols, bool tiled) {
  const size_t cutlass_ws = std::max(Coop128::workspace(n, rows, cols), Coop128Cluster2::workspace(n, rows, cols));
  return (tiled ? align256(size_t(rows) * cols) : 0) + align256(size_t(n) * cols) +
         align256(size_t((cols + 127) / 128) * scale_ld(n) * 4) + align256(cutlass_ws);
}

void linear(const float* x, int64_t n, const WeightView& w, float* out, void* workspace, size_t workspace_size,
            int variant, cudaStream_t stream) {
  if (n <= 0 || n >= (int64_t(1) << 31) || !weight_supported(w) || !aligned16(x) || !aligned16(out) ||
      !aligned16(workspace) || workspace_size < workspace_bytes(n, w.rows, w.cols, untiles(w)))
    fail(PE_ERR_INTERNAL, "cuda::linear (sm_90 FP8 GEMM): arguments it does not take (", w.rows, "x", w.cols,
         " tile ", w.tile, ", ", n, " tokens, workspace ", workspace_size, " bytes)");
  uint8_t* p = static_cast<uint8_t*>(workspace);
  const void* wdata = w.tile ? w.rowmajor : w.data;
  if (untiles(w)) {
    untile_kernel<<<grid_for(((w.rows + 7) / 8) * (w.cols / 64)), 256, 0, stream>>>(
        static_cast<const uint8_t*>(w.data), w.rows, w.cols, w.tile, p);
    PE_CUDA_LAUNCH_CHECK();
    wdata = p;
    p += align256(size_t(w.rows) * w.cols);
  }
  uint8_t* xq = p;
  float* xs = reinterpret_cast<float*>(xq + align256(size_t(n) * w.cols));
  void* ws = reinterpret_cast<uint8_t*>(xs) + align256(size_t((w.cols + 127) / 128) * scale_ld(n) * 4);
  const int64_t groups = (w.cols + 127) / 128;
  quantize_kernel<<<grid_for(groups * scale_ld(n)), 256, 0, stream>>>(x, n, w.cols, groups, scale_ld(n), xq, xs);
  PE_CUDA_LAUNCH_CHECK();
  if (variant == kCoop128Cluster2)
    Coop128Cluster2::run(xq, xs, n, wdata, w, out, ws, stream);
  else
    Coop128::run(xq, xs, n, wdata, w, out, ws, stream);
}

}  // namespace fp8sm90
}  // namespace cuda
}  // namespace pe
