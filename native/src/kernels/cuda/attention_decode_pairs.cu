// Decode attention on the tensor cores (F16, FP8, I8, NVFP4 caches) for splits of at most two
// warp steps (the pairs kernel: variant 3 of attention_decode_set_variant, cuda_ops.h, and the
// default for such splits). At 1K context and batch 1 the split is 32 keys: the other kernels
// (attention_decode_mma.cu) give each of the two steps to one warp and leave two of the four
// idle, so a whole step runs on one warp's critical path (NVFP4's is ~800 instructions longer
// than F16's: the per-group K scales on the partial scores, P scaled and split per m-tile by the
// V group scales). Here warp (st, h) = (warp & 1, warp >> 1) takes step st's k-steps and m-tiles
// of half h: the two halves' partial scores meet in shared memory (a 64-thread named barrier per
// pair), both warps run the same softmax, each then does half the P V m-tiles. Nothing is
// computed twice but the softmax (duplicating the scores and the staging instead is slower).
// Measured against the other kernels: tools/gpu/KERNELS.md, "Decode attention".
//
// Every load of the step goes to registers straight from global memory, before pdl_wait where the
// step's keys are all older than the new ones (DecodeParams::early, as the other kernels), and
// such a step is decoded to fp16 there too. The step holding new keys resolves its cache rows and
// prefetches its lines into L2 before pdl_wait and loads after it: otherwise its block finishes
// last, its loads after the wait a page-table load and then an HBM round trip. The Q half of a
// warp gets its own power-of-two scale (q_pow2), taken off its partial scores before the halves
// are added. The operands, their decode and the merge layout are the other kernels' (Layout); the
// scores are summed in two halves, so the result matches the other variants within float
// rounding, not bit for bit.
#include "kernels/cuda/attention_decode_mma.cuh"

namespace pe {
namespace cuda {
namespace attn {

namespace {
namespace tc {

// N consecutive fp32 scales (16-byte or 8-byte aligned) into registers.
template <int N>
__device__ __forceinline__ void load_scales(const float* src, float (&dst)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(src) + i);
      dst[4 * i] = a.x; dst[4 * i + 1] = a.y; dst[4 * i + 2] = a.z; dst[4 * i + 3] = a.w;
    }
  } else {
    static_assert(N == 2, "2, 4, 8 scales");
    const float2 a = __ldg(reinterpret_cast<const float2*>(src));
    dst[0] = a.x; dst[1] = a.y;
  }
}

__device__ __forceinline__ void pair_barrier(int id) { asm volatile("bar.sync %0, 64;" ::"r"(id) : "memory"); }

// The lane's words w0 .. w0 + N - 1 of a row (bytes p), word w at 16 (c0 + S (w / 4)) + 4 (w % 4):
// the 16-byte chunks c0, c0 + S, ... of the row; N = 1, 2 or a multiple of 4 (whole chunks).
template <int N, int S>
__device__ __forceinline__ void load_words(const uint8_t* p, int c0, int w0, uint32_t (&w)[N]) {
  const uint8_t* src = p + 16 * (c0 + S * (w0 / 4)) + 4 * (w0 % 4);
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(p + 16 * (c0 + S * (w0 / 4 + i))));
      w[4 * i] = x.x; w[4 * i + 1] = x.y; w[4 * i + 2] = x.z; w[4 * i + 3] = x.w;
    }
  } else if constexpr (N == 2) {
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(src));
    w[0] = x.x; w[1] = x.y;
  } else {
    static_assert(N == 1, "1, 2 or whole chunks");
    w[0] = __ldg(reinterpret_cast<const uint32_t*>(src));
  }
}

template <DType KV, int D>
__global__ void __launch_bounds__(kThreads, 2) attention_decode_pairs_kernel(DecodeParams p) {
  using L = Layout<KV, D>;
  constexpr bool kFp4 = L::kFp4, kF16 = L::kF16, kI8 = KV == DType::I8, kCvt = L::kPairedBytes;
  constexpr int KS = L::KS, KH = KS / 2, MH = L::MT / 2;
  // Words of a key row this lane holds for one half: K (NVFP4: 8 bytes a group, all of the half's
  // groups, 16-byte loads; else half the lane's quarter-row words) and V (half the lane's words).
  constexpr int KWH = kFp4 ? 2 * KH : L::KW / 2, VWH = kFp4 ? MH : L::VW / 2;
  constexpr int NSC = kFp4 ? KH : 1;  // scales per key row and half (NVFP4 groups, I8 the row's)
  static_assert(KS % 4 == 0 && kWarps == 4, "two steps x two halves");
  __shared__ float4 xs[kWarps][32];  // partial scores of each warp, read by its pair
  __shared__ __align__(16) float red_acc[kVecs * L::kPitch];
  __shared__ float red_m[2][kVecs], red_l[2][kVecs];
  __shared__ float fin_l[kVecs], fin_m[kVecs];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int st = warp & 1, h = warp >> 1;
  const DecodeBlock blk = decode_block(p);
  const int64_t kb = static_cast<int64_t>(blk.split) * p.split_len;
  const int64_t ke = min(kb + p.split_len, p.q_start_pos + blk.i0 + blk.nqi);
  const int n = static_cast<int>(max(static_cast<int64_t>(0), ke - kb));  // keys of the split (<= 2 steps)
  const int j0 = st * kStep;
  const bool has = j0 < n;  // the same for both warps of a pair
  // Cache row of split key j; keys past the split read its last.
  const auto row_of = [&](int j) { return cache_row(p, kb + min(j, n - 1), blk.kvh); };

  // This warp's operands. K: rows j0 + g, + 8, the half's k-steps (NVFP4: groups h KH .., bytes
  // 2t, 2t+1 used; else the words of Layout::load_k). V: NVFP4 keys j0 + 2t, 2t+1, 2t+8, 2t+9 (the
  // B layout's), words of m-tiles h MH .. (byte g & 3 used); else the same keys, Layout::load_v's
  // words of the half's m-tiles. Scales: NVFP4 groups of those rows, I8 the K and V row scales of
  // keys g, g+8 (P is scaled before its transpose).
  uint32_t kw[2][KWH], vw[4][VWH];
  float ksc[2][NSC], vsc[kFp4 ? 4 : 2][NSC];
  // The cache rows come from the page table, which is ready before pdl_wait (the host copies it
  // before the step; attention_decode_mma.cu): resolved there for every step, the new keys' too,
  // so that a step loaded after the wait waits for its values only, not for a table load first.
  int64_t krow[2], vrow[4];
#pragma unroll
  for (int r = 0; r < 2; ++r) krow[r] = has ? row_of(j0 + g + 8 * r) : 0;
#pragma unroll
  for (int r = 0; r < 4; ++r) vrow[r] = has ? row_of(j0 + 2 * t + (r & 1) + 8 * (r >> 1)) : 0;
  const auto load = [&] {
    const uint8_t* kbase = static_cast<const uint8_t*>(p.kv.k);
    const uint8_t* vbase = static_cast<const uint8_t*>(p.kv.v);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = krow[r];
      if constexpr (kFp4) {
        load_words<KWH, 1>(kbase + row * L::RB, 0, KWH * h, kw[r]);
        load_scales(p.kv.k_scale + row * KS + KH * h, ksc[r]);
      } else {
        load_words<KWH, 4>(kbase + row * L::RB, t, KWH * h, kw[r]);
        if constexpr (kI8) {
          ksc[r][0] = __ldg(p.kv.k_scale + row);
          vsc[r][0] = __ldg(p.kv.v_scale + row) * L::kVMul;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t row = vrow[r];
      const uint8_t* src = vbase + row * L::RB;
      if constexpr (kFp4) {
#pragma unroll
        for (int jj = 0; jj < MH; ++jj) vw[r][jj] = __ldg(reinterpret_cast<const uint32_t*>(src) + 2 * (MH * h + jj) + (g >> 2));
        load_scales(p.kv.v_scale + row * KS + MH * h, vsc[r]);
      } else if constexpr (L::PW == 4) {
        load_words<VWH, 8>(src, g, VWH * h, vw[r]);
      } else {  // 8-byte pieces (8-bit caches at head_dim 64): word w at 8 g + 4 w
        static_assert(VWH == 1, "one word a half");
        vw[r][0] = __ldg(reinterpret_cast<const uint32_t*>(src + 8 * g) + h);
      }
    }
  };
  // The K and V operands decoded to fp16 (A fragments): no Q in it (the scales act on the scores
  // and on P), so a preloaded step decodes before pdl_wait, off the path from Q to the result
  // (ptxas placed the decode after the Q maxima otherwise); a step loaded after pdl_wait decodes
  // while its Q loads are in flight.
  const uint32_t ksel = (2 * t) | ((2 * t + 1) << 8);       // NVFP4: bytes 2t, 2t+1 of a group -> bytes 0, 2
  const uint32_t vsel = (g & 3) | ((4u + (g & 3)) << 8);  // NVFP4: byte g & 3 of two keys -> bytes 0, 2
  uint32_t ka[KH][2][2], va[MH][4];  // K: [k-step][key row][k half]; V: rows g / g+8 x keys (2t, 2t+1) / (2t+8, 2t+9)
  const auto decode = [&] {
#pragma unroll
    for (int k = 0; k < KH; ++k)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if constexpr (kFp4) {
          const uint32_t z = __byte_perm(kw[r][2 * k], kw[r][2 * k + 1], ksel);
          ka[k][r][0] = kv_fp4_pair_lo(z);
          ka[k][r][1] = kv_fp4_pair_hi(z);
        } else if constexpr (kF16) {
          ka[k][r][0] = kw[r][2 * k];
          ka[k][r][1] = kw[r][2 * k + 1];
        } else {
          L::decode_k(kw[r][k], ka[k][r][0], ka[k][r][1]);
        }
      }
#pragma unroll
    for (int jj = 0; jj < MH; ++jj)  // (the half's m-tile parity is jj's: MH is even)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        L::decode_v(vw[2 * r][L::v_word(jj)], vw[2 * r + 1][L::v_word(jj)], jj, vsel, va[jj][2 * r], va[jj][2 * r + 1]);
  };
  const bool pre = has && p.early && kb + min(j0 + kStep, n) - 1 < p.q_start_pos;
  if (pre) {
    load();
    decode();
  } else if (has && p.early) {
    // The step holding new keys: its rows' lines (values, scales) into L2 while the previous
    // kernel runs, so that its loads after pdl_wait hit L2 (the older rows would come from HBM;
    // the previous kernel writes the new ones, in L2). Safe as the loads of p.early: L2 is where
    // that kernel's writes land, and no L1 line is filled here.
    const int keys = min(kStep, n - j0);
    for (int u = lane + 32 * h; u < keys * L::PF; u += 64) prefetch_item<KV, D>(p, row_of(j0 + u / L::PF), u % L::PF);
  }
  pdl_wait();
  pdl_trigger();
  if (has && !pre) load();

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[MH][4] = {};
  if (has) {
    // Q of vector g, this half's k-steps: scaled by its own power of two, split into fp16 high +
    // low as q_fragments does (component q_sub(i & 1, i >> 1) of a k-step's float4 is value i).
    const float* qrow = g < blk.nv ? p.q + ((blk.i0 + g / blk.nh) * p.n_heads + blk.h0 + g % blk.nh) * D : nullptr;
    float4 qv[KH];
#pragma unroll
    for (int k = 0; k < KH; ++k)
      qv[k] = qrow ? *reinterpret_cast<const float4*>(qrow + L::q_dim(KH * h + k, 0, 0, t))
                   : make_float4(0.f, 0.f, 0.f, 0.f);
    if (!pre) decode();
    float qmax = 0.0f;
#pragma unroll
    for (int k = 0; k < KH; ++k)
      qmax = fmaxf(fmaxf(qmax, fmaxf(fabsf(qv[k].x), fabsf(qv[k].y))), fmaxf(fabsf(qv[k].z), fabsf(qv[k].w)));
    qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 1));
    qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 2));
    const int k2 = q_pow2(qmax * fabsf(p.q_mul));
    const float qm = p.q_mul * __uint_as_float(static_cast<uint32_t>(127 + k2) << 23);
    // The power taken back (FP8 by cvt: the K values' 256 too), for vector g.
    const float qback = __uint_as_float(static_cast<uint32_t>(127 - k2 - (kCvt ? 8 : 0)) << 23);
    const float qsc[2] = {__shfl_sync(0xffffffffu, qback, 8 * t), __shfl_sync(0xffffffffu, qback, 8 * t + 4)};

    // This half's partial S^T = K Q^T: s[0], s[1] = key g, vectors 2t, 2t+1; s[2], s[3] = key g + 8.
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float sp[4][4] = {};  // 4 independent mma chains (k-step parity x q part), summed below
#pragma unroll
    for (int k = 0; k < KH; ++k) {
      const uint32_t (&a)[2][2] = ka[k];  // [key row][k half]
      float x[4];
      const float xv[4] = {qv[k].x, qv[k].y, qv[k].z, qv[k].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = xv[L::q_sub(i & 1, i >> 1)] * qm;
      uint32_t qh[2], ql[2];  // {high k-half 0, high k-half 1}, {low ..}: q_fragments' order
      split_f16(x[0], x[2], qh[0], ql[0]);
      split_f16(x[1], x[3], qh[1], ql[1]);
      if constexpr (kFp4) {  // one group per k-step: its scale per key
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_k16(c, a[0][0], a[1][0], a[0][1], a[1][1], qh[0], qh[1]);
        mma_k16(c, a[0][0], a[1][0], a[0][1], a[1][1], ql[0], ql[1]);
        s[0] = fmaf(c[0], ksc[0][k], s[0]);
        s[1] = fmaf(c[1], ksc[0][k], s[1]);
        s[2] = fmaf(c[2], ksc[1][k], s[2]);
        s[3] = fmaf(c[3], ksc[1][k], s[3]);
      } else {
        mma_k16(sp[k & 1], a[0][0], a[1][0], a[0][1], a[1][1], qh[0], qh[1]);
        mma_k16(sp[2 + (k & 1)], a[0][0], a[1][0], a[0][1], a[1][1], ql[0], ql[1]);
      }
    }
    if constexpr (!kFp4)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i] = (sp[0][i] + sp[1][i]) + (sp[2][i] + sp[3][i]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[i] *= qsc[i & 1];
      if constexpr (kI8) s[i] *= ksc[i >> 1][0];
    }
    // The halves added (in the same order in both warps: the same bits), then masked.
    xs[warp][lane] = make_float4(s[0], s[1], s[2], s[3]);
    pair_barrier(1 + st);
    const float4 lo = xs[st][lane], hi = xs[st + 2][lane];
    s[0] = lo.x + hi.x;
    s[1] = lo.y + hi.y;
    s[2] = lo.z + hi.z;
    s[3] = lo.w + hi.w;
    const int64_t qpos0 = p.q_start_pos + blk.i0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int v = 2 * t + (i & 1), kj = j0 + g + 8 * (i >> 1);
      const int qoff = v < blk.nv ? v / blk.nh : 0x7fffffff;  // vector v sees keys up to qpos0 + qoff
      if (kj >= n || kb + kj - qpos0 > qoff) s[i] = -INFINITY;
    }
    // Softmax of the one step per vector (columns): maxima over the 8 groups.
    float base[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float mx = fmaxf(s[e], s[2 + e]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      m[e] = mx;
      base[e] = mx == -INFINITY ? 0.0f : mx;
    }
    float pr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) pr[i] = exp2f(s[i] - base[i & 1]);
#pragma unroll
    for (int e = 0; e < 2; ++e) l[e] = pr[e] + pr[2 + e];
    // O^T += V^T P^T for this half's m-tiles. NVFP4: P^T in B layout (keys 2t, 2t+1, 2t+8, 2t+9;
    // vector g), scaled per m-tile (= group) by those keys' V scales, split into fp16 high + low;
    // else P (I8: times the V row scale) split once and moved to the B layout by movmatrix.
    uint32_t bh[2], bl[2];
    float pb[4];
    if constexpr (kFp4) {
      transpose8x8_f32(pr[0], pr[1], pb[0], pb[1]);
      transpose8x8_f32(pr[2], pr[3], pb[2], pb[3]);
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float pv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) pv[e] = kI8 ? pr[2 * r + e] * vsc[r][0] : pr[2 * r + e];
        split_f16(pv[0], pv[1], bh[r], bl[r]);
        bh[r] = transpose8x8(bh[r]);
        bl[r] = transpose8x8(bl[r]);
      }
    }
#pragma unroll
    for (int jj = 0; jj < MH; ++jj) {
      if constexpr (kFp4)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          split_f16(pb[2 * r] * (vsc[2 * r][jj] * L::kVMul), pb[2 * r + 1] * (vsc[2 * r + 1][jj] * L::kVMul),
                    bh[r], bl[r]);
      mma_k16(acc[jj], va[jj][0], va[jj][1], va[jj][2], va[jj][3], bh[0], bh[1]);
      mma_k16(acc[jj], va[jj][0], va[jj][1], va[jj][2], va[jj][3], bl[0], bl[1]);
    }
  }

  // Merge: l over the 8 groups; the two steps through shared memory (step 0, then step 1 added).
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) l[e] += __shfl_xor_sync(0xffffffffu, l[e], off);
  if (h == 0 && g == 0)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      red_m[st][2 * t + e] = m[e];
      red_l[st][2 * t + e] = l[e];
    }
  __syncthreads();
  float fac[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float mx = fmaxf(red_m[0][2 * t + e], red_m[1][2 * t + e]);
    fac[e] = exp2f(m[e] - (mx == -INFINITY ? 0.0f : mx));
  }
  if (tid < kVecs) {
    const float mx = fmaxf(red_m[0][tid], red_m[1][tid]);
    const float b = mx == -INFINITY ? 0.0f : mx;
    fin_m[tid] = mx;
    fin_l[tid] = red_l[0][tid] * exp2f(red_m[0][tid] - b) + red_l[1][tid] * exp2f(red_m[1][tid] - b);
  }
  float* const lane_acc = red_acc + L::merge_lane(g, t);
  const int steps = n > kStep ? 2 : 1;
  for (int w = 0; w < steps; ++w) {
#pragma unroll
    for (int hc = 0; hc < 2; ++hc)  // the half as a constant: merge_const folds into the addresses
      if (st == w && h == hc)
#pragma unroll
        for (int jj = 0; jj < MH; ++jj)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float& dst = lane_acc[L::merge_const(MH * hc + jj, i)];
            const float x = acc[jj][i] * fac[i & 1];
            dst = w == 0 ? x : dst + x;
          }
    __syncthreads();
  }
  store_decode_result(p, [&](int v, int d) -> float& { return red_acc[L::merge_index(v, d)]; }, fin_m, fin_l,
                      blk.nv, blk.nh, blk.i0, blk.h0, blk.split, D, tid, kCvt ? 1.0f / 256.0f : 1.0f);
}

}  // namespace tc
}  // namespace

template <DType KV, int D>
void (*pairs_kernel())(DecodeParams) {
  return tc::attention_decode_pairs_kernel<KV, D>;
}

#define PE_PAIRS(KV)                                           \
  template void (*pairs_kernel<KV, 64>())(DecodeParams);  \
  template void (*pairs_kernel<KV, 128>())(DecodeParams); \
  template void (*pairs_kernel<KV, 256>())(DecodeParams);
PE_PAIRS(DType::F16)
PE_PAIRS(DType::FP8_E4M3)
PE_PAIRS(DType::I8)
PE_PAIRS(DType::NVFP4)
#undef PE_PAIRS

}  // namespace attn
}  // namespace cuda
}  // namespace pe
