// Helpers shared by the linear kernels (linear_gemv.cu, linear_gemv_q.cu, linear_gemm.cu):
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

// What the quantized GEMV (linear_gemv_q.cu) does besides out = x W^T; every field off: a plain GEMV.
// - swiglu (cuda_ops.h linear_swiglu, kernel flag kSwiglu): gate rows [0, inter), up rows
//   [up0, up0 + inter) of the weight; out[n, inter] = silu(gate) * up.
// - norm_*: the consumer of a split norm (cuda_ops.h SplitNorm): each token's sums times
//   1 / sqrt(sum of its norm_parts partials / norm_dim + norm_eps).
// - res_*: the producer of a split norm (linear_add_norm): no out; res_x[n, rows] += the sums,
//   res_h = res_x * (res_offset ? 1 + res_w : res_w), res_partial[token * row blocks + row block] =
//   the row block's sum of res_x^2.
struct GemvEpilogue {
  int64_t up0 = 0, inter = 0;
  const float* norm_partial = nullptr;
  int norm_parts = 0;
  float norm_dim = 0.0f, norm_eps = 0.0f;
  float* res_x = nullptr;
  float* res_h = nullptr;
  const float* res_w = nullptr;
  float* res_partial = nullptr;
  bool res_offset = false;
};

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Streaming 16-byte load: weights are read once, keep them out of L1. On sm_80+ code the load
// also asks L2 to fetch the whole 128-byte line from DRAM (.L2::128B, a cache hint: the same
// values; faster than no hint and than 256 B on the 27B decode step, tools/gpu/KERNELS.md).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PE_LOAD_L2_HINT ".L2::128B"
#else
#define PE_LOAD_L2_HINT ""
#endif
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate" PE_LOAD_L2_HINT ".v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Read-only loads the GEMV step issues with its weight loads (x in registers, FP8 block scales).
// As asm volatile they keep their place ahead of the step's first mma; by __ldg, ptxas (sm_90)
// puts 4 of the swiglu step's 18 loads after it, behind the weights' DRAM latency.
__device__ __forceinline__ float4 load_nc_f4(const float* p) {
  float4 v;
  asm volatile("ld.global.nc.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
// Loads and stores between blocks of one grid (sm_70+): relaxed (one word, its own flag), at GPU
// scope.
__device__ __forceinline__ unsigned ld_relaxed_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_gpu(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Spin limits: a wait on another block of the grid that lasts ~2^32 cycles (seconds) is a deadlock
// (a block not resident); trap (a launch error) rather than hang.
__device__ __forceinline__ void spin_check(long long t0) {
  if (clock64() - t0 > (1LL << 32)) __trap();
}
// *p once nonzero (relaxed polls).
__device__ __forceinline__ unsigned wait_nonzero(const unsigned* p) {
  unsigned v = ld_relaxed_gpu(p);
  for (const long long t0 = clock64(); v == 0; v = ld_relaxed_gpu(p)) spin_check(t0);
  return v;
}
__device__ __forceinline__ float load_nc_f32(const float* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

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

// The GEMV tile layout (WeightView::tile = R rows, T = R / 8 row groups of 8): a row block of R
// rows is a run of tiles, one per GEMV step of S = 4096 / R bytes of each row; tile `it` holds
// the 16-byte chunks of its R x S bytes as [r][c][g][t] (row 8r + g, row bytes it * S + (4c + t) *
// 16 .. + 15, c < C = 8 / T): exactly the warp's loads of that step, load (r, c) 512 contiguous
// bytes, so a step reads 4 KB in one run instead of R row segments (the loads alone at the gemv's
// grid, gate|up at R = 32: 95 % of the copy bandwidth against 58 for row-major rows). Needs
// row bytes % S == 0; the last row block is padded to R rows (tile_weight). Byte b of row `row`:
// (R is a power of two: shifts, not the 64-bit divisions a GEMM load could not afford.)
__host__ __device__ __forceinline__ int64_t tiled_offset(int64_t row, int64_t b, int64_t row_bytes, int tile) {
  const int lr = tile == 32 ? 5 : tile == 16 ? 4 : 3, ls = 12 - lr;  // log2 R, log2 S
  const int rr = static_cast<int>(row & (tile - 1)), bb = static_cast<int>(b & ((1 << ls) - 1));
  const int chunk = (((rr >> 3) << (6 - lr)) + (bb >> 6)) * 32 + (rr & 7) * 4 + ((bb >> 4) & 3);
  return (((row >> lr) * (row_bytes >> ls) + (b >> ls)) << 12) + chunk * 16 + (bb & 15);
}

// The quantized GEMV's row groups per warp for a row-major weight of `rows` rows (1, 2 or 4, or the
// tuning's; linear_gemv_q.cu): also the tile a weight gets (gemv_tile_rows, weight_tiles.cu).
int gemv_rows_per_warp(int64_t rows);

// The formats the quantized GEMV (linear_gemv_q.cu) and the tile layout take.
inline bool quantized_weight(const WeightView& w) {
  return w.dtype == DType::FP8_E4M3 || w.dtype == DType::I8 || w.dtype == DType::NVFP4;
}

// Whether w can take the tile layout of `tile` rows (tile_weight, gemv_tile_rows): a quantized
// format and row bytes a multiple of 4096 / tile (the last row block is padded).
inline bool tile_fits(const WeightView& w, int tile) {
  const int64_t row_bytes = static_cast<int64_t>(dtype_bytes_for(w.dtype, w.cols));
  return quantized_weight(w) && (tile == 8 || tile == 16 || tile == 32) && w.rows > 0 && row_bytes > 0 &&
         row_bytes % (4096 / tile) == 0;
}

// Byte index of the quantized weight (row, col) in w.data (NVFP4: the byte holding its nibble).
__device__ __forceinline__ int64_t quant_byte(const WeightView& w, int64_t row, int64_t col) {
  const int64_t row_bytes = w.dtype == DType::NVFP4 ? w.cols / 2 : w.cols;
  const int64_t b = w.dtype == DType::NVFP4 ? col >> 1 : col;
  return w.tile ? tiled_offset(row, b, row_bytes, w.tile) : row * row_bytes + b;
}

// Element (row, col) of any weight format as fp32, scales applied. Slow paths and edge shapes.
__device__ __forceinline__ float weight_elem(const WeightView& w, int64_t row, int64_t col) {
  const int64_t i = row * w.cols + col;
  switch (w.dtype) {
    case DType::F32: return static_cast<const float*>(w.data)[i];
    case DType::F16: return f16_bits_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::I8:
      return static_cast<float>(static_cast<const int8_t*>(w.data)[quant_byte(w, row, col)]) * w.row_scale[row];
    case DType::NVFP4: {
      const uint32_t nib = (static_cast<const uint8_t*>(w.data)[quant_byte(w, row, col)] >> ((i & 1) * 4)) & 0xfu;
      const float v = __low2float(as_h2(e2m1x2_to_h2<0>(nib))) * 16384.0f;
      return v * e4m3_to_f32(w.group_scale[i >> 4]) * w.global_scale;
    }
    default: {
      const int64_t ncb = (w.cols + w.block - 1) / w.block;
      const float s = w.block_scale[(row / w.block) * ncb + col / w.block];
      return e4m3_to_f32(static_cast<const uint8_t*>(w.data)[quant_byte(w, row, col)]) * s;
    }
  }
}

}  // namespace cuda
}  // namespace pe
