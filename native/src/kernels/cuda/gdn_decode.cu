// GDN decode step batched over sequences in different state slots: the whole GDN core of a
// decode step for every running sequence, conv state update included, in one launch (math:
// kernels/cpu/gdn_decode.cpp).
//
// Block (128 state columns, value head h, sequence), W warps: lane l holds columns
// 4l .. 4l+3 (one float4), warp w rows w, w + W, ... of the head's state [dk, dv] in registers.
// A warp's load is one contiguous 512-byte row, a block's the head's whole state (64 KiB at
// dk = dv = 128): contiguous, so DRAM pages are opened once (blocks of 32 columns, each touching
// 128 bytes of every row, ran at ~35 % of the copy bandwidth). The block
//   1. issues its state loads first (they fly while the rest is computed), the fused norm's
//      weights and its first conv item's older taps, then (after pdl_wait) the gate inputs and z,
//   2. computes the conv + SiLU of the q and k channels of its key head (the r = Hv/Hk value
//      heads of a key head repeat this small work from L2 instead of exchanging it) and of its
//      v channels, the sums of squares of q and k, and the gates. The conv state is a ring
//      (ops.h conv1d_causal): the token at position p reads the rows of positions p-K+1 .. p-1
//      and its raw row goes to row p % K, which no block of this step reads, so each channel's
//      row is written by one block with no ordering: v channels by their own block, a key
//      head's q/k channels by its first value head's block of column range 0,
//   3. runs the delta rule step with the raw q, k and the l2 factors applied to the column sums
//      (S^T k_raw * fk = S^T k; the update uses k_raw * (fk delta)); the column sums cross the
//      warps through shared memory; the state is written back once.
// With norm_w set, warp 0 finishes step 3 with the gated RMSNorm of its head's row (dv <= 128:
// one block holds the row), instead of a separate rms_norm_gated launch.
// HBM traffic is the state, read and written once: 2 * 4 * Hv * dk * dv bytes per sequence. Small
// batches are bound by the latency of one block per head; the measured times per layer are in
// tools/gpu/KERNELS.md ("GDN decode").
// dv % 4 != 0 takes a scalar path (spills a little; unused by Qwen3.5).
// Chained items (ops.h rows / out_slots, a verify chunk's tokens one call each) read their token's
// rows and store the state, and the conv ring's old taps with the new row, to the out slot.
// gdn_chain (a verify step's tokens in two launches, cuda_ops.h) shares the block's steps 2 and 3:
// its conv runs first in a kernel of its own (a block of another value head of the same key head
// would otherwise read the live ring's q / k taps that a sequence's last token overwrites).
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kBlockCols = 128;  // 32 lanes x 4 columns
static_assert(kBlockCols == kGdnDecodeFusedNormMaxDv, "a head's row in one block for the fused norm");
constexpr int kMaxK = 16;
constexpr int kConvTaps = 4;  // conv_taps loads this many taps at once (K above: a loop)

// kW: warps per block (0: 8 up to dk 128, else 16; launch picks 16 at dk 128 for small batches).
template <int DK, int kW = 0>
struct Tile {
  static constexpr int kWarps = kW > 0 ? kW : DK <= 128 ? 8 : 16;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = DK / kWarps;  // float4 registers of state per thread
};

// Ring row of tap j (position p - K + 1 + j; j = K - 1: p % K, the row the new input takes) given
// r_old, the row of tap 0 ((p + 1) % K).
__device__ __forceinline__ int ring_row(int r_old, int j, int K) {
  const int r = r_old + j;
  return r >= K ? r - K : r;
}

// silu(sum_j w[c, j] x_j[c]) over the taps j = 0 .. K-1 in order: the ring rows of the K-1 older
// positions, then the new raw row u, which takes row p % K (position p - K) when `store`.
// conv_taps loads the weights and the first kConvTaps - 1 old rows' taps (the kernel does so before
// pdl_wait: no kernel of the step writes them), conv_apply the new row's tap, the rest, the sum:
// one memory round trip for K <= kConvTaps (Qwen3.5: K = 4; a runtime-K loop waited one per tap).
// Wider kernels continue over their further rows in a loop. The store comes after every load.
struct ConvTaps {
  float wl, wj[kConvTaps - 1], xj[kConvTaps - 1];
};
__device__ __forceinline__ ConvTaps conv_taps(const float* cs, const float* w, int C, int K, int r_old, int c) {
  ConvTaps tp;
  tp.wl = w[c * K + K - 1];
#pragma unroll
  for (int j = 0; j < kConvTaps - 1; ++j)
    if (j < K - 1) {
      tp.wj[j] = w[c * K + j];
      tp.xj[j] = cs[ring_row(r_old, j, K) * C + c];
    }
  return tp;
}
// cso: the ring the store goes to; another ring than cs (an out slot) receives the old taps too.
__device__ __forceinline__ float conv_apply(const ConvTaps& tp, const float* cs, float* cso, const float* u,
                                            const float* w, int C, int K, int r_old, bool store, int c) {
  const float ul = u[c];
  const bool copy = store && cso != cs;
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kConvTaps - 1; ++j)
    if (j < K - 1) {
      acc = fmaf(tp.wj[j], tp.xj[j], acc);
      if (copy) cso[ring_row(r_old, j, K) * C + c] = tp.xj[j];
    }
#pragma unroll 1
  for (int j = kConvTaps - 1; j < K - 1; ++j) {
    const float x = cs[ring_row(r_old, j, K) * C + c];
    acc = fmaf(w[c * K + j], x, acc);
    if (copy) cso[ring_row(r_old, j, K) * C + c] = x;
  }
  if (store) cso[ring_row(r_old, K - 1, K) * C + c] = ul;
  return silu_f(fmaf(tp.wl, ul, acc));
}

// 4 consecutive floats of which the first n are in range (VEC: 16-byte aligned, n >= 4 or <= 0).
template <bool VEC>
__device__ __forceinline__ float4 load4(const float* p, int n) {
  if (VEC) return n > 0 ? *reinterpret_cast<const float4*>(p) : make_float4(0.f, 0.f, 0.f, 0.f);
  return make_float4(n > 0 ? p[0] : 0.f, n > 1 ? p[1] : 0.f, n > 2 ? p[2] : 0.f, n > 3 ? p[3] : 0.f);
}

template <bool VEC>
__device__ __forceinline__ void store4(float* p, int n, float4 v) {
  if (VEC) {
    if (n > 0) *reinterpret_cast<float4*>(p) = v;
    return;
  }
  if (n > 0) p[0] = v.x;
  if (n > 1) p[1] = v.y;
  if (n > 2) p[2] = v.z;
  if (n > 3) p[3] = v.w;
}

__device__ __forceinline__ void fma4(float a, float4 b, float4& acc) {
  acc.x = fmaf(a, b.x, acc.x);
  acc.y = fmaf(a, b.y, acc.y);
  acc.z = fmaf(a, b.z, acc.z);
  acc.w = fmaf(a, b.w, acc.w);
}

__device__ __forceinline__ void add4(float4 b, float4& acc) {
  acc.x += b.x;
  acc.y += b.y;
  acc.z += b.z;
  acc.w += b.w;
}

// Step 2's items of a block (header): q, k of key head kh (DK each), then the v columns col0 ..
// col0 + 127 of value head h; their conv channel and whether it is in range.
struct Item {
  bool is_v, is_k, valid;
  int i, ch;  // index in q / k / the block's v columns; the conv channel
};
template <int DK>
__device__ __forceinline__ Item qkv_item(int t, int h, int kh, int col0, int Hk, int dk, int dv) {
  Item it;
  it.is_v = t >= 2 * DK;
  it.is_k = !it.is_v && t >= DK;
  it.i = it.is_v ? t - 2 * DK : it.is_k ? t - DK : t;
  it.ch = it.is_v ? 2 * Hk * dk + h * dv + col0 + it.i : (it.is_k ? Hk * dk : 0) + kh * dk + it.i;
  it.valid = it.is_v ? col0 + it.i < dv : it.i < dk;
  return it;
}

// Step 2's item value y into the block's q / k / v and this thread's sums of squares of q and k.
__device__ __forceinline__ void put_item(const Item& it, float y, float* qs, float* ks, float* vsf, float& ssq_q,
                                         float& ssq_k) {
  if (it.is_v) {
    vsf[it.i] = y;
  } else if (it.is_k) {
    ks[it.i] = y;
    ssq_k = fmaf(y, y, ssq_k);
  } else {
    qs[it.i] = y;
    ssq_q = fmaf(y, y, ssq_q);
  }
}

// The block's sums of squares of q and k, per warp, to red_qk (read after the next barrier).
template <int W>
__device__ __forceinline__ void warp_sums_qk(float ssq_q, float ssq_k, float (*red_qk)[W], int lane, int w) {
  ssq_q = warp_sum(ssq_q);
  ssq_k = warp_sum(ssq_k);
  if (lane == 0) {
    red_qk[0][w] = ssq_q;
    red_qk[1][w] = ssq_k;
  }
}

// Step 3 (header), after step 2's barrier: S = e^g S; kv = S^T k; delta = beta (v - kv);
// S += k delta^T, stored to So; o = S^T q. red_qk: the warps' sums of squares of q and k (the l2
// factors). Returns o scaled by its factor in warp 0 (the other warps' value is unused).
template <bool VEC, int W, int NR>
__device__ __forceinline__ float4 delta_rule_step(float4 (&s)[NR], const float* qs, const float* ks, const float4* vs,
                                                  float4 (*red_kv)[32], float4 (*red_o)[32], const float (*red_qk)[W],
                                                  float decay, float beta, float* So, int dk, int dv, int c, int n_cols,
                                                  int lane, int w) {
  float ssq_q = 0.0f, ssq_k = 0.0f;
#pragma unroll
  for (int v = 0; v < W; ++v) {
    ssq_q += red_qk[0][v];
    ssq_k += red_qk[1][v];
  }
  const float fq = rsqrtf(static_cast<float>(dk)) / sqrtf(ssq_q + 1e-6f);
  const float fk = 1.0f / sqrtf(ssq_k + 1e-6f);
  float4 kv = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int m = 0; m < NR; ++m) {
    s[m].x *= decay;
    s[m].y *= decay;
    s[m].z *= decay;
    s[m].w *= decay;
    fma4(ks[w + W * m], s[m], kv);
  }
  red_kv[w][lane] = kv;
  __syncthreads();
  kv = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int v = 0; v < W; ++v) add4(red_kv[v][lane], kv);
  const float4 vj = vs[lane];
  // delta * fk: the update adds k_raw[i] * fk * delta = k[i] * delta.
  const float bk = beta * fk;
  const float4 dl = make_float4(bk * (vj.x - fk * kv.x), bk * (vj.y - fk * kv.y),
                                bk * (vj.z - fk * kv.z), bk * (vj.w - fk * kv.w));
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int m = 0; m < NR; ++m) {
    const int i = w + W * m;
    fma4(ks[i], dl, s[m]);
    fma4(qs[i], s[m], o);
    store4<VEC>(So + static_cast<int64_t>(i) * dv + c, i < dk ? n_cols : 0, s[m]);
  }
  red_o[w][lane] = o;
  __syncthreads();
  o = make_float4(0.f, 0.f, 0.f, 0.f);
  if (w == 0) {
#pragma unroll
    for (int v = 0; v < W; ++v) add4(red_o[v][lane], o);
    o.x *= fq;
    o.y *= fq;
    o.z *= fq;
    o.w *= fq;
  }
  return o;
}

// The gates of value head h from its raw a, b inputs: decay e^g and beta.
__device__ __forceinline__ void gates(float a_in, float b_in, float dt_b, float a_log, float& decay, float& beta) {
  const float ab = a_in + dt_b;
  const float softplus = ab > 20.0f ? ab : log1pf(expf(ab));
  decay = expf(-expf(a_log) * softplus);
  beta = 1.0f / (1.0f + expf(-b_in));
}

template <int DK, bool VEC, int kW = 0>
__global__ void __launch_bounds__(Tile<DK, kW>::kThreads, Tile<DK, kW>::kWarps <= 8 ? 2 : 1)
    gdn_decode_kernel(GdnDecodeArgs a) {
  pdl_trigger();  // the out_proj GEMV may start prefetching its weights
  constexpr int W = Tile<DK, kW>::kWarps, T = Tile<DK, kW>::kThreads, NR = Tile<DK, kW>::kRows;
  __shared__ float qs[DK], ks[DK];
  __shared__ float4 vs[32];
  __shared__ float4 red_kv[W][32], red_o[W][32];
  __shared__ float red_qk[2][W];
  const int seq = blockIdx.z, h = blockIdx.y;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv), K = static_cast<int>(a.K);
  const int kh = h / static_cast<int>(a.Hv / a.Hk);
  const int64_t C = 2 * a.Hk * a.dk + a.Hv * a.dv;
  const int col0 = blockIdx.x * kBlockCols;
  const int c = col0 + 4 * lane;  // this lane's first column
  const int n_cols = dv - c;      // of its 4 columns, those < dv
  const int64_t slot = a.slots[seq];
  // A chained item (ops.h): its token row and the slot its states go to.
  const int64_t row = a.rows ? a.rows[seq] : seq;
  const int64_t out_slot = a.out_slots ? a.out_slots[seq] : slot;
  // Ring row of the oldest tap (position pos - K + 1). The position is read before pdl_wait, as
  // the slot (both host-written), so the conv's loads need no extra round trip after the wait;
  // and ptxas spills less (none at sm_90, dk 128, scalar path, 16 warps).
  const int r_old = (a.pos[seq] + 1) % K;
  const float* S = a.rec_state + slot * a.rec_slot_stride + static_cast<int64_t>(h) * dk * dv;
  float* So = a.rec_state + out_slot * a.rec_slot_stride + static_cast<int64_t>(h) * dk * dv;

  // 1. State loads, before pdl_wait (launched as a programmatic dependent, launch_pdl), so their
  // DRAM round trip overlaps the tail of the in-projection GEMV before it: the state, the slots,
  // the positions and the constants are not written by the kernels just before (cuda_ops.h
  // gdn_decode).
  float4 s[NR];
#pragma unroll
  for (int m = 0; m < NR; ++m) {
    const int i = w + W * m;
    s[m] = load4<VEC>(S + static_cast<int64_t>(i) * dv + c, i < dk ? n_cols : 0);
  }
  const float dt_b = a.dt_bias[h], a_log = a.A_log[h];
  float zv[4] = {0.f, 0.f, 0.f, 0.f}, nwv[4] = {0.f, 0.f, 0.f, 0.f};
  if (w == 0 && a.norm_w) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (e < n_cols) nwv[e] = a.norm_w[c + e];
  }
  // The conv's channel for item t of step 2 (q, k of key head kh, then v columns col0..), whether
  // it is in range, and the thread's first item's older taps and weights (before the wait, as the
  // state).
  const float* cs = a.conv_state + slot * a.conv_slot_stride;
  float* cso = a.conv_state + out_slot * a.conv_slot_stride;
  const int Ci = static_cast<int>(C), Hk = static_cast<int>(a.Hk);
  const auto item = [&](int t) { return qkv_item<DK>(t, h, kh, col0, Hk, dk, dv); };
  ConvTaps taps0{};
  if (threadIdx.x < 2 * DK + kBlockCols) {
    const Item it0 = item(threadIdx.x);
    if (it0.valid) taps0 = conv_taps(cs, a.conv_w, Ci, K, r_old, it0.ch);
  }
  pdl_wait();

  // The gate inputs and (warp 0, fused norm) the z row go out with the conv's loads: their round
  // trips overlap instead of following the delta rule step. (The conv loop below is not unrolled
  // to issue its two rounds' loads together: that spills at dk = 128 on sm_75.)
  const int64_t ab_row = row * (a.ab_stride ? a.ab_stride : a.Hv);
  const float a_in = a.a[ab_row + h];
  const float b_in = a.b[ab_row + h];
  if (w == 0 && a.norm_w) {
    const float* zr = a.z + row * a.z_stride + static_cast<int64_t>(h) * dv + c;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (e < n_cols) zv[e] = zr[e];
  }

  // 2. Conv + SiLU of q | k (key head kh) | v (columns col0.. of head h); sums of squares; gates.
  // The new raw row goes into the ring: q/k by one block of the key head, v by every block.
  const bool qk_store = h == kh * static_cast<int>(a.Hv / a.Hk) && blockIdx.x == 0;
  const float* u = a.qkv + row * (a.qkv_stride ? a.qkv_stride : C);
  float* vsf = reinterpret_cast<float*>(vs);
  // 32-bit conv indices (C * K < 2^31, checked): with the taps loaded at once, the 64-bit index
  // math hoisted out of this loop spilled the state at dk = 128.
  float ssq_q = 0.0f, ssq_k = 0.0f;
  for (int t = threadIdx.x; t < 2 * DK + kBlockCols; t += T) {
    // One conv_apply call site for q, k and v: with two inlined copies (one for q/k, one for v)
    // the ring indexing spilled the state at dk 128 (sm_90, 8 warps, float4: 104 bytes).
    const Item it = item(t);
    float y = 0.0f;
    if (it.valid) {
      const ConvTaps tp = t == threadIdx.x ? taps0 : conv_taps(cs, a.conv_w, Ci, K, r_old, it.ch);
      y = conv_apply(tp, cs, cso, u, a.conv_w, Ci, K, r_old, it.is_v || qk_store, it.ch);
    }
    put_item(it, y, qs, ks, vsf, ssq_q, ssq_k);
  }
  warp_sums_qk<W>(ssq_q, ssq_k, red_qk, lane, w);
  float decay, beta;
  gates(a_in, b_in, dt_b, a_log, decay, beta);
  __syncthreads();

  // 3. The delta rule step; o in warp 0.
  float4 o = delta_rule_step<VEC, W, NR>(s, qs, ks, vs, red_kv, red_o, red_qk, decay, beta, So, dk, dv, c, n_cols,
                                         lane, w);
  if (w == 0) {
    if (a.norm_w) {  // fused gated RMSNorm: this warp holds the head's whole row (dv <= 128)
      const float ss = warp_sum(o.x * o.x + o.y * o.y + o.z * o.z + o.w * o.w);  // columns >= dv are 0
      const float inv = 1.0f / sqrtf(ss / static_cast<float>(dv) + a.norm_eps);
      float y[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (e < n_cols) y[e] = y[e] * inv * nwv[e] * silu_f(zv[e]);
      o = make_float4(y[0], y[1], y[2], y[3]);
    }
    store4<VEC>(a.out + (row * a.Hv + h) * dv + c, n_cols, o);
  }
}

// A verify step's conv (cuda_ops.h gdn_chain): thread (channel c, sequence) keeps the raw inputs
// of the K - 1 positions before its token (the live ring's rows, then the tokens' own rows) and,
// per token, writes the conv + SiLU output to conv_out and the whole ring, its taps and the new
// row, to the token's out slot. The live slot's ring is read and written by this thread only.
__global__ void gdn_conv_chain_kernel(GdnChainArgs a) {
  const int seq = blockIdx.y;
  const int C = static_cast<int>(2 * a.Hk * a.dk + a.Hv * a.dv), K = static_cast<int>(a.K);
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int n = a.n_tok[seq], p0 = a.pos0[seq], off = a.out_off[seq];
  const int64_t row0 = a.row0[seq];
  const float* cs = a.conv_state + a.slots[seq] * a.conv_slot_stride;
  // Registers (every index a constant after unrolling): the older taps' weights wt, the new row's wl.
  float hist[kMaxK - 1], wt[kMaxK - 1];
  const float wl = a.conv_w[c * K + K - 1];
  const int r_old0 = (p0 + 1) % K;
#pragma unroll
  for (int j = 0; j < kMaxK - 1; ++j)
    if (j < K - 1) {
      wt[j] = a.conv_w[c * K + j];
      hist[j] = cs[ring_row(r_old0, j, K) * C + c];
    }
  const int64_t qs = a.qkv_stride ? a.qkv_stride : C;
  for (int t = 0; t < n; ++t) {
    const float u = a.qkv[(row0 + t) * qs + c];
    float acc = 0.0f;  // gdn_decode_kernel's order: the older taps, then the new row
#pragma unroll
    for (int j = 0; j < kMaxK - 1; ++j)
      if (j < K - 1) acc = fmaf(wt[j], hist[j], acc);
    a.conv_out[(row0 + t) * C + c] = silu_f(fmaf(wl, u, acc));
    float* co = a.conv_state + a.out_slots[off + t] * a.conv_slot_stride;
    const int r_old = (p0 + t + 1) % K;
#pragma unroll
    for (int j = 0; j < kMaxK - 1; ++j)
      if (j < K - 1) co[ring_row(r_old, j, K) * C + c] = hist[j];
    co[ring_row(r_old, K - 1, K) * C + c] = u;
#pragma unroll
    for (int j = 0; j < kMaxK - 1; ++j)
      if (j + 1 < K - 1) hist[j] = hist[j + 1];
      else if (j + 1 == K - 1) hist[j] = u;
  }
}

// A verify step's recurrent steps (cuda_ops.h gdn_chain): gdn_decode_kernel's block, its state
// in registers across the sequence's tokens; per token, step 2 reads the conv outputs, step 3 is
// the decode's and stores the state to the token's out slot.
template <int DK, bool VEC, int kW = 0>
__global__ void __launch_bounds__(Tile<DK, kW>::kThreads, Tile<DK, kW>::kWarps <= 8 ? 2 : 1)
    gdn_chain_kernel(GdnChainArgs a) {
  constexpr int W = Tile<DK, kW>::kWarps, T = Tile<DK, kW>::kThreads, NR = Tile<DK, kW>::kRows;
  __shared__ float qs[DK], ks[DK];
  __shared__ float4 vs[32];
  __shared__ float4 red_kv[W][32], red_o[W][32];
  __shared__ float red_qk[2][W];
  const int seq = blockIdx.z, h = blockIdx.y;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv), Hk = static_cast<int>(a.Hk);
  const int kh = h / static_cast<int>(a.Hv / a.Hk);
  const int64_t C = 2 * a.Hk * a.dk + a.Hv * a.dv;
  const int col0 = blockIdx.x * kBlockCols;
  const int c = col0 + 4 * lane;
  const int n_cols = dv - c;
  const int n = a.n_tok[seq], off = a.out_off[seq];
  const int64_t row0 = a.row0[seq], head = static_cast<int64_t>(h) * dk * dv;
  const float* S = a.rec_state + a.slots[seq] * a.rec_slot_stride + head;
  float4 s[NR];
#pragma unroll
  for (int m = 0; m < NR; ++m) {
    const int i = w + W * m;
    s[m] = load4<VEC>(S + static_cast<int64_t>(i) * dv + c, i < dk ? n_cols : 0);
  }
  const float dt_b = a.dt_bias[h], a_log = a.A_log[h];
  const int64_t ab = a.ab_stride ? a.ab_stride : a.Hv;
  float* vsf = reinterpret_cast<float*>(vs);
  for (int t = 0; t < n; ++t) {
    const int64_t row = row0 + t;
    const float* y = a.conv_out + row * C;
    float ssq_q = 0.0f, ssq_k = 0.0f;
    for (int i = threadIdx.x; i < 2 * DK + kBlockCols; i += T) {
      const Item it = qkv_item<DK>(i, h, kh, col0, Hk, dk, dv);
      put_item(it, it.valid ? y[it.ch] : 0.0f, qs, ks, vsf, ssq_q, ssq_k);
    }
    warp_sums_qk<W>(ssq_q, ssq_k, red_qk, lane, w);
    float decay, beta;
    gates(a.a[row * ab + h], a.b[row * ab + h], dt_b, a_log, decay, beta);
    __syncthreads();
    float* So = a.rec_state + a.out_slots[off + t] * a.rec_slot_stride + head;
    const float4 o = delta_rule_step<VEC, W, NR>(s, qs, ks, vs, red_kv, red_o, red_qk, decay, beta, So, dk, dv, c,
                                                 n_cols, lane, w);
    if (w == 0) store4<VEC>(a.out + (row * a.Hv + h) * dv + c, n_cols, o);
    __syncthreads();  // the next token's step 2 overwrites qs, ks, vs and the reductions
  }
}

template <int DK, int kW, class Args>
void launch_w(const Args& a, bool vec, cudaStream_t stream) {
  const dim3 grid(grid_1d(a.dv, kBlockCols), static_cast<unsigned>(a.Hv), static_cast<unsigned>(a.n_seqs));
  constexpr int kThreads = Tile<DK, kW>::kThreads;
  if constexpr (std::is_same<Args, GdnChainArgs>::value) {
    if (vec) gdn_chain_kernel<DK, true, kW><<<grid, kThreads, 0, stream>>>(a);
    else gdn_chain_kernel<DK, false, kW><<<grid, kThreads, 0, stream>>>(a);
  } else {
    // A chained call reads the states the call before wrote: before pdl_wait, so no early start.
    const bool pdl = pdl_supported() && !a.chained;
    if (vec) launch_ex(pdl, gdn_decode_kernel<DK, true, kW>, dim3(grid), dim3(kThreads), 0, stream, a);
    else launch_ex(pdl, gdn_decode_kernel<DK, false, kW>, dim3(grid), dim3(kThreads), 0, stream, a);
  }
  PE_CUDA_LAUNCH_CHECK();
}

// dk 128: 16 warps a block (1 block per SM, 8 state rows a thread) where the blocks fit on the
// SMs at once (faster at batch 1 and 2 on the 27B step), else 8 (2 per SM).
template <int DK, class Args>
void launch(const Args& a, bool vec, cudaStream_t stream) {
  if constexpr (DK == 128) {
    const int64_t blocks = grid_1d(a.dv, kBlockCols) * a.Hv * a.n_seqs;
    if (blocks <= sm_count()) return launch_w<128, 16>(a, vec, stream);
  }
  launch_w<DK, 0>(a, vec, stream);
}

// The shape checks of both ops; whether the state / output rows take float4 access (every row
// start 16-byte aligned).
template <class Args>
bool check_shape(const Args& a, const char* op) {
  if (a.Hk <= 0 || a.Hv % a.Hk != 0) fail(PE_ERR_INVALID_ARGUMENT, op, ": Hv must be a multiple of Hk");
  if (a.K < 1 || a.K > kMaxK) fail(PE_ERR_INVALID_ARGUMENT, op, ": kernel width must be 1..16");
  if (a.dk <= 0 || a.dk > 256 || a.dv <= 0 || a.Hv > 65535 || a.n_seqs > 65535)
    fail(PE_ERR_UNSUPPORTED, op, ": needs dk 1..256, Hv and n_seqs <= 65535");
  if ((2 * a.Hk * a.dk + a.Hv * a.dv) * a.K > INT32_MAX)  // the conv indexes in 32 bits
    fail(PE_ERR_UNSUPPORTED, op, ": needs conv channels x kernel width < 2^31");
  return a.dv % 4 == 0 && a.rec_slot_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.rec_state) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
}

template <class Args>
void launch_dk(const Args& a, bool vec, cudaStream_t stream) {
  if (a.dk <= 32) launch<32>(a, vec, stream);
  else if (a.dk <= 64) launch<64>(a, vec, stream);
  else if (a.dk <= 128) launch<128>(a, vec, stream);
  else launch<256>(a, vec, stream);
}

}  // namespace

void gdn_decode(const GdnDecodeArgs& a, cudaStream_t stream) {
  if (a.n_seqs <= 0) return;
  if (a.norm_w && a.dv > kGdnDecodeFusedNormMaxDv)
    fail(PE_ERR_UNSUPPORTED, "cuda::gdn_decode: the fused gated norm needs dv <= ", kGdnDecodeFusedNormMaxDv);
  launch_dk(a, check_shape(a, "cuda::gdn_decode"), stream);
}

void gdn_chain(const GdnChainArgs& a, cudaStream_t stream) {
  if (a.n_seqs <= 0) return;
  if (!a.conv_out) fail(PE_ERR_INVALID_ARGUMENT, "cuda::gdn_chain: needs conv_out scratch");
  const bool vec = check_shape(a, "cuda::gdn_chain");
  constexpr int kConvThreads = 128;
  const int64_t C = 2 * a.Hk * a.dk + a.Hv * a.dv;
  gdn_conv_chain_kernel<<<dim3(grid_1d(C, kConvThreads), static_cast<unsigned>(a.n_seqs)), kConvThreads, 0, stream>>>(a);
  PE_CUDA_LAUNCH_CHECK();
  launch_dk(a, vec, stream);
}

}  // namespace cuda
}  // namespace pe
