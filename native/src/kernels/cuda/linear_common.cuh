// Helpers shared by the linear kernels (linear_gemv.cu, linear_gemv_q.cu, linear_gemm.cu,
// linear_gemm_sm80.cu):
// weight decoders to fp16x2 built from integer ops (sm_75 has no fp8 cvt; the F2F conversion
// pipe is 1/8 rate on sm_90, too slow for a memory-bound GEMV), the tensor-core mma, and an
// element accessor for every weight format (slow paths).
//
// Exactness: every decoder here is exact. e4m3 -> fp16 keeps the 4-bit exponent and 3-bit
// mantissa (value / 256, subnormals included); int8 -> fp16 via the 1024 + v magic number;
// e2m1 -> fp16 (value * 2^-14, its subnormal 0.5 included); e2m1 * e4m3 group scale products are
// exact in fp16 when the scale is taken * 2^7 (6 significant bits, range 2^-17 .. 21).
#pragma once
#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Streaming 16-byte load: weights are read once, keep them out of L1.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// load_stream under an L2 cache policy (sm_80+; plain load_stream before). With
// evict_first_policy(): a decode step streams ~27 GB of weights through a ~50 MB L2, evicting the
// small kernels' code and activations between their uses unless the weights leave first.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}
__device__ __forceinline__ uint4 load_stream_hint(const void* p, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(policy));
  return r;
#else
  (void)policy;
  return load_stream(p);
#endif
}

// Asks L2 for the line holding p (no registers, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Bytes 0,1 (HI = false) or 2,3 (HI = true) of u, e4m3 -> fp16x2 of value / 256. prmt with the
// sign-replicate selector makes each 16-bit lane the sign-extended byte; << 7 moves exponent and
// mantissa into the fp16 fields and the sign to bit 15, the mask drops bit 14 and what the low
// lane shifted into the high one. NaN (0x7f) decodes as 480 / 256 (checkpoints hold no NaN).
template <bool HI>
__device__ __forceinline__ uint32_t e4m3x2_to_h2(uint32_t u) {
  const uint32_t p = prmt(u, 0u, HI ? 0xB3A2u : 0x9180u);
  return (p << 7) & 0xBF80BF80u;
}

// Bytes 0,1 / 2,3 of u, int8 -> fp16x2 exactly: 0x64xx is 1024 + xx, xx = v + 128.
template <bool HI>
__device__ __forceinline__ uint32_t i8x2_to_h2(uint32_t u) {
  const uint32_t p = prmt(u ^ 0x80808080u, 0x64646464u, HI ? 0x7362u : 0x5140u);
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&p), __half2half2(__ushort_as_half(0x6480)));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Nibbles I and I + 4 of u (e2m1) -> fp16x2 of value * 2^-14: magnitude bits to 9..11 (an fp16
// exponent of 0..3 and one mantissa bit: exactly e2m1 scaled, its e = 0 code an fp16 subnormal),
// then the sign from bit 12 to bit 15 (v + 7 * s << 12 carries it there).
template <int I>
__device__ __forceinline__ uint32_t e2m1x2_to_h2(uint32_t u) {
  const uint32_t v = (I < 3 ? (u << (9 - 4 * I)) : (u >> 3)) & 0x1E001E00u;
  return v + 7u * (v & 0x10001000u);
}

__device__ __forceinline__ __half2 as_h2(uint32_t u) { return *reinterpret_cast<const __half2*>(&u); }
__device__ __forceinline__ uint32_t as_u32(__half2 h) { return *reinterpret_cast<const uint32_t*>(&h); }

// c (16x8 f32) += a (16x16 f16, row) * b (16x8 f16, col): m16n8k16 on sm_80+, two m16n8k8 on
// sm_75 (the same fragments: a0,a1,b0 hold k 0..7 and a2,a3,b1 k 8..15). Not volatile: a pure
// register op, so the compiler may interleave independent mmas with the decode around them.
__device__ __forceinline__ void mma_16816(float* c, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b[0]));
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[2]), "r"(a[3]), "r"(b[1]));
#endif
}

__device__ __forceinline__ float e4m3_to_f32(uint32_t byte) {
  return __low2float(as_h2(e4m3x2_to_h2<false>(byte))) * 256.0f;
}

// Element (row, col) of any weight format as fp32, scales applied. Slow paths and edge shapes.
__device__ __forceinline__ float weight_elem(const WeightView& w, int64_t row, int64_t col) {
  const int64_t i = row * w.cols + col;
  switch (w.dtype) {
    case DType::F32: return static_cast<const float*>(w.data)[i];
    case DType::F16: return f16_bits_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::I8: return static_cast<float>(static_cast<const int8_t*>(w.data)[i]) * w.row_scale[row];
    case DType::NVFP4: {
      const uint32_t nib = (static_cast<const uint8_t*>(w.data)[i >> 1] >> ((i & 1) * 4)) & 0xfu;
      const float v = __low2float(as_h2(e2m1x2_to_h2<0>(nib))) * 16384.0f;
      return v * e4m3_to_f32(w.group_scale[i >> 4]) * w.global_scale;
    }
    default: {
      const int64_t ncb = (w.cols + w.block - 1) / w.block;
      const float s = w.block_scale[(row / w.block) * ncb + col / w.block];
      return e4m3_to_f32(static_cast<const uint8_t*>(w.data)[i]) * s;
    }
  }
}

// ---- GEMM tiles (linear_gemm.cu, linear_gemm_sm80.cu): 8 weights of a row, raw, and their
// conversion to fp16 as stored into the shared tiles; x rounded the same way. ----
struct GemmRaw {
  uint4 a, b;  // up to 8 raw elements (32 bytes)
  float s;     // FP8 block / I8 row / NVFP4 group * global scale
};

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  lo = fminf(fmaxf(lo, -65504.0f), 65504.0f);
  hi = fminf(fmaxf(hi, -65504.0f), 65504.0f);
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint4 floats_to_half8(const float* f) {
  return make_uint4(pack_half2(f[0], f[1]), pack_half2(f[2], f[3]), pack_half2(f[4], f[5]),
                    pack_half2(f[6], f[7]));
}

template <DType DT, bool VEC>
__device__ __forceinline__ uint4 convert_w(const GemmRaw& r) {
  if constexpr (!VEC || DT == DType::F32) {
    float f[8];
    *reinterpret_cast<uint4*>(f) = r.a;
    *reinterpret_cast<uint4*>(f + 4) = r.b;
    return floats_to_half8(f);
  } else if constexpr (DT == DType::F16) {
    return r.a;
  } else if constexpr (DT == DType::I8) {
    float f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
      f[e] = static_cast<float>(static_cast<int8_t>((e < 4 ? r.a.x : r.a.y) >> (8 * (e & 3)))) * r.s;
    return floats_to_half8(f);
  } else if constexpr (DT == DType::NVFP4) {
    float f[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // pair i holds nibbles i and i + 4, value * 2^-14
      const float2 p = __half22float2(as_h2(i == 0   ? e2m1x2_to_h2<0>(r.a.x)
                                            : i == 1 ? e2m1x2_to_h2<1>(r.a.x)
                                            : i == 2 ? e2m1x2_to_h2<2>(r.a.x)
                                                     : e2m1x2_to_h2<3>(r.a.x)));
      f[i] = p.x * (r.s * 16384.0f);
      f[i + 4] = p.y * (r.s * 16384.0f);
    }
    return floats_to_half8(f);
  } else if constexpr (DT == DType::BF16) {
    const uint32_t u[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
    float f[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      f[2 * e] = __uint_as_float(u[e] << 16);
      f[2 * e + 1] = __uint_as_float(u[e] & 0xffff0000u);
    }
    return floats_to_half8(f);
  } else {
    const uint32_t u[2] = {r.a.x, r.a.y};
    // e4m3 -> fp16 is exact (value / 256, the 256 folded into r.s); when the block scale keeps
    // every product in fp16's normal range the scaling is one fp16 multiply per pair (the scale
    // rounded to fp16 once: 2^-11, within the GEMM's fp16 tolerance), else fp32 as below.
    if (r.s >= 6.2e-5f && r.s <= 146.0f) {
      const __half2 s2 = __float2half2_rn(r.s);
      uint4 o;
      o.x = as_u32(__hmul2(as_h2(e4m3x2_to_h2<false>(u[0])), s2));
      o.y = as_u32(__hmul2(as_h2(e4m3x2_to_h2<true>(u[0])), s2));
      o.z = as_u32(__hmul2(as_h2(e4m3x2_to_h2<false>(u[1])), s2));
      o.w = as_u32(__hmul2(as_h2(e4m3x2_to_h2<true>(u[1])), s2));
      return o;
    }
    float f[8];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float2 lo = __half22float2(fp8x2_to_half2_div256(u[e]));
      const float2 hi = __half22float2(fp8x2_to_half2_div256(u[e] >> 16));
      f[4 * e] = lo.x * r.s;
      f[4 * e + 1] = lo.y * r.s;
      f[4 * e + 2] = hi.x * r.s;
      f[4 * e + 3] = hi.y * r.s;
    }
    return floats_to_half8(f);
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}


// cp.async (sm_80+ only; callers guard with __CUDA_ARCH__ >= 800): BYTES (4, 8 or 16) from global
// to shared memory, zeros when !in (src-size 0: nothing is read). 16-byte copies bypass L1.
template <int BYTES>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool in) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  if constexpr (BYTES == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(in ? 16 : 0) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(d), "l"(src), "n"(BYTES), "r"(in ? BYTES : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace cuda
}  // namespace pe
