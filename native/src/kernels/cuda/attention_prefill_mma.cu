// Causal GQA prefill attention over the paged KV cache on the fp16 tensor cores (flash style).
// Same math as attention_paged (ops.h): for query i at position P = q_start_pos + i and head h
// (kv head h / (n_heads / n_kv_heads)), o = softmax(scale q.k_t, t = 0 .. P) . v, times
// sigmoid(gate) when gate is given. q, gate, out [n_q, n_heads, head_dim] fp32.
//
// Block = 64 consecutive queries of ONE q head, 4 warps of 16 query rows (grid: heads x query
// tiles, the longest tiles first; heads of one GQA group are neighbours, so a K/V tile read by
// one block is an L2 hit for the group's other blocks). Per block:
//   Q tile -> fp16 in shared memory once, scale * log2(e) folded in (scores in the log2 domain);
//   for each tile of BN keys (0 .. the block's last position): K and V rows decoded from the
//   paged cache (any kv_codec.cuh format, scales applied) to fp16 in shared memory;
//   S = Q K^T by mma (fp16 in, fp32 accumulate), -inf past each row's position (diagonal tiles
//   only; a warp skips tiles entirely past its rows); online softmax in fp32 registers (exp2f,
//   running max m and partial sums l per thread row, O rescaled only when a max moved);
//   P -> fp16 A fragments straight from the S accumulators; O += P V by mma (V fragments by
//   ldmatrix.trans); at the end O / l, times sigmoid(gate), fp32 out.
// Pipeline without cp.async (sm_75): V's global loads are issued before the S product and
// stored after the softmax, the next K tile's loads are issued before the O product; two
// barriers per key tile. Shared memory (dynamic): Q [64][Dp+8], K and V [BN][Dp+8] fp16, rows
// padded by 8 halves so ldmatrix is conflict free; BN = 4096 / Dp keys (each thread moves 4
// chunks of 8 values per tile): Dp 64 -> 27 KB, 128 -> 34 KB, 256 -> 49.5 KB (<= 64 KB: sm_75).
// head_dim: any multiple of 8 up to 256, run as Dp = 64, 128 or 256 with zero padding.
//
// Accuracy (design decision): Q (after the scale), K, V and P are rounded to fp16 (F16 and FP8
// caches and BF16 values in the fp16 normal range convert exactly; F32 / I8 / NVFP4 values round
// once, 2^-11 relative); all sums are fp32. Expected normalized error vs the fp32 CPU twin
// ~1e-4 .. 1e-3 (test limit 3e-3, as the fp16 GEMM). q * scale, K and V must fit fp16 (clamped to
// +-65504): true for these models' normed q/k.
// On sm_80+ devices F16 / BF16 caches take attention_prefill_sm80.cu instead (attention_prefill_sm80_applies).
#include <algorithm>

#include "kernels/cuda/attention_prefill.cuh"
#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {
namespace {

using namespace prefill;

constexpr int kWarps = 4, kThreads = kWarps * 32, kBM = kWarps * 16, kMaxD = 256;

template <int DP>
struct Cfg {
  static constexpr int BN = 4096 / DP;         // keys per tile
  static constexpr int LD = DP + 8;            // shared row stride in halves
  static constexpr int CPR = DP / 8;           // chunks of 8 values per row
  static constexpr int KPP = kThreads / CPR;   // key rows per pass of the block
  static constexpr int CHUNKS = BN / KPP;      // chunks per thread per tile
  static constexpr int NT = BN / 8;            // n tiles of S per warp
  static constexpr int RR = (BN + 31) / 32;    // cache rows held per lane
  static constexpr size_t kSmem = static_cast<size_t>(kBM + 2 * BN) * LD * sizeof(__half);
  static_assert(CHUNKS * KPP == BN && 32 % KPP == 0 && BN % 16 == 0, "tile shape");
};

// One K or V tile in flight: raw chunk words + the chunk's scale (times the decoder's unit).
template <DType KV, int DP>
struct TileRegs {
  static constexpr int W = KvChunk<KV>::kWords;
  uint32_t w[Cfg<DP>::CHUNKS][W];
  float mul[Cfg<DP>::CHUNKS];
};

// Lane l holds the cache rows of keys t0 + l + 32 r (r < RR), -1 past n_keys.
template <int DP>
__device__ __forceinline__ void tile_rows(const PrefillParams& p, int t0, int n_keys, int g, int lane,
                                          int64_t (&rows)[Cfg<DP>::RR]) {
#pragma unroll
  for (int r = 0; r < Cfg<DP>::RR; ++r) {
    const int j = lane + 32 * r, t = t0 + j;
    rows[r] = (j < Cfg<DP>::BN && t < n_keys) ? cache_row(p, t, g) : -1;
  }
}

// Issues the global loads of this thread's chunks of a tile: chunk i is key j = i * KPP +
// tid / CPR (its row shuffled from lane j % 32; j / 32 is the same for the whole warp), values
// c * 8 .. c * 8 + 7 with c = tid % CPR. Missing keys load zeros.
template <DType KV, int DP>
__device__ __forceinline__ void load_tile(const PrefillParams& p, const void* base, const float* scales,
                                          const int64_t (&rows)[Cfg<DP>::RR], int tid,
                                          TileRegs<KV, DP>& tr) {
  using C = Cfg<DP>;
  constexpr int W = TileRegs<KV, DP>::W;
  const int c = tid % C::CPR, D = p.D;
  const int64_t rb = kv_row_bytes(KV, D), rs = kv_row_scales(KV, D);
#pragma unroll
  for (int i = 0; i < C::CHUNKS; ++i) {
    const int j = i * C::KPP + tid / C::CPR;
    const int64_t row = __shfl_sync(0xffffffffu, rows[(i * C::KPP) / 32], j & 31);
    tr.mul[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < W; ++k) tr.w[i][k] = 0u;
    if (row >= 0 && c * 8 < D) {
      kv_load_chunk<W>(static_cast<const uint8_t*>(base) + row * rb + c * (W * 4), tr.w[i]);
      float s = 1.0f;
      if constexpr (KV == DType::I8) s = __ldg(scales + row);
      else if constexpr (KV == DType::NVFP4) s = __ldg(scales + row * rs + (c >> 1));
      tr.mul[i] = s * KvChunk<KV>::kUnit;
    }
  }
}

// Decodes the tile to fp16 and stores it (columns past head_dim are left alone: zero).
template <DType KV, int DP>
__device__ __forceinline__ void store_tile(const PrefillParams& p, const TileRegs<KV, DP>& tr, int tid,
                                           __half* buf) {
  using C = Cfg<DP>;
  const int c = tid % C::CPR;
  if (c * 8 >= p.D) return;
#pragma unroll
  for (int i = 0; i < C::CHUNKS; ++i) {
    const int j = i * C::KPP + tid / C::CPR;
    uint4 h;
    if constexpr (KV == DType::F16) {
      h = make_uint4(tr.w[i][0], tr.w[i][1], tr.w[i][2], tr.w[i][3]);  // zeros for missing keys
    } else {
      float x[8];
      kv_decode_chunk<KV, TileRegs<KV, DP>::W>(tr.w[i], x);
      const float m = tr.mul[i];  // 0 for missing keys (their words decode to finite values)
      h = make_uint4(half2_bits(x[0] * m, x[1] * m), half2_bits(x[2] * m, x[3] * m),
                     half2_bits(x[4] * m, x[5] * m), half2_bits(x[6] * m, x[7] * m));
    }
    *reinterpret_cast<uint4*>(buf + j * C::LD + c * 8) = h;
  }
}

template <DType KV, int DP>
__global__ void __launch_bounds__(kThreads) prefill_mma_kernel(PrefillParams p) {
  using C = Cfg<DP>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* Qs = reinterpret_cast<__half*>(smem_raw);
  __half* Ks = Qs + kBM * C::LD;
  __half* Vs = Ks + C::BN * C::LD;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;  // fragment row group / thread in quad
  const int h = blockIdx.x, g = h / p.group;
  const int i0 = (gridDim.y - 1 - blockIdx.y) * kBM;  // longest query tiles first
  const int D = p.D;

  // Zero K/V (pad columns stay zero) and stage Q * scale * log2(e) as fp16 (zero rows past n_q).
  for (int e = tid; e < 2 * C::BN * C::LD / 8; e += kThreads)
    reinterpret_cast<uint4*>(Ks)[e] = make_uint4(0, 0, 0, 0);
  stage_q<kBM, C::CPR, C::LD>(p, Qs, i0, h, D, tid, kThreads);
  __syncthreads();  // the zeros land before any tile store

  // This warp's rows: queries i0 + 16 warp + (gq, gq + 8).
  const int wi0 = i0 + 16 * warp;
  const bool warp_rows = wi0 < p.n_q;
  const int pos_first = p.q_start_pos + wi0;                            // warp's first row
  const int pos_last = p.q_start_pos + min(wi0 + 15, p.n_q - 1);       // warp's last real row
  const int pos0 = pos_first + gq, pos1 = pos0 + 8;                     // this thread's rows
  const int n_keys = p.q_start_pos + min(i0 + kBM, p.n_q);             // the block's keys
  const int n_tiles = (n_keys + C::BN - 1) / C::BN;

  float o[DP / 8][4];
#pragma unroll
  for (int d = 0; d < DP / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  int64_t rows[C::RR];
  TileRegs<KV, DP> kr, vr;
  tile_rows<DP>(p, 0, n_keys, g, lane, rows);
  load_tile<KV, DP>(p, p.kv.k, p.kv.k_scale, rows, tid, kr);

  for (int it = 0; it < n_tiles; ++it) {
    const int t0 = it * C::BN;
    store_tile<KV, DP>(p, kr, tid, Ks);
    load_tile<KV, DP>(p, p.kv.v, p.kv.v_scale, rows, tid, vr);
    __syncthreads();  // K tile visible; every warp is past the previous O product (V free)

    // Warp-uniform: does any of this warp's rows see a key of this tile?
    const bool active = warp_rows && t0 <= pos_last;
    uint32_t pa[C::BN / 16][4];
    if (active) {
      float s[C::NT][4];
#pragma unroll
      for (int n = 0; n < C::NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < DP / 16; ++ks) {
        if (ks * 16 >= D) break;
        uint32_t a[4];
        ldsm_x4(a, Qs + (warp * 16 + (lane & 15)) * C::LD + ks * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < C::BN / 16; ++np) {
          uint32_t r[4];
          ldsm_x4(r, Ks + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * C::LD + ks * 16 + ((lane >> 3) & 1) * 8);
          const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
          mma_16816(s[2 * np], a, b0);
          mma_16816(s[2 * np + 1], a, b1);
        }
      }
      softmax_tile(s, o, m0, m1, l0, l1, t0, C::BN, pos_first, pos0, pos1, tq);
      // P as A fragments of k steps of 16 keys: the C layout of n tiles 2k, 2k+1 is the A
      // layout of k step k (a0: row gq keys 2tq.., a1: row gq+8, a2/a3: the same 8 keys later).
#pragma unroll
      for (int k = 0; k < C::BN / 16; ++k) {
        pa[k][0] = half2_bits(s[2 * k][0], s[2 * k][1]);
        pa[k][1] = half2_bits(s[2 * k][2], s[2 * k][3]);
        pa[k][2] = half2_bits(s[2 * k + 1][0], s[2 * k + 1][1]);
        pa[k][3] = half2_bits(s[2 * k + 1][2], s[2 * k + 1][3]);
      }
    }
    store_tile<KV, DP>(p, vr, tid, Vs);
    if (it + 1 < n_tiles) {
      tile_rows<DP>(p, t0 + C::BN, n_keys, g, lane, rows);
      load_tile<KV, DP>(p, p.kv.k, p.kv.k_scale, rows, tid, kr);
    }
    __syncthreads();  // V tile visible; every warp is past this tile's S product (K free)

    if (active) {
#pragma unroll
      for (int k = 0; k < C::BN / 16; ++k)
#pragma unroll
        for (int dp = 0; dp < DP / 16; ++dp) {
          if (dp * 16 >= D) break;
          // Matrices: keys 16k + 0..7 / 8..15 of dims 16dp + 0..7, then of dims + 8..15.
          uint32_t r[4];
          ldsm_x4_trans(r, Vs + (k * 16 + (lane & 15)) * C::LD + dp * 16 + (lane >> 4) * 8);
          const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
          mma_16816(o[2 * dp], pa[k], b0);
          mma_16816(o[2 * dp + 1], pa[k], b1);
        }
    }
  }

  if (!warp_rows) return;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  store_rows(p, o, l0, l1, wi0, gq, tq, h);
}

template <DType KV, int DP>
void launch(const PrefillParams& p, int n_qt, cudaStream_t stream) {
  constexpr size_t smem = Cfg<DP>::kSmem;
  if (smem > 48 * 1024)  // per call: the attribute is per device
    PE_CUDA_CHECK(cudaFuncSetAttribute(prefill_mma_kernel<KV, DP>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  prefill_mma_kernel<KV, DP><<<dim3(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(n_qt)),
                               kThreads, smem, stream>>>(p);
  PE_CUDA_LAUNCH_CHECK();
}

template <DType KV>
void launch_d(const PrefillParams& p, int n_qt, cudaStream_t stream) {
  if (p.D <= 64) launch<KV, 64>(p, n_qt, stream);
  else if (p.D <= 128) launch<KV, 128>(p, n_qt, stream);
  else launch<KV, 256>(p, n_qt, stream);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool attention_prefill_mma_supported(int64_t n_q, const PagedKV& kv) {
  switch (kv.dtype) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::FP8_E4M3: case DType::I8: case DType::NVFP4: break;
    default: return false;
  }
  const int64_t D = kv.head_dim;
  return n_q >= 1 && (n_q + kBM - 1) / kBM <= 65535 && kv.n_kv_heads >= 1 && kv.page_size >= 1 &&
         D >= 8 && D <= kMaxD && D % 8 == 0 && (kv.dtype != DType::NVFP4 || D % kKvFp4Group == 0) &&
         aligned16(kv.k) && aligned16(kv.v);
}

void attention_prefill_mma(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                           const PagedKV& kv, const int32_t* page_table, float scale, const float* gate,
                           float* out, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (n_q <= 0) return;
  if (!attention_prefill_mma_supported(n_q, kv))
    fail(PE_ERR_UNSUPPORTED, "cuda::attention_prefill_mma: unsupported shape (", dtype_name(kv.dtype),
         " cache, head_dim ", kv.head_dim, ", n_q ", n_q, ")");
  if (n_heads % kv.n_kv_heads != 0 || n_heads > 0x7fffffffLL)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::attention_prefill_mma: n_heads must be a multiple of n_kv_heads");
  if (q_start_pos < 0 || q_start_pos + n_q > 0x7fff0000LL || kv.page_size > 0x7fffffffLL)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::attention_prefill_mma: positions must fit int32");
  if (kv_row_scales(kv.dtype, kv.head_dim) && (!kv.k_scale || !kv.v_scale))
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::attention_prefill_mma: ", dtype_name(kv.dtype), " cache without scales");
  PrefillParams p;
  p.q = q;
  p.gate = gate;
  p.out = out;
  p.pt = page_table;
  p.kv = kv;
  p.n_q = static_cast<int>(n_q);
  p.q_start_pos = static_cast<int>(q_start_pos);
  p.n_heads = static_cast<int>(n_heads);
  p.group = static_cast<int>(n_heads / kv.n_kv_heads);
  p.D = static_cast<int>(kv.head_dim);
  p.q_mul = scale * 1.4426950408889634f;
  p.part = nullptr;
  p.splits = 1;
  if (attention_prefill_sm80_applies(kv)) return run_sm80(p, scratch, scratch_bytes, stream);  // attention_prefill_sm80.cu
  const int n_qt = static_cast<int>((n_q + kBM - 1) / kBM);
  switch (kv.dtype) {
    case DType::F32: launch_d<DType::F32>(p, n_qt, stream); break;
    case DType::F16: launch_d<DType::F16>(p, n_qt, stream); break;
    case DType::BF16: launch_d<DType::BF16>(p, n_qt, stream); break;
    case DType::FP8_E4M3: launch_d<DType::FP8_E4M3>(p, n_qt, stream); break;
    case DType::I8: launch_d<DType::I8>(p, n_qt, stream); break;
    default: launch_d<DType::NVFP4>(p, n_qt, stream); break;
  }
}

}  // namespace cuda
}  // namespace pe
