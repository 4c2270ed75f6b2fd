// Device helpers of the tensor-core decode attention (attention_decode_mma.cu, its only
// includers, and tools/gpu/lab's): mma and fragment moves, the per-dtype operand layout (Layout),
// the NVFP4 look-ahead staging (Fp4Stage) and the L2 prefetch of cache rows.
//
// Warp step = 16 keys. S^T (16 keys x 8 vectors) = K Q^T by m16n8k16 with K as A (rows = keys g,
// g+8 of the lane's group g = lane / 4) and Q^T as B, Q split into an fp16 high and low part (two
// mma into one accumulator: ~22-bit q, K exact in fp16 after the kv_codec unit). Each lane then
// holds the scores of keys g, g+8 for vectors 2t, 2t+1 (t = lane % 4): the softmax maxima reduce
// over the 8 groups (3 shuffles), and the rescale of O needs none (O^T's columns are the same
// vectors). P (fp32, <= 1) is split into fp16 high + low, moved into B-operand layout by
// movmatrix, and O^T (16 dims x 8 vectors per m-tile) += V^T P^T (V as A: keys 2t, 2t+1, 2t+8,
// 2t+9). Row scales (I8) and group scales (NVFP4) multiply P per key (per key and m-tile: an
// NVFP4 m-tile is one 16-value group) and the per-k-step partial scores (NVFP4 K).
// Dimension order is free inside a dot product, so every operand is read in whole 16-byte chunks
// (4-byte words for NVFP4) and Q and the output are permuted to match (q_dim / out_dim).
#pragma once
#include "kernels/cuda/attention_decode.cuh"

namespace pe {
namespace cuda {
namespace attn {
namespace {
namespace tc {

constexpr int kVecs = 8, kStep = 16;

__device__ __forceinline__ void mma_k16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else  // sm_75: two k8 halves, same fragments
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a2), "r"(a3), "r"(b1));
#endif
}

// 8x8 b16 transpose in fragment layout (lane 4r + c holds row r, columns 2c, 2c+1).
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// (x, y) = hi + lo in fp16x2 (fp32 - fp16 residual: ~22 significant bits together).
__device__ __forceinline__ void split_f16(float x, float y, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x, y);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

template <DType KV, int D> struct Layout {
  static constexpr bool kFp4 = KV == DType::NVFP4, kF16 = KV == DType::F16;
  static constexpr int KS = D / 16, MT = D / 16;
  // Words per key and lane: K (a quarter of the row; NVFP4: one word per k-step, half used) and V
  // (two dims per m-tile; NVFP4: one word per m-tile, one byte used).
  static constexpr int KW = kFp4 ? KS : kF16 ? D / 8 : D / 16;
  static constexpr int VW = kFp4 ? MT : kF16 ? MT : MT / 2;
  static constexpr int C = kF16 ? 8 : 16;                     // values per 16-byte K chunk
  static constexpr int PW = VW < 4 ? VW : 4;                  // words per V piece
  static constexpr int PV = kF16 ? 2 * PW : 4 * PW;           // values per V piece
  static constexpr float kVMul = KV == DType::I8 ? 64.0f : kFp4 ? 4.0f : 1.0f;  // P' = P s kVMul
  // Row geometry for the L2 prefetch: value bytes, scales, 128-byte lines from the row's start,
  // prefetch items per key (K lines, V lines, then the K and V scale lines; even).
  static constexpr int RB = kFp4 ? D / 2 : kF16 ? 2 * D : D;
  static constexpr int RS = kFp4 ? D / 16 : KV == DType::I8 ? 1 : 0;
  static constexpr int NL = (RB + 127) / 128;
  static constexpr int PF = 2 * NL + (RS ? 2 : 0);

  // FP8 by cvt (sm_89+): a K word's bytes 0, 1 are k half 0 and bytes 2, 3 half 1 (one cvt each),
  // as F16's halfwords are; the integer decode pairs bytes 0, 2 and 1, 3.
  static constexpr bool kPairedBytes = KV == DType::FP8_E4M3 && kFp8Cvt;
  // Physical dim of the Q value that meets K k-step ks, k half `half` (0: k 2t.., 1: k 2t+8..),
  // element e, in lane t (see the K fragment decode in the kernel).
  __device__ static int q_dim(int ks, int half, int e, int t) {
    if constexpr (kFp4) return 16 * ks + 4 * t + half + 2 * e;
    const int v = kF16 || kPairedBytes ? 4 * ks + 2 * half + e : 4 * ks + half + 2 * e;
    return C * (t + 4 * (v / C)) + v % C;
  }
  // q_dim(ks, half, e, t) = q_dim(ks, 0, 0, t) + q_sub(half, e): a k-step's 4 values are 4
  // consecutive dims (4 | C), 16-byte aligned in a row of D % 8 == 0 floats: one float4.
  __host__ __device__ static constexpr int q_sub(int half, int e) {
    return kFp4 || !(kF16 || kPairedBytes) ? half + 2 * e : 2 * half + e;
  }
  // Step jw's K words of keys jw + g, jw + g + 8 (this lane's quarter of each row; rows: the
  // window's cache rows, rb bytes each) and V words of keys jw + 2t, 2t+1, 2t+8, 2t+9 (the dims
  // of rows g, g+8 of every m-tile). Keys past the window (wn) read its last row; their scores are
  // masked, so they add 0 * finite.
  __device__ static void load_k(const uint8_t* kbase, const int64_t* rows, int64_t rb, int jw, int wn, int g, int t,
                                uint32_t (&kw)[2][KW]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint8_t* src = kbase + rows[min(jw + g + 8 * r, wn - 1)] * rb;
      if constexpr (kFp4) {
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) kw[r][ks] = __ldg(reinterpret_cast<const uint32_t*>(src) + 2 * ks + (t >> 1));
      } else {
#pragma unroll
        for (int i = 0; i < KW / 4; ++i) {
          const uint4 x = __ldg(reinterpret_cast<const uint4*>(src) + t + 4 * i);
          kw[r][4 * i] = x.x; kw[r][4 * i + 1] = x.y; kw[r][4 * i + 2] = x.z; kw[r][4 * i + 3] = x.w;
        }
      }
    }
  }
  __device__ static void load_v(const uint8_t* vbase, const int64_t* rows, int64_t rb, int jw, int wn, int g, int t,
                                uint32_t (&vw)[4][VW]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = jw + 2 * t + (r & 1) + 8 * (r >> 1);
      const uint8_t* src = vbase + rows[min(key, wn - 1)] * rb;
      if constexpr (kFp4) {
#pragma unroll
        for (int j = 0; j < MT; ++j) vw[r][j] = __ldg(reinterpret_cast<const uint32_t*>(src) + 2 * j + (g >> 2));
      } else if constexpr (PW == 4) {
#pragma unroll
        for (int i = 0; i < VW / 4; ++i) {
          const uint4 x = __ldg(reinterpret_cast<const uint4*>(src) + g + 8 * i);
          vw[r][4 * i] = x.x; vw[r][4 * i + 1] = x.y; vw[r][4 * i + 2] = x.z; vw[r][4 * i + 3] = x.w;
        }
      } else {  // 8-byte pieces (FP8 / I8 at head_dim 64)
        const uint2 x = __ldg(reinterpret_cast<const uint2*>(src) + g);
        vw[r][0] = x.x; vw[r][1] = x.y;
      }
    }
  }
  // An 8-bit K word (one k-step of a key row) as its two fp16 pairs (k halves 0 and 1).
  __device__ static void decode_k(uint32_t w, uint32_t& lo, uint32_t& hi) {
    if constexpr (KV == DType::FP8_E4M3 && kPairedBytes) {  // bytes 0, 1 and 2, 3: one cvt each
      e4m3x4_cvt(w, lo, hi);
    } else if constexpr (KV == DType::FP8_E4M3) {
      lo = kv_fp8_pair_even(w);
      hi = kv_fp8_pair_odd(w);
    } else if constexpr (KV == DType::I8) {
      lo = kv_i8_pair_even(w ^ 0x80808080u);
      hi = kv_i8_pair_odd(w ^ 0x80808080u);
    }
  }
  // V words hold m-tile j in word v_word(j) (Layout::load_v; 8-bit: two m-tiles a word).
  __host__ __device__ static constexpr int v_word(int j) { return kF16 || kFp4 ? j : j >> 1; }
  // The A operand halves of m-tile j from the V words x0, x1 of two keys (2t, 2t+1 or 2t+8, 2t+9):
  // lo = row g, hi = row g + 8 of the m-tile (NVFP4: fp4_vsel picks byte g & 3 of both words).
  __device__ static void decode_v(uint32_t x0, uint32_t x1, int j, uint32_t fp4_vsel, uint32_t& lo, uint32_t& hi) {
    if constexpr (kF16) {
      lo = __byte_perm(x0, x1, 0x5410);
      hi = __byte_perm(x0, x1, 0x7632);
    } else if constexpr (kFp4) {
      const uint32_t y = __byte_perm(x0, x1, fp4_vsel);
      lo = kv_fp4_pair_lo(y);
      hi = kv_fp4_pair_hi(y);
    } else if constexpr (kPairedBytes) {  // the same pairs: byte b of both keys side by side
      e4m3x4_cvt(__byte_perm(x0, x1, (j & 1) ? 0x7362 : 0x5140), lo, hi);
    } else {
      const uint32_t z = __byte_perm(x0, x1, (j & 1) ? 0x7632 : 0x5410);
      if constexpr (KV == DType::I8) {
        lo = kv_i8_pair_even(z ^ 0x80808080u);
        hi = kv_i8_pair_odd(z ^ 0x80808080u);
      } else {
        lo = kv_fp8_pair_even(z);
        hi = kv_fp8_pair_odd(z);
      }
    }
  }
  // Physical dim of O^T row g + 8h of m-tile j.
  __device__ static int out_dim(int j, int h, int g) {
    if constexpr (kFp4) return 16 * j + 2 * g + h;
    const int v = 2 * j + h;
    return PV * (g + 8 * (v / PV)) + v % PV;
  }
  // Merge layout: dim d of vector v at merge_index(v, d) = v * kPitch + d + (d >> kShift) of the
  // shared accumulator. One merge store (lanes g, t at out_dim(j, h, g) of vectors 2t + e) then
  // hits 32 distinct banks (out_dim alone: 2 banks for FP8/I8, 16-way conflicts; 4 for F16; 8 for
  // NVFP4), and its offset is the lane's base plus a constant (merge_lane + merge_const: the same
  // index, with d >> kShift split, carry-free, into its g and j parts), so the stores take no
  // address math (an XOR swizzle costs F16 ~1.2 us at 1K in address math). Pitches from an
  // exhaustive search over the 12 layouts (dtype x head_dim).
  static constexpr int kShift = kFp4 ? 3 : 5;
  static constexpr int kPitch = kFp4 ? (D == 64 ? 76 : D == 128 ? 148 : 292)
                                : kF16 ? (D == 64 ? 67 : D == 128 ? 133 : 265)
                                       : (D == 64 ? 67 : D == 128 ? 134 : 266);
  __device__ static int merge_index(int v, int d) { return v * kPitch + d + (d >> kShift); }
  __device__ static int merge_lane(int g, int t) {  // vector 2t, the g part of out_dim
    return 2 * t * kPitch + (kFp4 ? 2 * g + (g >> 2) : PV * g + ((PV * g) >> 5));
  }
  __device__ static constexpr int merge_const(int j, int i) {  // vector + e, the j / h part
    const int e = i & 1, h = i >> 1, v = 2 * j + h;
    if constexpr (kFp4) return e * kPitch + 18 * j + h;
    return e * kPitch + PV * 8 * (v / PV) + v % PV + ((PV * 8 * (v / PV)) >> 5);
  }
};

// Shared-memory words, 16 / 8 / 4 bytes at a time (the address is aligned to the width).
template <int N>
__device__ __forceinline__ void st_shared_words(uint32_t* dst, const uint32_t (&w)[N]) {
  if constexpr (N == 4) *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  else if constexpr (N == 2) *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  else dst[0] = w[0];
}
__device__ __forceinline__ void ld_shared_words4(const uint32_t* src, uint32_t* w) {
  const uint4 x = *reinterpret_cast<const uint4*>(src);
  w[0] = x.x; w[1] = x.y; w[2] = x.z; w[3] = x.w;
}

// k2 with qmax * 2^k2 in [2^14, 2^15) (qmax >= 0; 14 for 0): the power of two that gives a Q
// vector's fp16 high + low parts ~22 bits whatever its magnitude.
__device__ __forceinline__ int q_pow2(float qmax) {
  const int ex = qmax > 0.0f ? static_cast<int>((__float_as_uint(qmax) >> 23) & 0xff) - 127 : 0;
  return max(-100, min(100, 14 - ex));
}

// Q fragments of vector g = lane / 4 (qrow: its D values, or null for a padding vector): scaled
// by a power of two so max |q * q_mul| lands in [2^14, 2^15) (the fp16 high + low parts keep ~22
// bits whatever the magnitude), split, stored per k-step and lane; qscale[g] takes the power back.
template <DType KV, int D>
__device__ __forceinline__ void q_fragments(const float* qrow, float q_mul, int lane, uint4 (*qfrag)[32], float* qscale) {
  using L = Layout<KV, D>;
  constexpr int KS = L::KS;
  const int t = lane & 3;
  // Value i of k-step ks: dim q_dim(ks, i & 1, i >> 1, t), component q_sub(i & 1, i >> 1) of
  // the k-step's float4: 16 loads a lane, held for both passes (zeros for padding vectors).
  float4 qv[KS];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
    qv[ks] = qrow ? *reinterpret_cast<const float4*>(qrow + L::q_dim(ks, 0, 0, t)) : make_float4(0.f, 0.f, 0.f, 0.f);
  const auto q_at = [&](int ks, int i) {
    const int c = L::q_sub(i & 1, i >> 1);
    return c == 0 ? qv[ks].x : c == 1 ? qv[ks].y : c == 2 ? qv[ks].z : qv[ks].w;
  };
  float qmax = 0.0f;
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) qmax = fmaxf(qmax, fabsf(q_at(ks, i)));
  qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 1));
  qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 2));
  const int k2 = q_pow2(qmax * fabsf(q_mul));
  const float qm = q_mul * __uint_as_float(static_cast<uint32_t>(127 + k2) << 23);
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    float x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = q_at(ks, i) * qm;
    uint4 f;  // {high k-half 0, high k-half 1, low k-half 0, low k-half 1}
    split_f16(x[0], x[2], f.x, f.z);
    split_f16(x[1], x[3], f.y, f.w);
    qfrag[ks][lane] = f;
  }
  // FP8 by cvt (sm_89+): K values 256x the integer decode's (the host's unit), taken off here.
  if (t == 0) qscale[lane >> 2] = __uint_as_float(static_cast<uint32_t>(127 - k2 - (L::kPairedBytes ? 8 : 0)) << 23);
}

// ---- NVFP4 look-ahead kernel (kFast): whole-chunk loads, fragments exchanged through shared memory ----
// Why: NVFP4 per key with the other dtypes' loads (SASS of the inner loop, head_dim 256, per warp
// step of 16 keys) issues ~1,410 instructions a step against ~910 for FP8 and ~545 for F16. The
// extra: 112 global
// loads (a 4-byte word per group and key row of which 2 (K) or 1 (V) bytes are used; FP8: 20
// 16-byte loads) plus their address math, 64 movmatrix (P' high and low parts per m-tile: an
// NVFP4 m-tile is one group, so P is scaled and transposed 16 times a step), 32 FMUL (V scales x
// kVMul), 64 FFMA (K group scales on the partial scores) and ~256 for P' = P s per m-tile (FMUL +
// fp16 high/low split). The decode itself (~4 integer ops per fp16x2 pair, 128 pairs) is FP8's.
// Inherent to the format: the per-group P scaling and the K-scale FFMA (fp32 group scales: V s
// is not exact in fp16, so the scale cannot go on V). Not inherent: the loads and the movmatrix.
// And a step's loads wait for the previous step's math, which is long for NVFP4: memory is idle
// during it (the steps run at ~1.2 TB/s at 64K where F16 streams 3.2 TB/s).
// Per warp step, each lane loads whole 8/16-byte chunks (K: its quad's rows g, g+8; V: its own
// rows 2t, 2t+1, 2t+8, 2t+9; scales: a quarter of rows g, g+8) and the warp exchanges them through
// a per-warp tile, so every lane then reads ONE word per k-step / m-tile that holds exactly its
// fragment bytes (a word per group and row, of which 2 or 1 of its 4 bytes are used, would be 112
// loads per step instead of 12 here). K word of k-step ks for lane (g, t): bytes 2t, 2t+1 of group ks of
// rows g (bytes 0, 2) and g+8 (bytes 1, 3). V word of m-tile j for lane (g, t): byte g of group j
// of keys 2t, 2t+8, 2t+1, 2t+9 (bytes 0..3). Strides (words) chosen by an exhaustive search of
// the bank conflicts of the stores and loads (D 256: K 48 wavefronts per step, V 32 = the minimum,
// scales 112 for 26 accesses of 16 bytes).
template <int D> struct Fp4Stage {
  static constexpr int KS = D / 16, RB = D / 2;
  static constexpr int CG = KS >= 8 ? 2 : 1;   // groups per K chunk (16- or 8-byte loads)
  static constexpr int NCH = KS / (4 * CG);     // K chunks per lane and row
  static constexpr int PB = RB / 8, VQ = PB / 4;  // V bytes / words per lane and row
  static constexpr int KXG = D == 256 ? 72 : 36, KXT = D == 256 ? 16 : 8;  // K tile [g][t][ks]
  static constexpr int VXT = D == 256 ? 168 : D == 128 ? 104 : 36;  // V tile [t][g][j]
  static constexpr int VXG = D == 256 ? 20 : D == 128 ? 12 : 4;
  static constexpr int SP = KS | 4;             // scale tiles [key][group]
  static constexpr int kKx = 8 * KXG, kVx = 4 * VXT, kSc = 16 * SP;
  static constexpr int kWarpWords = kKx + kVx + 2 * kSc;
  static_assert(KXT >= KS && KXG >= 4 * KXT && VXG >= KS && VXT >= 8 * VXG && NCH >= 1, "tile strides");
  static_assert(KXG % 4 == 0 && KXT % 4 == 0 && VXG % 4 == 0 && VXT % 4 == 0 && SP % 4 == 0, "16-byte rows");
};

// The two values in the nibbles of bytes 1 and 3 (lo: low nibbles, hi: high nibbles) as fp16x2 of
// value / 16384, like kv_fp4_pair_lo / _hi (kv_codec.cuh) do for bytes 0 and 2.
__device__ __forceinline__ uint32_t fp4_pair_lo13(uint32_t w) {
  return ((w << 1) & 0x0e000e00u) | ((w << 4) & 0x80008000u);
}
__device__ __forceinline__ uint32_t fp4_pair_hi13(uint32_t w) {
  return ((w >> 3) & 0x0e000e00u) | (w & 0x80008000u);
}

// Byte c of x0..x3 -> y[c] = {x0.c, x2.c, x1.c, x3.c} (a 4 x 4 byte transpose, 8 prmt).
__device__ __forceinline__ void byte_transpose4(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3,
                                                uint32_t (&y)[4]) {
  const uint32_t a01 = __byte_perm(x0, x2, 0x5140), a23 = __byte_perm(x0, x2, 0x7362);
  const uint32_t b01 = __byte_perm(x1, x3, 0x5140), b23 = __byte_perm(x1, x3, 0x7362);
  y[0] = __byte_perm(a01, b01, 0x5410);
  y[1] = __byte_perm(a01, b01, 0x7632);
  y[2] = __byte_perm(a23, b23, 0x5410);
  y[3] = __byte_perm(a23, b23, 0x7632);
}

// fp32 S^T fragment (lane (g, t): x = key g / g+8 of block `r`, vectors 2t, 2t+1) -> B layout
// (keys 2t, 2t+1 of the block, vector g): both 16-bit halves through movmatrix, exactly.
__device__ __forceinline__ void transpose8x8_f32(float x, float y, float& u, float& v) {
  const uint32_t xb = __float_as_uint(x), yb = __float_as_uint(y);
  const uint32_t lo = transpose8x8(__byte_perm(xb, yb, 0x5410)), hi = transpose8x8(__byte_perm(xb, yb, 0x7632));
  u = __uint_as_float(__byte_perm(lo, hi, 0x5410));
  v = __uint_as_float(__byte_perm(lo, hi, 0x7632));
}

// L2 prefetch of item u (< Layout::PF) of cache row `row`: a 128-byte line of its K or V values,
// or the line holding its K or V scales. Fire and forget: no register waits on it.
template <DType KV, int D>
__device__ __forceinline__ void prefetch_item(const DecodeParams& p, int64_t row, int u) {
  using L = Layout<KV, D>;
  if (L::RS == 0 || u < 2 * L::NL) {
    const bool is_v = u >= L::NL;
    prefetch_l2(static_cast<const uint8_t*>(is_v ? p.kv.v : p.kv.k) + row * L::RB + 128 * (is_v ? u - L::NL : u));
  } else {
    prefetch_l2((u == 2 * L::NL ? p.kv.k_scale : p.kv.v_scale) + row * L::RS);
  }
}

}  // namespace tc
}  // namespace
}  // namespace attn
}  // namespace cuda
}  // namespace pe
