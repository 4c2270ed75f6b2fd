// One warp encodes one fp32 (token, kv head) row of D values into its paged-KV bytes and scales,
// as kv_codec.cuh's encoders define them (the same bytes as the CPU kv_write): shared by
// kv_write.cu and the attention inputs that write the cache directly (model_glue.cu). src may
// be global or shared memory; the I8 row max is a warp reduction; a lane encodes 8 consecutive
// NVFP4 values into one 4-byte word (rows of D / 2 bytes, D % 16 == 0: word-aligned where the
// cache is; with_cache_dtype checks), so a group of 16 is two lanes, reduced with one shuffle.
// All 32 lanes must call it.
#pragma once
#include <type_traits>

#include "kernels/cuda/kv_codec.cuh"

namespace pe {
namespace cuda {
namespace kv_row {

constexpr int kPass = 8;  // values (NVFP4: bytes) per lane per pass: 256 (512) per warp

// A lane's values base + 32 i + lane, i < kPass, of a row of D (0 past the end): all loads of a
// pass go out before the first use (a loop whose FP8 encode branches keeps the compiler from
// batching them: 8 dependent loads per row, twice F16's time).
__device__ __forceinline__ void load_pass(const float* __restrict__ src, int D, int base, int lane, float (&x)[kPass]) {
#pragma unroll
  for (int i = 0; i < kPass; ++i) {
    const int e = base + 32 * i + lane;
    x[i] = e < D ? src[e] : 0.0f;
  }
}

// Values v .. v + 7 of a row of D (all 0 where v >= D; D % 8 == 0): two 16-byte loads where src is
// 16-byte aligned (shared rows, dense global rows), else eight, all issued before the first use.
__device__ __forceinline__ void load8(const float* __restrict__ src, int v, int D, float (&x)[8]) {
  if (v >= D) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = 0.0f;
  } else if (reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const float4 a = *reinterpret_cast<const float4*>(src + v), b = *reinterpret_cast<const float4*>(src + v + 4);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = src[v + i];
  }
}

// Encodes a pass loaded by load_pass (I8: inv = 1 / scale).
template <DType KV>
__device__ __forceinline__ void store_pass(const float (&x)[kPass], int base, int D, int lane,
                                           uint8_t* __restrict__ dst, float inv) {
#pragma unroll
  for (int i = 0; i < kPass; ++i) {
    const int e = base + 32 * i + lane;
    if (e >= D) break;
    if constexpr (KV == DType::F32) {
      reinterpret_cast<float*>(dst)[e] = x[i];
    } else if constexpr (KV == DType::F16) {
      reinterpret_cast<uint16_t*>(dst)[e] = __half_as_ushort(__float2half_rn(x[i]));
    } else if constexpr (KV == DType::BF16) {
      reinterpret_cast<uint16_t*>(dst)[e] = kv_enc_bf16(x[i]);
    } else if constexpr (KV == DType::FP8_E4M3) {
      dst[e] = kv_enc_fp8(x[i]);
    } else {  // I8
      const float q = fminf(fmaxf(__fmul_rn(x[i], inv), -127.0f), 127.0f);
      dst[e] = static_cast<uint8_t>(static_cast<int8_t>(__float2int_rn(q)));
    }
  }
}

template <DType KV>
__device__ __forceinline__ void encode_row(const float* __restrict__ src, int D, uint8_t* __restrict__ dst,
                                           float* __restrict__ scales, int lane) {
  if constexpr (KV == DType::NVFP4) {  // lane owns 8 consecutive values (one 4-byte word of the row)
    for (int v0 = 0; v0 < D; v0 += 8 * 32) {  // warp-uniform bound for the shuffle
      const int v = v0 + 8 * lane;
      float x[8];
      load8(src, v, D, x);
      // The max as a tree (3 levels, not a chain of 8); the 0 last, as the first operand of a chain
      // from 0: a NaN value drops out, an all-NaN lane gives 0 (the same max as the CPU's walk).
      const float m01 = fmaxf(fabsf(x[0]), fabsf(x[1])), m23 = fmaxf(fabsf(x[2]), fabsf(x[3]));
      const float m45 = fmaxf(fabsf(x[4]), fabsf(x[5])), m67 = fmaxf(fabsf(x[6]), fabsf(x[7]));
      float m = fmaxf(fmaxf(fmaxf(m01, m23), fmaxf(m45, m67)), 0.0f);
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));  // a group of 16 is lanes 2k, 2k + 1
      const float s = div_rn_by<6>(m);
      const float inv = s > 0.0f ? __frcp_rn(s) : 0.0f;  // = 1 / s rounded (IEEE), no divergent call
      if (v < D) {  // D % 16 == 0: both lanes of a group are in the row or neither
        uint32_t w = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) w |= kv_enc_fp4(__fmul_rn(x[i], inv)) << (4 * i);
        *reinterpret_cast<uint32_t*>(dst + v / 2) = w;  // value 2b in byte b's low nibble
        if ((lane & 1) == 0) scales[v / 16] = s;
      }
    }
    return;
  }
  float inv = 1.0f;
  float x0[kPass];  // the first pass stays in registers: I8 reads its max and encodes from it
  load_pass(src, D, 0, lane, x0);
  if constexpr (KV == DType::I8) {  // the row's max first (a second load only past 256 values)
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < kPass; ++i) m = fmaxf(m, fabsf(x0[i]));
    for (int base = 32 * kPass; base < D; base += 32 * kPass) {
      float x[kPass];
      load_pass(src, D, base, lane, x);
#pragma unroll
      for (int i = 0; i < kPass; ++i) m = fmaxf(m, fabsf(x[i]));
    }
    m = warp_max(m);
    const float s = div_rn_by<127>(m);
    inv = s > 0.0f ? __frcp_rn(s) : 0.0f;
    if (lane == 0) scales[0] = s;
  }
  store_pass<KV>(x0, 0, D, lane, dst, inv);
  for (int base = 32 * kPass; base < D; base += 32 * kPass) {
    float x[kPass];
    load_pass(src, D, base, lane, x);
    store_pass<KV>(x, base, D, lane, dst, inv);
  }
}

// Host side of an op that writes cache rows (kv_write, attention_inputs with a cache): checks the
// layer (failing with `op` in the message) and calls f(std::integral_constant<DType, KV>{}) with
// its dtype, for which the op instantiates its kernel.
template <class F>
void with_cache_dtype(const PagedKV& kv, const char* op, F&& f) {
  if (kv.dtype == DType::NVFP4 && kv.head_dim % kKvFp4Group != 0)
    fail(PE_ERR_UNSUPPORTED, op, ": nvfp4 cache needs head_dim % 16 == 0");
  const auto word_aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; };
  if (kv.dtype == DType::NVFP4 && (!word_aligned(kv.k) || !word_aligned(kv.v)))  // encode_row's word stores
    fail(PE_ERR_INVALID_ARGUMENT, op, ": nvfp4 cache values must be 4-byte aligned");
  if (kv_row_scales(kv.dtype, kv.head_dim) && (!kv.k_scale || !kv.v_scale))
    fail(PE_ERR_INVALID_ARGUMENT, op, ": ", dtype_name(kv.dtype), " cache without scales");
  switch (kv.dtype) {
    case DType::F32: return f(std::integral_constant<DType, DType::F32>{});
    case DType::F16: return f(std::integral_constant<DType, DType::F16>{});
    case DType::BF16: return f(std::integral_constant<DType, DType::BF16>{});
    case DType::FP8_E4M3: return f(std::integral_constant<DType, DType::FP8_E4M3>{});
    case DType::I8: return f(std::integral_constant<DType, DType::I8>{});
    case DType::NVFP4: return f(std::integral_constant<DType, DType::NVFP4>{});
    default: fail(PE_ERR_UNSUPPORTED, op, ": unsupported cache dtype ", dtype_name(kv.dtype));
  }
}

}  // namespace kv_row
}  // namespace cuda
}  // namespace pe
