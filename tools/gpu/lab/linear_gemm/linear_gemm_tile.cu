// The library's GEMM entry points with the tile of n >= 128 tokens set at compile time
// (-DPE_LAB_BM=, -DPE_LAB_BN=, -DPE_LAB_BK=, -DPE_LAB_MINB=), for a preload library that runs the engine on a tile shape of the
// lab other than the library's (ab_prefill.sh); the rest as in linear_gemm.cu. Not part of any
// build otherwise.
#include "kernels/cuda/linear_gemm.cuh"

namespace pe {
namespace cuda {
namespace {

using BigTile = gemm::Tile<PE_LAB_BM, PE_LAB_BN, PE_LAB_BK, PE_LAB_MINB>;
using SmallTile = gemm::Tile<64, 256, 32, 1>;
int64_t g_big_tile_tokens = 128;

template <DType DT>
void launch(bool vec, const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t s) {
  if (!vec) return gemm::launch<DT, false, SmallTile>(x, n, w, out, s);
  if (n >= g_big_tile_tokens) return gemm::launch<DT, true, BigTile>(x, n, w, out, s);
  gemm::launch<DT, true, SmallTile>(x, n, w, out, s);
}

}  // namespace

void linear_gemm_set_big_tile_tokens(int64_t n) { g_big_tile_tokens = n; }

void linear_gemm(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream) {
  auto al = [](const void* p, int a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; };
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
