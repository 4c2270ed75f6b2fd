// Helpers shared by the CUDA kernels (internal to kernels/cuda/): error checks, weight element
// decoding, warp/block reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_check.cuh"
#include "core/error.h"
#include "kernels/cuda/cuda_ops.h"


namespace pe {
namespace cuda {

// Programmatic dependent launch (PTX griddepcontrol, sm_90+; no-ops when compiled for older GPUs
// and in a kernel launched without cudaLaunchAttributeProgrammaticStreamSerialization).
// pdl_wait: returns once the preceding kernels of the stream have completed and their writes are
// visible; a kernel launched with the attribute reads their outputs, and writes anything, only
// after it. pdl_trigger: the next kernel, if launched with the attribute, may start its blocks
// now (else it starts when every block of this one has exited).
// Asks L2 for the line holding p (no registers, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// pdl_supported: the library's kernels run their sm_90 code (a probe kernel compiled with the same
// architectures was built from compute_90+ PTX), so griddepcontrol is in them (device.cu).
bool pdl_supported();
int sm_count();    // of the current device (device.cu)
int compute_capability();  // of the current device, 10 * major + minor (device.cu)
int smem_optin();  // the current device's shared memory a block may opt in to, bytes (device.cu)
int smem_per_sm();  // the current device's shared memory per SM, bytes (device.cu)

// A launch that may start before the previous kernel of the stream finishes (programmatic
// dependent launch) when `pdl`: the kernel MUST then call pdl_wait() before it reads another
// kernel's output or writes anything; before that it may only read what no kernel of the step
// writes (weights, its arguments). Otherwise a plain launch.
template <typename... Params, typename... Args>
void launch_ex(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
               Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = pdl ? &attr : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  PE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...));
}

// launch_ex with PDL where pdl_supported().
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  launch_ex(pdl_supported(), kernel, grid, block, smem, stream, static_cast<Args&&>(args)...);
}

inline unsigned grid_1d(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `red` is __shared__ float[32]. Contains __syncthreads.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + __expf(-x)); }

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
__device__ __forceinline__ float f16_bits_to_f32(uint16_t b) {
  return __half2float(__ushort_as_half(b));
}

// Two e4m3fn bytes (low two bytes of x) -> their values / 256 as fp16x2, exactly: moving the
// 4-bit exponent and 3-bit mantissa into the fp16 fields gives 2^(e-15)(1+m/8) for 2^(e-7)(1+m/8),
// and the same 2^-8 factor on subnormals. The caller multiplies by 256 (folded into the scale).
// NaN (0x7f) decodes as 480: checkpoints hold no NaN.
__device__ __forceinline__ __half2 fp8x2_to_half2_div256(uint32_t x) {
  const uint32_t y = __byte_perm(x, 0u, 0x4140);  // b0 -> bits 0..7, b1 -> bits 16..23
  const uint32_t h = ((y & 0x00800080u) << 8) | ((y & 0x007f007fu) << 7);
  return *reinterpret_cast<const __half2*>(&h);
}

// sm_89+ has the conversion in hardware: cvt.rn.f16x2.e4m3x2 turns the e4m3 pair in the low
// (high) 16 bits of w into fp16x2 `lo` (`hi`), low byte in the low half, the values themselves
// (not / 256), exactly. kFp8Cvt says whether the code being compiled has it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
constexpr bool kFp8Cvt = true;
__device__ __forceinline__ void e4m3x4_cvt(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}
#else
constexpr bool kFp8Cvt = false;
__device__ __forceinline__ void e4m3x4_cvt(uint32_t, uint32_t& lo, uint32_t& hi) {  // callers check kFp8Cvt
  lo = hi = 0u;
  __trap();
}
#endif

__device__ __forceinline__ float fp8_to_f32(uint8_t b) {
  const __half2 h = fp8x2_to_half2_div256(b);
  return __low2float(h) * 256.0f;
}

// Element (row, col) of a weight as fp32 (FP8: block scale applied). Slow path and tests.
__device__ __forceinline__ float weight_at(const WeightView& w, int64_t row, int64_t col) {
  const int64_t i = row * w.cols + col;
  switch (w.dtype) {
    case DType::F32: return static_cast<const float*>(w.data)[i];
    case DType::F16: return f16_bits_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    default: {
      const int64_t ncb = (w.cols + w.block - 1) / w.block;
      const float s = w.block_scale[(row / w.block) * ncb + col / w.block];
      return fp8_to_f32(static_cast<const uint8_t*>(w.data)[i]) * s;
    }
  }
}

// Validates a weight on the host (dtype supported, FP8 has scales).
void check_weight(const WeightView& w, const char* op);

}  // namespace cuda
}  // namespace pe
