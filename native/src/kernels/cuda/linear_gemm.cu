// linear for prefill-sized batches (n > 8 tokens; quantized weights from 33, or past
// linear_gemv_max_tokens; small 16-bit / fp32 matrices from 65): out[n, rows] = x[n, cols] * W^T on the fp16
// tensor cores, fp32 accumulation. The kernel and its design: linear_gemm.cuh.
//
// Tiles (measured on the 27B prefill shapes, tools/gpu/KERNELS.md "Prefill"): 128 tokens x 256
// weight rows x 32 k from 128 tokens (warp tile 64 x 64: per mma, half the x and weight conversions
// and shared-memory traffic of 128 x 128), 64 x 256 below and on the scalar path (the 128-token
// tile spills there); one block per SM, 61,440 / 40,960 bytes of shared memory (sm_75's 64 KB
// opt-in holds them).
//
// On compute capability 9.0, FP8 weights with a caller's workspace and >= kFp8GemmMinTokens tokens
// go to the W8A8 wgmma GEMM instead (linear_gemm_fp8_sm90.h; compiled in where CMake defines
// PE_WITH_CUTLASS_SM90).
#include "kernels/cuda/linear_gemm.cuh"
#include "kernels/cuda/linear_gemm_fp8_sm90.h"

namespace pe {
namespace cuda {
namespace {

using BigTile = gemm::Tile<128, 256, 32, 1>;
using SmallTile = gemm::Tile<64, 256, 32, 1>;
int64_t g_big_tile_tokens = 128;  // n >= this: 128-token tiles (weights converted half as often)
int g_fp8_variant = fp8sm90::kCoop128;  // 0: off
int64_t g_fp8_min_tokens = kFp8GemmMinTokens;

bool fp8_sm90_takes(int64_t n, const WeightView& w) {
#ifdef PE_WITH_CUTLASS_SM90
  return g_fp8_variant > 0 && n >= g_fp8_min_tokens && fp8sm90::weight_supported(w) && linear_fp8_sm90_available();
#else
  (void)n;
  (void)w;
  return false;
#endif
}

template <DType DT>
void launch(bool vec, const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t s) {
  if (!vec) return gemm::launch<DT, false, SmallTile>(x, n, w, out, s);
  if (n >= g_big_tile_tokens) return gemm::launch<DT, true, BigTile>(x, n, w, out, s);
  gemm::launch<DT, true, SmallTile>(x, n, w, out, s);
}

}  // namespace

void linear_gemm_set_big_tile_tokens(int64_t n) { g_big_tile_tokens = n; }

void linear_gemm_set_fp8_sm90(int variant, int64_t min_tokens) {
  g_fp8_variant = std::clamp(variant, 0, fp8sm90::kVariants);
  g_fp8_min_tokens = std::max<int64_t>(min_tokens, kGemvMaxTokens + 1);  // the quantized GEMV's below
}

int64_t linear_fp8_sm90_min_tokens() {
  return g_fp8_variant > 0 && linear_fp8_sm90_available() ? g_fp8_min_tokens : 0;
}

bool linear_fp8_sm90_available() {
#ifdef PE_WITH_CUTLASS_SM90
  return compute_capability() == 90;  // sm_90a code runs on 9.0 only
#else
  return false;
#endif
}

size_t linear_workspace_bytes(int64_t n, const WeightView& w) {
  if (!fp8_sm90_takes(n, w)) return 0;
#ifdef PE_WITH_CUTLASS_SM90
  return fp8sm90::workspace_bytes(n, w.rows, w.cols, fp8sm90::untiles(w));
#endif
  return 0;
}

void linear_gemm(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream,
                 const GemmWorkspace* workspace) {
  auto al = [](const void* p, int a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; };
#ifdef PE_WITH_CUTLASS_SM90
  if (workspace && workspace->data && al(x, 16) && al(out, 16) && fp8_sm90_takes(n, w) &&
      workspace->bytes >= fp8sm90::workspace_bytes(n, w.rows, w.cols, fp8sm90::untiles(w)))
    return fp8sm90::linear(x, n, w, out, workspace->data, workspace->bytes, g_fp8_variant, stream);
#else
  (void)workspace;
#endif
  bool vec = w.cols % 8 == 0 && al(x, 16);
  if (w.dtype == DType::FP8_E4M3) vec = vec && al(w.data, 8) && w.block % 8 == 0;
  else if (w.dtype == DType::I8) vec = vec && al(w.data, 8);
  else if (w.dtype == DType::NVFP4) vec = vec && al(w.data, 4);
  else vec = vec && al(w.data, 16);
  switch (w.dtype) {
    case DType::F32: launch<DType::F32>(vec, x, n, w, out, stream); break;
    case DType::F16: launch<DType::F16>(vec, x, n, w, out, stream); break;
    case DType::BF16: launch<DType::BF16>(vec, x, n, w, out, stream); break;
    case DType::I8: launch<DType::I8>(vec, x, n, w, out, stream); break;
    case DType::NVFP4: launch<DType::NVFP4>(vec, x, n, w, out, stream); break;
    default: launch<DType::FP8_E4M3>(vec, x, n, w, out, stream); break;
  }
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
