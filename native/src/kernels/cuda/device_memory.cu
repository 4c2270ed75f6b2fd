#include "kernels/cuda/device_memory.h"

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kv_codec.cuh"

namespace pe {
namespace cuda {

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(void* dst, int dtype, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed ^ mix64(static_cast<uint64_t>(i)));
    const float v = (static_cast<float>(h >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
    switch (dtype) {
      case 0: static_cast<float*>(dst)[i] = v; break;
      case 1: static_cast<__half*>(dst)[i] = __float2half(v); break;
      case 2: static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16(v); break;
      default: static_cast<uint8_t*>(dst)[i] = kv_enc_fp8(v); break;  // the CPU's rounding
    }
  }
}

__global__ void fill_f32_kernel(float* dst, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535)); }

}  // namespace

void fill_random(void* dst, DType dtype, int64_t n, uint64_t seed, float scale) {
  if (n <= 0) return;
  int code;
  switch (dtype) {
    case DType::F32: code = 0; break;
    case DType::F16: code = 1; break;
    case DType::BF16: code = 2; break;
    case DType::FP8_E4M3: code = 3; break;
    default: fail(PE_ERR_UNSUPPORTED, "fill_random: dtype ", dtype_name(dtype), " is not supported");
  }
  fill_random_kernel<<<grid_for(n), 256, 0, stream()>>>(dst, code, n, seed, scale);
  PE_CUDA_LAUNCH_CHECK();
}

void fill_f32(float* dst, int64_t n, float value) {
  if (n <= 0) return;
  fill_f32_kernel<<<grid_for(n), 256, 0, stream()>>>(dst, n, value);
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
