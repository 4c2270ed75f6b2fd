// Lab of the tensor-core decode attention (native/src/kernels/cuda/attention_decode_mma.cu): every
// variant of its kernel as measured, checked against the CPU reference (cpu::attention_paged) and
// the library's default dispatch, then timed on the 27B shape (24 query heads, 4 KV heads, head_dim
// 256, one query, page 16) at several depths, per cache dtype (F16, FP8, I8, NVFP4).
//
// Variants, numbered as in the measurements (tools/gpu/KERNELS.md, "Decode attention"):
//   v0  rows of a window resolved before pdl_wait, each warp's first K / V step loaded there; the
//       warps merged in the plain [vector][dim] layout (bank conflicts: 2 banks for FP8 / I8)
//   v1  rows resolved after pdl_wait, the first window's page-table loads under the Q setup; the
//       conflict-free merge (Layout::merge_index)                           = library variant 1
//   v2, v3  v1 + an L2 prefetch of the cache lines one / two rounds (4 warps x 16 keys) ahead
//   v4  NVFP4: v1 with whole-chunk K / V / scale loads a step ahead, exchanged through shared
//       memory, P scaled in the B layout (other dtypes: v1)                 = library variant 2
//   v5  v0 with v1's merge layout                                           = library variant 0
//   v6  splits of <= 32 keys on the pairs kernel (attention_decode_pairs.cu), longer as v4
//                                                                           = library variant 3
// The library keeps v1, v4, v5 and the pairs kernel (its default: pairs for <= 32-key splits, else
// F16 / FP8 v5 up to 4K keys then v1, I8 v5, NVFP4 v4); v0, v2 and v3 lost on every shape.
//
// Build (repo root, a GPU machine): tools/gpu/lab/build.sh; run: build/lab/bin/attention_decode_lab
//   [--depths 1024,8192,32768,65536] [--check-depth 8192] [--reps 5]
// Prints per dtype, depth and variant: device us per call (CUDA graph of one call per cache copy,
// copies >= 256 MiB in all, so the reads come from HBM), the normalized error against the CPU (at
// depths <= --check-depth) and whether the output equals the library's bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/kv_codec.h"
#include "kernels/cuda/attention_decode_mma.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);     \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace pe {
namespace cuda {
namespace attn {
namespace {
namespace tc {

// v2 / v3: L2 prefetch this many rounds ahead at most; the rows of a window are resolved that far
// past its end.
constexpr int kMaxPrefetchRounds = 2;

// kTuned: variants 1-4 (else 0); kPfRounds 1 / 2: variants 2 / 3 (see the top). kFastBlocks 2: variant 4
// (NVFP4, with kTuned), the same arithmetic on the same fp16 operands in the same order as v0; P
// is transposed once per step to the B layout (keys 2t, 2t+1, 2t+8, 2t+9 of vector g) and scaled
// there by those keys' V group scales (from the tile), not by a movmatrix pair per m-tile.
// kSwzOnly (variant 5): v0 with v1's conflict-free merge, without the early page-table loads.
template <DType KV, int D, bool kTuned, int kFastBlocks = 0, bool kSwzOnly = false, int kPfRounds = 0>
__global__ void __launch_bounds__(kThreads, kFastBlocks > 0 ? kFastBlocks : 2)
    decode_variant_kernel(DecodeParams p) {
  constexpr bool kFast = kFastBlocks > 0, kSwz = kTuned || kSwzOnly;
  static_assert(!(kTuned && kSwzOnly), "kSwzOnly: the untuned kernel's rows");
  static_assert(!kFast || (KV == DType::NVFP4 && kTuned), "kFast: the NVFP4 path of the tuned kernel");
  using L = Layout<KV, D>;
  using F = Fp4Stage<D>;
  // FP8 pairs by the hardware conversion where the compiled code has it (exact, like the integer
  // decode; the values 256x larger, which qscale and the result's unit take back: same bits).
  constexpr bool kFp8ByCvt = L::kPairedBytes;
  constexpr int KS = L::KS, MT = L::MT, KW = L::KW, VW = L::VW;
  constexpr bool kFp4 = L::kFp4, kI8 = KV == DType::I8, kF16 = L::kF16;
  // Tuned: the rows of a window plus up to kMaxPrefetchRounds rounds past it (prefetch targets).
  constexpr int kRowsCap = kTuned ? kWindow + kMaxPrefetchRounds * kWarps * kStep : kWindow;
  constexpr int kPg = kRowsCap / kThreads;
  static_assert(kRowsCap % kThreads == 0, "rows per thread");
  __shared__ int64_t rows[kRowsCap];
  __shared__ uint4 qfrag[KS][32];
  __shared__ float qscale[kVecs];
  // kFast: the per-warp staging tiles share red_acc's memory (the merge runs after the loop).
  constexpr int kStageRows = (kWarps * F::kWarpWords + D - 1) / D;
  constexpr int kRedRows = kFast && kStageRows > kVecs ? kStageRows : kVecs;
  constexpr int kRedFloats = kSwz && kVecs * L::kPitch > kRedRows * D ? kVecs * L::kPitch : kRedRows * D;
  __shared__ __align__(16) float red_acc[kRedFloats];
  __shared__ float red_m[kWarps][kVecs], red_l[kWarps][kVecs];
  __shared__ float fin_l[kVecs], fin_m[kVecs];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const DecodeBlock blk = decode_block(p);
  const int split = blk.split, kvh = blk.kvh, nqi = blk.nqi, h0 = blk.h0, nh = blk.nh, nv = blk.nv;
  const int64_t i0 = blk.i0;
  const int64_t kb = static_cast<int64_t>(split) * p.split_len;
  const int64_t ke = min(kb + p.split_len, p.q_start_pos + i0 + nqi);
  const auto row_of = [&](int32_t page, int64_t tk) { return cache_row(p, page, tk, kvh); };  // tk in `page`

  // Tuned: the first window's page-table entries (and the first rounds' L2 prefetches) go out
  // before the Q loads, so their latencies overlap instead of adding up.
  // Prefetch distance in keys (kFast: one round, the registers' look-ahead; no L2 prefetch).
  const int ahead = kFast ? kWarps * kStep : kTuned ? kPfRounds * kWarps * kStep : 0;
  const int ext0 = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(kWindow + ahead), ke - kb)));
  int32_t pg[kTuned ? kPg : 1];
  if constexpr (kTuned) {
#pragma unroll
    for (int i = 0; i < kPg; ++i) {
      const int j = tid + i * kThreads;
      pg[i] = j < ext0 ? p.pt[(kb + j) / p.kv.page_size] : 0;
    }
    if (ahead > 0 && !kFast) {  // rounds 0 .. kPfRounds, a key per thread
      const int n_pf = min(ext0, ahead + kWarps * kStep);
#pragma unroll
      for (int i = 0; i < kPg; ++i) {
        const int j = tid + i * kThreads;
        if (j < n_pf) {
          const int64_t row = row_of(pg[i], kb + j);
#pragma unroll
          for (int u = 0; u < L::PF; ++u) prefetch_item<KV, D>(p, row, u);
        }
      }
    }
  }

  // Launched as a programmatic dependent (launch_decode) of kv_write, which triggers only after
  // its own pdl_wait: every kernel before it has completed, and it writes only the keys from
  // q_start_pos on. So before pdl_wait this block may read the page table (copied by the host
  // before the step) and the cache rows of older keys (p.early: rows on whole sectors, so no
  // cached sector holds a key being written): the untuned kernel resolves its first window's
  // rows and each warp loads its first step's K and V there, overlapping kv_write.
  const int wn0 = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(kWindow), ke - kb)));
  const int64_t rb = kv_row_bytes(KV, D);
  const uint8_t* kbase = static_cast<const uint8_t*>(p.kv.k);
  const uint8_t* vbase = static_cast<const uint8_t*>(p.kv.v);
  uint32_t kw[2][KW], vw[4][VW];
  const auto load_k = [&](int jw, int wn) { L::load_k(kbase, rows, rb, jw, wn, g, t, kw); };
  const auto load_v = [&](int jw, int wn) { L::load_v(vbase, rows, rb, jw, wn, g, t, vw); };
  // V too for the 8-bit caches, F16 K only (its K and V words held over the Q setup spill on
  // sm_75 at head_dim 256); not for NVFP4's untuned kernel (at 255 registers already). NVFP4's
  // kFast kernel resolves its first window's rows here and loads the warp's first whole step.
  constexpr bool kEarly = !kFp4, kEarlyV = !kF16 && !kFp4;
  bool preloaded = false;  // this warp's first step is in kw (and vw), kFast: in kc, vc, ksq, vsq
  // kFast: whole chunks of the warp's next step, loaded while this step computes: K rows g, g+8
  // (chunks t + 4i of CG groups), V rows of keys 2t, 2t+1, 2t+8, 2t+9 (bytes g PB ..), a quarter
  // of the K and V scale rows g, g+8 (the same cache rows). 40 registers at head_dim 256.
  uint32_t kc[2][F::NCH][2 * F::CG], vc[4][F::VQ], ksq[2][KS / 4], vsq[2][KS / 4];
  const auto load_step = [&](int j0, int lim) {  // keys j0 .. j0 + 15 of the rows[] window, < lim valid
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = rows[min(j0 + g + 8 * r, lim - 1)];
#pragma unroll
      for (int i = 0; i < F::NCH; ++i) kv_load_chunk(kbase + row * rb + 8 * F::CG * (t + 4 * i), kc[r][i]);
      kv_load_chunk(reinterpret_cast<const uint8_t*>(p.kv.k_scale + row * KS + t * (KS / 4)), ksq[r]);
      kv_load_chunk(reinterpret_cast<const uint8_t*>(p.kv.v_scale + row * KS + t * (KS / 4)), vsq[r]);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
      kv_load_chunk(vbase + rows[min(j0 + 2 * t + (r & 1) + 8 * (r >> 1), lim - 1)] * rb + g * F::PB, vc[r]);
  };
  if constexpr (!kTuned) {
    resolve_rows(rows, p, kb, wn0, kvh, tid);
    __syncthreads();
    const int j0 = warp * kStep;
    preloaded = kEarly && p.early && j0 < wn0 && kb + min(j0 + kStep - 1, wn0 - 1) < p.q_start_pos;
    if (preloaded) {
      load_k(j0, wn0);
      if constexpr (kEarlyV) load_v(j0, wn0);
    }
  }
  if constexpr (kFast) {
    if (p.early) {  // (keys past the window's end read its last row, as in the loop)
#pragma unroll
      for (int i = 0; i < kPg; ++i) {
        const int j = tid + i * kThreads;
        if (j < ext0) rows[j] = row_of(pg[i], kb + j);
      }
      __syncthreads();
      const int j0 = warp * kStep;
      preloaded = j0 < ext0 && kb + min(j0 + kStep - 1, ext0 - 1) < p.q_start_pos;
      if (preloaded) load_step(j0, ext0);
    }
  }
  pdl_wait();
  pdl_trigger();

  q_fragments<KV, D>(g < nv ? p.q + ((i0 + g / nh) * p.n_heads + h0 + g % nh) * D : nullptr, p.q_mul, lane, qfrag,
                     qscale);
  if (kTuned && !(kFast && p.early))
#pragma unroll
    for (int i = 0; i < kPg; ++i) {
      const int j = tid + i * kThreads;
      if (j < ext0) rows[j] = row_of(pg[i], kb + j);
    }
  __syncthreads();
  const float qsc[2] = {qscale[2 * t], qscale[2 * t + 1]};
  int qoff[2];  // vector 2t + e sees keys up to position qpos0 + qoff[e] (padding: all)
#pragma unroll
  for (int e = 0; e < 2; ++e) qoff[e] = 2 * t + e < nv ? (2 * t + e) / nh : 0x7fffffff;
  const int64_t qpos0 = p.q_start_pos + i0;

  float acc[MT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  const uint32_t fp4_ksel = (t & 1) ? 0x4342u : 0x4140u;           // halfword t & 1 -> bytes 0, 2
  const uint32_t fp4_vsel = (g & 3) | ((4u + (g & 3)) << 8);       // byte g & 3 of two rows
  // kFast: this warp's staging tiles (Fp4Stage): K words, V words, K scales, V scales.
  uint32_t* const kx = reinterpret_cast<uint32_t*>(red_acc) + warp * F::kWarpWords;
  uint32_t* const vx = kx + F::kKx;
  float* const kss = reinterpret_cast<float*>(vx + F::kVx);
  float* const vss = kss + F::kSc;
  if constexpr (kFast)
    if (!preloaded && warp * kStep < ext0) load_step(warp * kStep, ext0);  // the warp's first step

  for (int64_t w0 = kb; w0 < ke; w0 += kWindow) {
    const int wn = static_cast<int>(min(static_cast<int64_t>(kWindow), ke - w0));
    // Rows resolved: this window's, plus (tuned) `ahead` keys past it, which the next window
    // hands to the same warp (kWindow is a multiple of a round).
    const int wn_ext = kTuned ? static_cast<int>(min(static_cast<int64_t>(kWindow + ahead), ke - w0)) : wn;
    if (w0 != kb) {  // the first window's rows: before pdl_wait (untuned), with the Q fragments (tuned)
      __syncthreads();  // the previous window's rows are no longer read
      resolve_rows(rows, p, w0, wn_ext, kvh, tid);
      __syncthreads();
    }
    for (int jw = warp * kStep; jw < wn; jw += kWarps * kStep) {  // warp-uniform
      if constexpr (kTuned) {  // this warp's tile `ahead` keys on: lane = key (lane & 15), items of half lane >> 4
        const int jp = jw + ahead + (lane & 15);
        if (ahead > 0 && !kFast && jp < wn_ext) {
          const int64_t row = rows[jp];
#pragma unroll
          for (int i = 0; i < L::PF / 2; ++i) prefetch_item<KV, D>(p, row, (lane >> 4) + 2 * i);
        }
      }
      const int64_t rk[2] = {rows[min(jw + g, wn - 1)], rows[min(jw + g + 8, wn - 1)]};
      if constexpr (!kFast) {
        if (!preloaded) load_k(jw, wn);
        if (!kEarlyV || !preloaded) load_v(jw, wn);
      }
      preloaded = false;
      float ksc[2][kFp4 ? KS : 1], vsc[2][kFp4 ? MT : 1];
      if constexpr (kI8) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          ksc[r][0] = __ldg(p.kv.k_scale + rk[r]);
          vsc[r][0] = __ldg(p.kv.v_scale + rk[r]) * L::kVMul;
        }
      } else if constexpr (kFp4 && !kFast) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int i = 0; i < KS / 4; ++i) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(p.kv.k_scale + rk[r] * KS) + i);
            ksc[r][4 * i] = a.x; ksc[r][4 * i + 1] = a.y; ksc[r][4 * i + 2] = a.z; ksc[r][4 * i + 3] = a.w;
          }
      }
      uint32_t kxw[kFast ? KS : 1], vxw[kFast ? MT : 1];  // kFast: this lane's K / V word per k-step / m-tile
      if constexpr (kFast) {  // stage this step's chunks (loaded a step ahead), then load the next step's
        __syncwarp();  // the previous step's tile reads are done
        // K word for lane (g, tt) and group G: bytes 2tt, 2tt+1 of G in rows g (bytes 0, 2), g+8 (1, 3).
#pragma unroll
        for (int i = 0; i < F::NCH; ++i)
#pragma unroll
          for (int tt = 0; tt < 4; ++tt) {
            uint32_t w[F::CG];
#pragma unroll
            for (int a = 0; a < F::CG; ++a)
              w[a] = __byte_perm(kc[0][i][2 * a + (tt >> 1)], kc[1][i][2 * a + (tt >> 1)], (tt & 1) ? 0x7362 : 0x5140);
            st_shared_words(kx + g * F::KXG + tt * F::KXT + F::CG * (t + 4 * i), w);
          }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          st_shared_words(reinterpret_cast<uint32_t*>(kss) + (g + 8 * r) * F::SP + t * (KS / 4), ksq[r]);
          st_shared_words(reinterpret_cast<uint32_t*>(vss) + (g + 8 * r) * F::SP + t * (KS / 4), vsq[r]);
        }
        // V: byte c of word q of this lane's chunk = byte beta of group j, for lane (beta, t).
        uint32_t vt[F::VQ][4];
#pragma unroll
        for (int q = 0; q < F::VQ; ++q) byte_transpose4(vc[0][q], vc[1][q], vc[2][q], vc[3][q], vt[q]);
        if constexpr (F::VQ == 4) {  // words q, q + 2: m-tiles 2g, 2g + 1 side by side
#pragma unroll
          for (int q = 0; q < 2; ++q)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const uint32_t w[2] = {vt[q][c], vt[q + 2][c]};
              st_shared_words(vx + t * F::VXT + (4 * q + c) * F::VXG + 2 * g, w);
            }
        } else {
#pragma unroll
          for (int q = 0; q < F::VQ; ++q)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const int pos = g * F::PB + 4 * q + c;
              vx[t * F::VXT + (pos & 7) * F::VXG + (pos >> 3)] = vt[q][c];
            }
        }
        __syncwarp();
        // The next step of this warp: jw + one round, in this window or (rows resolved past its end)
        // the first of the next; keys past the split read its last row (masked, finite).
        if (jw + kWarps * kStep < wn_ext) load_step(jw + kWarps * kStep, wn_ext);
      }

      // S^T = K Q^T: s[0], s[1] = key g, vectors 2t, 2t+1; s[2], s[3] = key g + 8.
      float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      float sp[4][4] = {};  // 4 independent mma chains (k-step parity x q part), summed below
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t a[2][2];  // [key row][k half]
        if constexpr (kFast) {  // words and scales read from the tiles 4 k-steps at a time (registers)
          if ((ks & 3) == 0) {
            ld_shared_words4(kx + g * F::KXG + t * F::KXT + ks, &kxw[ks]);
#pragma unroll
            for (int r = 0; r < 2; ++r)
              ld_shared_words4(reinterpret_cast<const uint32_t*>(kss) + (g + 8 * r) * F::SP + ks,
                               reinterpret_cast<uint32_t*>(&ksc[r][ks]));
          }
          a[0][0] = kv_fp4_pair_lo(kxw[ks]);
          a[0][1] = kv_fp4_pair_hi(kxw[ks]);
          a[1][0] = fp4_pair_lo13(kxw[ks]);
          a[1][1] = fp4_pair_hi13(kxw[ks]);
        }
#pragma unroll
        for (int r = 0; r < 2 && !kFast; ++r) {
          if constexpr (kF16) {
            a[r][0] = kw[r][2 * ks];
            a[r][1] = kw[r][2 * ks + 1];
          } else if constexpr (KV == DType::FP8_E4M3 || kI8) {
            L::decode_k(kw[r][ks], a[r][0], a[r][1]);
          } else {
            const uint32_t z = __byte_perm(kw[r][ks], 0u, fp4_ksel);
            a[r][0] = kv_fp4_pair_lo(z);
            a[r][1] = kv_fp4_pair_hi(z);
          }
        }
        const uint4 qf = qfrag[ks][lane];
        if constexpr (kFp4) {  // one group per k-step: its scale per key
          float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_k16(c, a[0][0], a[1][0], a[0][1], a[1][1], qf.x, qf.y);
          mma_k16(c, a[0][0], a[1][0], a[0][1], a[1][1], qf.z, qf.w);
          s[0] = fmaf(c[0], ksc[0][ks], s[0]);
          s[1] = fmaf(c[1], ksc[0][ks], s[1]);
          s[2] = fmaf(c[2], ksc[1][ks], s[2]);
          s[3] = fmaf(c[3], ksc[1][ks], s[3]);
        } else {
          mma_k16(sp[ks & 1], a[0][0], a[1][0], a[0][1], a[1][1], qf.x, qf.y);
          mma_k16(sp[2 + (ks & 1)], a[0][0], a[1][0], a[0][1], a[1][1], qf.z, qf.w);
        }
      }
      if constexpr (!kFp4)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i] = (sp[0][i] + sp[1][i]) + (sp[2][i] + sp[3][i]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kj = jw + g + 8 * (i >> 1);
        float x = s[i] * qsc[i & 1];
        if constexpr (kI8) x *= ksc[i >> 1][0];
        s[i] = kj < wn && w0 + kj - qpos0 <= qoff[i & 1] ? x : -INFINITY;
      }
      // Online softmax per vector (columns): maxima over the 16 keys = the 8 groups.
      float mn[2], base[2];
      bool grow = false;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float mx = fmaxf(s[e], s[2 + e]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        mn[e] = fmaxf(m[e], mx);
        grow |= mn[e] > m[e];
        base[e] = mn[e] == -INFINITY ? 0.0f : mn[e];
      }
      if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float corr = exp2f(m[e] - base[e]);
          l[e] *= corr;
#pragma unroll
          for (int j = 0; j < MT; ++j) {
            acc[j][e] *= corr;
            acc[j][2 + e] *= corr;
          }
        }
      }
      float pr[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pr[i] = exp2f(s[i] - base[i & 1]);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        m[e] = mn[e];
        l[e] += pr[e] + pr[2 + e];
      }
      // O^T += V^T P^T per m-tile (P high and low parts: two mma).
      uint32_t bh[2], bl[2];
      float pb[4], vsj[4][4];  // kFast: P^T in B layout (keys 2t, 2t+1, 2t+8, 2t+9; vector g) * kVMul
      if constexpr (kFast) {
        transpose8x8_f32(pr[0], pr[1], pb[0], pb[1]);
        transpose8x8_f32(pr[2], pr[3], pb[2], pb[3]);
#pragma unroll
        for (int i = 0; i < 4; ++i) pb[i] *= L::kVMul;
      } else if constexpr (kFp4) {  // loaded here, not with the values: registers
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int i = 0; i < MT / 4; ++i) {
            const float4 b = __ldg(reinterpret_cast<const float4*>(p.kv.v_scale + rk[r] * MT) + i);
            vsc[r][4 * i] = b.x * L::kVMul; vsc[r][4 * i + 1] = b.y * L::kVMul;
            vsc[r][4 * i + 2] = b.z * L::kVMul; vsc[r][4 * i + 3] = b.w * L::kVMul;
          }
      } else {
        float pv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) pv[i] = kI8 ? pr[i] * vsc[i >> 1][0] : pr[i];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          split_f16(pv[2 * r], pv[2 * r + 1], bh[r], bl[r]);
          bh[r] = transpose8x8(bh[r]);
          bl[r] = transpose8x8(bl[r]);
        }
      }
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        uint32_t a[4];  // rows g / g+8 x keys (2t, 2t+1) / (2t+8, 2t+9)
        if constexpr (kFast) {  // word bytes: keys 2t, 2t+8, 2t+1, 2t+9; V scales of those keys
          if ((j & 3) == 0) ld_shared_words4(vx + t * F::VXT + g * F::VXG + j, &vxw[j]);
          a[0] = kv_fp4_pair_lo(vxw[j]);
          a[1] = kv_fp4_pair_hi(vxw[j]);
          a[2] = fp4_pair_lo13(vxw[j]);
          a[3] = fp4_pair_hi13(vxw[j]);
          if ((j & 3) == 0)
#pragma unroll
            for (int r = 0; r < 4; ++r)
              ld_shared_words4(reinterpret_cast<const uint32_t*>(vss) + (2 * t + (r & 1) + 8 * (r >> 1)) * F::SP + j,
                               reinterpret_cast<uint32_t*>(vsj[r]));
          split_f16(pb[0] * vsj[0][j & 3], pb[1] * vsj[1][j & 3], bh[0], bl[0]);
          split_f16(pb[2] * vsj[2][j & 3], pb[3] * vsj[3][j & 3], bh[1], bl[1]);
        }
#pragma unroll
        for (int r = 0; r < 2 && !kFast; ++r)
          L::decode_v(vw[2 * r][L::v_word(j)], vw[2 * r + 1][L::v_word(j)], j, fp4_vsel, a[2 * r], a[2 * r + 1]);
        if constexpr (kFp4 && !kFast) {  // m-tile j = group j: its scale per key
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            split_f16(pr[2 * r] * vsc[r][j], pr[2 * r + 1] * vsc[r][j], bh[r], bl[r]);
            bh[r] = transpose8x8(bh[r]);
            bl[r] = transpose8x8(bl[r]);
          }
        }
        mma_k16(acc[j], a[0], a[1], a[2], a[3], bh[0], bh[1]);
        mma_k16(acc[j], a[0], a[1], a[2], a[3], bl[0], bl[1]);
      }
    }
  }

  // Merge: l over the 8 groups, then the warps through shared memory (fixed order).
  float* const racc = red_acc;
  const auto acc_at = [&](int v, int d) -> float& { return racc[kSwz ? L::merge_index(v, d) : v * D + d]; };
  float* const lane_acc = racc + (kSwz ? L::merge_lane(g, t) : 0);  // kSwz: + merge_const(j, i)
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) l[e] += __shfl_xor_sync(0xffffffffu, l[e], off);
  if (g == 0)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      red_m[warp][2 * t + e] = m[e];
      red_l[warp][2 * t + e] = l[e];
    }
  __syncthreads();
  float fac[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_m[w][2 * t + e]);
    fac[e] = exp2f(m[e] - (mx == -INFINITY ? 0.0f : mx));
  }
  if (tid < kVecs) {
    float mx = -INFINITY, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_m[w][tid]);
    const float b = mx == -INFINITY ? 0.0f : mx;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += red_l[w][tid] * exp2f(red_m[w][tid] - b);
    fin_m[tid] = mx;
    fin_l[tid] = sum;
  }
  // Only the warps that had keys add (the others hold 0 * 0): a 32-key split (1K context) has 2.
  const int64_t n_split = ke - kb;
  const int merged = n_split >= kWarps * kStep ? kWarps : max(1, static_cast<int>((n_split + kStep - 1) / kStep));
  for (int w = 0; w < merged; ++w) {
    if (warp == w)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float& dst = kSwz ? lane_acc[L::merge_const(j, i)] : acc_at(2 * t + (i & 1), L::out_dim(j, i >> 1, g));
          const float x = acc[j][i] * fac[i & 1];
          dst = w == 0 ? x : dst + x;
        }
    __syncthreads();
  }

  store_decode_result(p, acc_at, fin_m, fin_l, nv, nh, i0, h0, split, D, tid, kFp8ByCvt ? 1.0f / 256.0f : 1.0f);
}

}  // namespace tc

template <DType KV, int D, bool kTuned, int kFastBlocks = 0, bool kSwzOnly = false, int kPfRounds = 0>
void run_kernel(DecodeParams p, bool pairs, int64_t n_keys, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  auto* kernel = tc::decode_variant_kernel<KV, D, kTuned, kFastBlocks, kSwzOnly, kPfRounds>;
  static const int resident = [kernel] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kThreads, 0) != cudaSuccess) b = 1;
    return std::max(b, 1);
  }();
  p.q_mul *= KvChunk<KV>::kUnit;
  p.v_unit = KvChunk<KV>::kUnit / tc::Layout<KV, D>::kVMul;
  const auto on_sectors = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 32 == 0; };
  p.early = kv_row_bytes(KV, D) % 32 == 0 && on_sectors(p.kv.k) && on_sectors(p.kv.v) &&
            (KV != DType::NVFP4 || (D / 4 % 32 == 0 && on_sectors(p.kv.k_scale) && on_sectors(p.kv.v_scale)));
  if (pairs && decode_split_len(p, resident, n_keys) <= 2 * tc::kStep) {
    launch_decode(pairs_kernel<KV, D>(), resident, p, n_keys, scratch, scratch_bytes, stream);
    return;
  }
  launch_decode(kernel, resident, p, n_keys, scratch, scratch_bytes, stream);
}

template <DType KV, int D>
void run_variant(int v, const DecodeParams& p, int64_t n_keys, void* scratch, size_t sb, cudaStream_t st) {
  constexpr int kFast4 = KV == DType::NVFP4 ? 2 : 0;
  switch (v) {
    case 0: return run_kernel<KV, D, false>(p, false, n_keys, scratch, sb, st);
    case 1: return run_kernel<KV, D, true>(p, false, n_keys, scratch, sb, st);
    case 2: return run_kernel<KV, D, true, 0, false, 1>(p, false, n_keys, scratch, sb, st);
    case 3: return run_kernel<KV, D, true, 0, false, 2>(p, false, n_keys, scratch, sb, st);
    case 5: return run_kernel<KV, D, false, 0, true>(p, false, n_keys, scratch, sb, st);
    default: return run_kernel<KV, D, true, kFast4>(p, v == 6, n_keys, scratch, sb, st);  // 4, 6
  }
}

// The launch parameters of one decode call, as attention_decode (attention_decode.cu) sets them.
DecodeParams decode_params(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads, const PagedKV& kv,
                           const int32_t* page_table, float scale, const float* gate, float* out) {
  DecodeParams p{};
  p.q = q;
  p.gate = gate;
  p.out = out;
  p.pt = page_table;
  p.kv = kv;
  p.n_q = n_q;
  p.q_start_pos = q_start_pos;
  p.n_heads = n_heads;
  p.group = static_cast<int>(n_heads / kv.n_kv_heads);
  p.hb = std::min(p.group, kMaxVecs);
  p.n_hb = (p.group + p.hb - 1) / p.hb;
  p.qb = static_cast<int>(std::min<int64_t>(n_q, std::max(1, kMaxVecs / p.hb)));
  p.n_qb = static_cast<int>((n_q + p.qb - 1) / p.qb);
  while ((1 << p.lpk_log2) < kv.head_dim / 8) ++p.lpk_log2;
  p.q_mul = scale * 1.4426950408889634f;
  return p;
}

void run_any(DType t, int v, const DecodeParams& p, int64_t n_keys, void* scratch, size_t sb, cudaStream_t st) {
  switch (t) {
    case DType::F16: return run_variant<DType::F16, 256>(v, p, n_keys, scratch, sb, st);
    case DType::FP8_E4M3: return run_variant<DType::FP8_E4M3, 256>(v, p, n_keys, scratch, sb, st);
    case DType::I8: return run_variant<DType::I8, 256>(v, p, n_keys, scratch, sb, st);
    default: return run_variant<DType::NVFP4, 256>(v, p, n_keys, scratch, sb, st);
  }
}

}  // namespace
}  // namespace attn
}  // namespace cuda
}  // namespace pe

using namespace pe;

namespace {

constexpr int64_t kHeads = 24, kKvHeads = 4, kDim = 256, kPage = 16;

struct Rng {  // uniform [-1, 1): the caches' and q's values
  uint64_t s;
  float next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
};

double norm_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Device microseconds per call: a graph of one call per copy (n calls), replayed `reps` times.
double graph_us(const std::function<void(int, cudaStream_t)>& call, int n, int reps) {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < n; ++i) call(i, st);
  CK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, st));
  for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, st));
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  float ms = 0.0f;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
  return 1e3 * ms / (double(reps) * n);
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    out.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> depths = {1024, 8192, 32768, 65536};
  int64_t check_depth = 8192;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--depths")) depths = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--check-depth")) check_depth = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  if (!cuda::device_available()) {
    std::printf("no CUDA device\n");
    return 1;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  std::printf("%-9s %6s %-5s %9s %10s %s\n", "kv", "depth", "var", "us/call", "err(cpu)", "vs library");
  for (DType t : {DType::F16, DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (int64_t depth : depths) {
      const int64_t total = depth + 1, n_pages = (total + kPage - 1) / kPage, rows = n_pages * kPage * kKvHeads;
      const cpu::KvRowFormat fmt = cpu::kv_row_format(t, kDim);
      const size_t vbytes = size_t(rows) * fmt.bytes, sbytes = size_t(rows) * fmt.scales * 4;
      // The cache as the CPU's kv_write encodes it (the device's kv_write writes the same bytes).
      Rng rng{0x9e3779b97f4a7c15ull + static_cast<uint64_t>(depth) * 31 + static_cast<uint64_t>(t)};
      std::vector<float> k(total * kKvHeads * kDim), v(k.size()), q(kHeads * kDim), gate(q.size());
      for (float& x : k) x = rng.next();
      for (float& x : v) x = rng.next();
      for (float& x : q) x = 4.0f * rng.next();
      for (float& x : gate) x = rng.next();
      std::vector<int32_t> pt(n_pages);
      for (int64_t i = 0; i < n_pages; ++i) pt[i] = static_cast<int32_t>((i * 7) % n_pages);
      if (n_pages % 7 == 0) for (int64_t i = 0; i < n_pages; ++i) pt[i] = static_cast<int32_t>(i);
      std::vector<uint8_t> hk(vbytes), hv(vbytes);
      std::vector<float> hks(std::max<size_t>(sbytes / 4, 1)), hvs(hks.size());
      const cpu::PagedKV hkv{t, hk.data(), hv.data(), fmt.scales ? hks.data() : nullptr, fmt.scales ? hvs.data() : nullptr,
                        kPage, kKvHeads, kDim};
      cpu::kv_write(hkv, pt.data(), 0, total, k.data(), v.data());
      std::vector<float> ref;
      if (depth <= check_depth) {
        ref.resize(q.size());
        cpu::attention_paged(q.data(), 1, depth, kHeads, hkv, pt.data(), scale, gate.data(), ref.data());
      }
      // Device: copies of the cache (>= 256 MiB in all), the page table, q, gate, out, scratch.
      const int copies = static_cast<int>(std::clamp<size_t>((size_t(256) << 20) / (2 * (vbytes + sbytes)) + 1, 1, 64));
      uint8_t *dk, *dv;
      float *dks = nullptr, *dvs = nullptr, *dq, *dgate, *dout;
      int32_t* dpt;
      CK(cudaMalloc(&dk, vbytes * copies));
      CK(cudaMalloc(&dv, vbytes * copies));
      if (sbytes) {
        CK(cudaMalloc(&dks, sbytes * copies));
        CK(cudaMalloc(&dvs, sbytes * copies));
      }
      for (int c = 0; c < copies; ++c) {
        CK(cudaMemcpy(dk + c * vbytes, hk.data(), vbytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv + c * vbytes, hv.data(), vbytes, cudaMemcpyHostToDevice));
        if (sbytes) {
          CK(cudaMemcpy(reinterpret_cast<uint8_t*>(dks) + c * sbytes, hks.data(), sbytes, cudaMemcpyHostToDevice));
          CK(cudaMemcpy(reinterpret_cast<uint8_t*>(dvs) + c * sbytes, hvs.data(), sbytes, cudaMemcpyHostToDevice));
        }
      }
      CK(cudaMalloc(&dpt, n_pages * 4));
      CK(cudaMemcpy(dpt, pt.data(), n_pages * 4, cudaMemcpyHostToDevice));
      CK(cudaMalloc(&dq, q.size() * 4));
      CK(cudaMalloc(&dgate, q.size() * 4));
      CK(cudaMalloc(&dout, q.size() * 4));
      CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dgate, gate.data(), q.size() * 4, cudaMemcpyHostToDevice));
      const size_t sb = cuda::attention_paged_scratch_bytes(1, depth, kHeads, kKvHeads, kDim);
      void* scratch;
      CK(cudaMalloc(&scratch, std::max<size_t>(sb, 1)));
      const auto kv_copy = [&](int c) {
        return cpu::PagedKV{t, dk + c * vbytes, dv + c * vbytes,
                       sbytes ? reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(dks) + c * sbytes) : nullptr,
                       sbytes ? reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(dvs) + c * sbytes) : nullptr,
                       kPage, kKvHeads, kDim};
      };
      std::vector<float> lib(q.size()), out(q.size());
      cuda::attention_paged(dq, 1, depth, kHeads, kv_copy(0), dpt, scale, dgate, dout, scratch, sb, nullptr);
      CK(cudaMemcpy(lib.data(), dout, q.size() * 4, cudaMemcpyDeviceToHost));
      const auto row = [&](const char* var, const std::function<void(int, cudaStream_t)>& call) {
        CK(cudaMemset(dout, 0, q.size() * 4));
        call(0, nullptr);
        CK(cudaMemcpy(out.data(), dout, q.size() * 4, cudaMemcpyDeviceToHost));
        const double us = graph_us(call, copies, reps);
        char err[32] = "-";
        if (!ref.empty()) std::snprintf(err, sizeof err, "%.2e", norm_err(out, ref));
        const bool same = std::memcmp(out.data(), lib.data(), out.size() * 4) == 0;
        std::printf("%-9s %6lld %-5s %9.2f %10s %s\n", dtype_name(t), (long long)depth, var, us, err,
                    same ? "bitwise" : std::to_string(norm_err(out, lib)).c_str());
      };
      row("lib", [&](int c, cudaStream_t st) {
        cuda::attention_paged(dq, 1, depth, kHeads, kv_copy(c), dpt, scale, dgate, dout, scratch, sb, st);
      });
      for (int var = 0; var < 7; ++var) {
        if (var == 4 && t != DType::NVFP4) continue;  // v4 runs v1 for the other dtypes
        char name[8];
        std::snprintf(name, sizeof name, "v%d", var);
        row(name, [&](int c, cudaStream_t st) {
          const cuda::attn::DecodeParams p =
              cuda::attn::decode_params(dq, 1, depth, kHeads, kv_copy(c), dpt, scale, dgate, dout);
          cuda::attn::run_any(t, var, p, depth + 1, scratch, sb, st);
        });
      }
      CK(cudaFree(dk)); CK(cudaFree(dv)); CK(cudaFree(dpt)); CK(cudaFree(dq)); CK(cudaFree(dgate));
      CK(cudaFree(dout)); CK(cudaFree(scratch));
      if (dks) { CK(cudaFree(dks)); CK(cudaFree(dvs)); }
    }
  return 0;
}
