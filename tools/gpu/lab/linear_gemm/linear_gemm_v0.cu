// The library's GEMM entry points on the v0 kernel (linear_gemm_v0.cuh): compiled in place of
// native/src/kernels/cuda/linear_gemm.cu by ab_prefill.sh here, for the engine's prefill before / after
// in one device call. Not part of any build otherwise.
#include "linear_gemm_v0.cuh"

namespace pe {
namespace cuda {
namespace {
int64_t g_big_tile_tokens = 128;
}

void linear_gemm_set_big_tile_tokens(int64_t n) { g_big_tile_tokens = n; }

void linear_gemm(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream) {
  auto al = [](const void* p, int a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; };
  bool vec = w.cols % 8 == 0 && al(x, 16);
  if (w.dtype == DType::FP8_E4M3) vec = vec && al(w.data, 8) && w.block % 8 == 0;
  else if (w.dtype == DType::I8) vec = vec && al(w.data, 8);
  else if (w.dtype == DType::NVFP4) vec = vec && al(w.data, 4);
  else vec = vec && al(w.data, 16);
  const int64_t big = g_big_tile_tokens;
  switch (w.dtype) {
    case DType::F32: gemm_v0::launch<DType::F32>(vec, big, x, n, w, out, stream); break;
    case DType::F16: gemm_v0::launch<DType::F16>(vec, big, x, n, w, out, stream); break;
    case DType::BF16: gemm_v0::launch<DType::BF16>(vec, big, x, n, w, out, stream); break;
    case DType::I8: gemm_v0::launch<DType::I8>(vec, big, x, n, w, out, stream); break;
    case DType::NVFP4: gemm_v0::launch<DType::NVFP4>(vec, big, x, n, w, out, stream); break;
    default: gemm_v0::launch<DType::FP8_E4M3>(vec, big, x, n, w, out, stream); break;
  }
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
