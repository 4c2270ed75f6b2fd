// Lab: W8A8 FP8 GEMM for block-scaled FP8 weights on sm_90a (fp8_gemm_sm90.h has the math and the
// layouts). The activation quantizer is ours; the GEMM is CUTLASS 4.2's TMA + wgmma warp-specialized
// kernel with blockwise scale promotion (KernelTmaWarpSpecialized{Cooperative,Pingpong}FP8Blockwise,
// as in its example 67), configured for our operands:
//   A = xq [n, cols] e4m3, K-major          SFA: 1 token x 128 k per scale, M-major (xs)
//   B = W [rows, cols] e4m3, K-major        SFB: 128 rows x 128 k per scale, K-major (block_scale)
//   D = out [n, rows] fp32, row-major       no C (beta = 0): D = the scaled accumulators
//
// The file compiles whole, or (build.sh, two cores) in parts: PE_FP8_PART 0 holds the quantizer, the
// dispatch and kCoop128, parts 1 to 3 one more variant each.
#include <cuda_fp8.h>

#include <algorithm>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"
#include "fp8_gemm_sm90.h"

#ifndef PE_FP8_PART
#define PE_FP8_ALL 1
#define PE_FP8_PART 0
#else
#define PE_FP8_ALL 0
#endif

namespace pe {
namespace cuda {
namespace fp8sm90 {

// Scheduler: void = CUTLASS's persistent data-parallel one (one output tile per CTA at a time),
// cutlass::gemm::StreamKScheduler = K split across CTAs to balance the last wave (vLLM's choice
// where cols > 3 rows), forced to stream-K with the deterministic fix-up.
template <class TileShape, class ClusterShape, class MainSchedule, class EpiSchedule, class Scheduler = void>
struct BlockFp8Gemm {
  using E4M3 = cutlass::float_e4m3_t;
  using LayoutA = cutlass::layout::RowMajor;     // xq [n, cols]
  using LayoutB = cutlass::layout::ColumnMajor;  // W [rows, cols]: B(k, r) at r * cols + k
  using LayoutD = cutlass::layout::RowMajor;     // out [n, rows]
  static constexpr int kAlignAB = 16, kAlignD = 4;  // 16-byte TMA rows
  // Scale granularity (M, N, K) = (1 token, 128 weight rows, 128 k); SFA M-major, SFB K-major.
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN, cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,  // accumulator, compute
      void, LayoutD, kAlignD,                                         // no C
      float, LayoutD, kAlignD, EpiSchedule>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4M3, cute::tuple<LayoutA, LayoutSFA>, kAlignAB, E4M3,
      cute::tuple<LayoutB, LayoutSFB>, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const uint8_t* xq, const float* xs, int64_t n, const WeightView& w,
                                            float* out) {
    const int M = static_cast<int>(n), N = static_cast<int>(w.rows), K = static_cast<int>(w.cols);
    // SFA spans scale_ld(n) tokens (its TMA wants 16-byte strides): the pad tokens' scales are
    // loaded with their tile and scale rows that are never stored.
    const auto sfa = ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(static_cast<int>(scale_ld(n)), N, K, 1));
    const auto sfb = ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(M, N, K, 1));
    const auto sa = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(M, K, 1));
    const auto sb = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(N, K, 1));
    const auto sc = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, cute::make_shape(M, N, 1));
    const auto sd = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, cute::make_shape(M, N, 1));
    typename Gemm::Arguments a{cutlass::gemm::GemmUniversalMode::kGemm,
                               {M, N, K, 1},
                               {reinterpret_cast<const E4M3*>(xq), sa, static_cast<const E4M3*>(w.data), sb, xs, sfa,
                                w.block_scale, sfb},
                               {{}, nullptr, sc, out, sd}};
    a.epilogue.thread.alpha = 1.0f;
    a.epilogue.thread.beta = 0.0f;
    static const int sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
    a.hw_info.sm_count = sm_count;
    if constexpr (cute::is_same_v<Scheduler, cutlass::gemm::StreamKScheduler>)
      a.scheduler.decomposition_mode = decltype(a.scheduler.decomposition_mode)::StreamK;
    return a;
  }

  static size_t workspace(int64_t n, const WeightView& w) {
    return Gemm::get_workspace_size(arguments(nullptr, nullptr, n, w, nullptr));
  }

  static int32_t run(const uint8_t* xq, const float* xs, int64_t n, const WeightView& w, float* out, void* ws,
                     cudaStream_t stream) {
    const auto a = arguments(xq, xs, n, w, out);
    Gemm gemm;
    if (Gemm::can_implement(a) != cutlass::Status::kSuccess) return kErrArgs;
    if (gemm.initialize(a, ws, stream) != cutlass::Status::kSuccess) return kErrCutlass;
    if (gemm.run(stream) != cutlass::Status::kSuccess) return kErrCutlass;
    return cudaPeekAtLastError() == cudaSuccess ? 0 : kErrCuda;
  }
};

using cute::_1;
using cute::_2;
using cute::_64;
using cute::_128;
using cute::Shape;
using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise;
using Coop128 = BlockFp8Gemm<Shape<_128, _128, _128>, Shape<_1, _1, _1>, Coop,
                             cutlass::epilogue::TmaWarpSpecializedCooperative>;
using Coop128C2 = BlockFp8Gemm<Shape<_128, _128, _128>, Shape<_1, _2, _1>, Coop,
                               cutlass::epilogue::TmaWarpSpecializedCooperative>;
using Pingpong64 = BlockFp8Gemm<Shape<_64, _128, _128>, Shape<_1, _1, _1>, Pingpong,
                                cutlass::epilogue::TmaWarpSpecialized>;
using StreamK128C2 = BlockFp8Gemm<Shape<_128, _128, _128>, Shape<_1, _2, _1>, Coop,
                                  cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler>;

// One entry pair per variant; each part defines its own, part 0 calls them all.
#define PE_FP8_VARIANT(NAME, CFG)                                                                            \
  size_t NAME##_workspace(int64_t n, const WeightView& w) { return CFG::workspace(n, w); }                   \
  int32_t NAME##_run(const uint8_t* xq, const float* xs, int64_t n, const WeightView& w, float* out, void* ws, \
                     cudaStream_t s) {                                                                       \
    return CFG::run(xq, xs, n, w, out, ws, s);                                                               \
  }
#define PE_FP8_DECLARE(NAME)                                     \
  size_t NAME##_workspace(int64_t n, const WeightView& w);       \
  int32_t NAME##_run(const uint8_t* xq, const float* xs, int64_t n, const WeightView& w, float* out, void* ws, \
                     cudaStream_t s);

PE_FP8_DECLARE(coop128)
PE_FP8_DECLARE(coop128c2)
PE_FP8_DECLARE(pingpong64)
PE_FP8_DECLARE(streamk128c2)

#if PE_FP8_ALL || PE_FP8_PART == 0
PE_FP8_VARIANT(coop128, Coop128)
#endif
#if PE_FP8_ALL || PE_FP8_PART == 1
PE_FP8_VARIANT(coop128c2, Coop128C2)
#endif
#if PE_FP8_ALL || PE_FP8_PART == 2
PE_FP8_VARIANT(pingpong64, Pingpong64)
#endif
#if PE_FP8_ALL || PE_FP8_PART == 3
PE_FP8_VARIANT(streamk128c2, StreamK128C2)
#endif

#if PE_FP8_PART == 0
namespace {

constexpr float kE4M3Max = 448.0f;
constexpr float kAmaxFloor = 1e-10f;  // vLLM's eps: an all-zero group gets a tiny scale, not 0

// One warp per (128-column group g, token t), items in the order of xs (g major), so consecutive
// warps store consecutive scales; each lane quantizes 4 columns (cols % 16 == 0: all 4 in or out).
// Pad tokens t in [n, ld) only get a 0 scale.
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
    // Division rounded to nearest, as vLLM's x / scale (fast-math would make it approximate);
    // satfinite clamps to +-448 like its clamp.
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

size_t align256(size_t b) { return (b + 255) / 256 * 256; }
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// kAuto: vLLM's sm90 blockwise choice (cluster 1x2x1; stream-K where cols > 3 rows), until the lab
// says otherwise.
int32_t pick(int32_t variant, const WeightView& w) {
  if (variant != kAuto) return variant;
  return w.cols > 3 * w.rows ? kStreamK128C2 : kCoop128C2;
}

bool weight_ok(const WeightView& w) {
  return w.dtype == DType::FP8_E4M3 && w.block == 128 && w.tile == 0 && w.block_scale && w.data && w.rows > 0 &&
         w.rows % 4 == 0 && w.cols > 0 && w.cols % 16 == 0 && aligned16(w.data) && w.rows < (1ll << 31) &&
         w.cols < (1ll << 31);
}

}  // namespace

const char* variant_name(int32_t v) {
  switch (v) {
    case kAuto: return "auto";
    case kCoop128: return "coop128x128";
    case kCoop128C2: return "coop128x128c2";
    case kPingpong64: return "pp64x128";
    case kStreamK128C2: return "streamk128c2";
    default: return "?";
  }
}

int32_t quantize_x(const float* x, int64_t n, int64_t cols, uint8_t* xq, float* xs, cudaStream_t stream) {
  if (n <= 0 || cols <= 0 || cols % 16 != 0 || !aligned16(x) || !aligned16(xq) || !aligned16(xs)) return kErrArgs;
  const int64_t groups = (cols + 127) / 128, items = groups * scale_ld(n);
  const int64_t blocks = std::min<int64_t>((items + 7) / 8, 132 * 16);  // 8 warps a block, grid-stride
  quantize_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, n, cols, groups, scale_ld(n), xq, xs);
  return cudaPeekAtLastError() == cudaSuccess ? 0 : kErrCuda;
}

size_t gemm_workspace_bytes(int64_t n, int64_t rows, int64_t cols, int32_t variant) {
  WeightView w;
  w.dtype = DType::FP8_E4M3;
  w.rows = rows;
  w.cols = cols;
  switch (pick(variant, w)) {
    case kCoop128: return coop128_workspace(n, w);
    case kCoop128C2: return coop128c2_workspace(n, w);
    case kPingpong64: return pingpong64_workspace(n, w);
    case kStreamK128C2: return streamk128c2_workspace(n, w);
    default: return 0;
  }
}

int32_t gemm(const uint8_t* xq, const float* xs, int64_t n, const WeightView& w, float* out, void* workspace,
             int32_t variant, cudaStream_t stream) {
  if (n <= 0 || n >= (1ll << 31) || !weight_ok(w) || !aligned16(out) || !aligned16(xq) || !aligned16(xs))
    return kErrArgs;
  switch (pick(variant, w)) {
    case kCoop128: return coop128_run(xq, xs, n, w, out, workspace, stream);
    case kCoop128C2: return coop128c2_run(xq, xs, n, w, out, workspace, stream);
    case kPingpong64: return pingpong64_run(xq, xs, n, w, out, workspace, stream);
    case kStreamK128C2: return streamk128c2_run(xq, xs, n, w, out, workspace, stream);
    default: return kErrArgs;
  }
}

size_t workspace_bytes(int64_t n, int64_t rows, int64_t cols) {
  size_t g = 0;
  for (int32_t v = kCoop128; v < kNumVariants; ++v) g = std::max(g, gemm_workspace_bytes(n, rows, cols, v));
  return align256(size_t(n) * cols) + align256(size_t((cols + 127) / 128) * scale_ld(n) * 4) + g;
}

int32_t linear(const float* x, int64_t n, const WeightView& w, float* out, void* workspace, size_t workspace_size,
               int32_t variant, cudaStream_t stream) {
  if (!weight_ok(w) || !workspace || workspace_size < workspace_bytes(n, w.rows, w.cols)) return kErrArgs;
  uint8_t* xq = static_cast<uint8_t*>(workspace);
  float* xs = reinterpret_cast<float*>(xq + align256(size_t(n) * w.cols));
  void* ws = reinterpret_cast<uint8_t*>(xs) + align256(size_t((w.cols + 127) / 128) * scale_ld(n) * 4);
  const int32_t rc = quantize_x(x, n, w.cols, xq, xs, stream);
  return rc ? rc : gemm(xq, xs, n, w, out, ws, variant, stream);
}
#endif  // PE_FP8_PART == 0

}  // namespace fp8sm90
}  // namespace cuda
}  // namespace pe
