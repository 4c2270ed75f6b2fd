// Causal GQA prefill attention on sm_80+ (A100 .. H200) for F16 / BF16 caches: the math, the fp16
// roundings and the outputs of attention_prefill_mma.cu (read its header), with the tiles and the
// copy engine that sm_75 lacks. attention_prefill_mma takes this kernel where
// attention_prefill_sm80_applies (cuda_ops.h).
//
// Block = 128 consecutive queries of ONE q head, 8 warps of 16 query rows (grid: heads x query
// tiles, the longest tiles first, the heads of a GQA group neighbours: their K/V tiles are L2
// hits). Per block, for each tile of 64 keys (0 .. the block's last position):
//   K and V rows copied from the paged cache to shared memory by cp.async (16 bytes a copy,
//   straight from the page table's rows; keys past the block's last position and columns past
//   head_dim zero-filled by the copy); BF16 tiles converted to fp16 in place by the thread that
//   copied them (exact in fp16's normal range, clamped to +-65504, as the sm_75 kernel does);
//   S = Q K^T by m16n8k16 (fp16 in, fp32 accumulate), the causal mask on diagonal tiles, the
//   online softmax in fp32 (log2 domain), P -> fp16 A fragments, O += P V (ldmatrix.trans),
//   exactly as the sm_75 kernel; at the end O / l, times sigmoid(gate), fp32 out.
// Pipeline (design decision): K and V double-buffered, ONE barrier per tile. At the top of tile
// i every thread waits for its own copies of tile i, then the barrier makes them (and Q) visible
// and proves every warp is past tile i - 1, whose buffers then take tile i + 1's copies, issued
// before tile i's products: each tile's loads have a whole tile of math (~2 x 4.2 MFLOP a block)
// to land in; the page-table reads of a tile's rows are issued a tile earlier still. The sm_75
// kernel moves 16 keys per two barriers, through registers.
// Why 128 x 64 tiles: a warp reads the whole K and V tile per tile (and its Q fragments, unless
// held in registers), so shared-memory reads per mma fall with the keys per tile (Q's share) and
// L2 reads per mma with the queries per block; 128 queries halve the sm_75 kernel's L2 traffic.
// Registers: O of 16 rows x Dp in fp32 = Dp / 2 per thread (128 at Dp 256), S 32, P 16: one block
// of 8 warps per SM (launch bounds 256 x 1). Q fragments stay in registers for Dp <= 128 (32 more),
// are reloaded from shared memory each tile at 256. (Rows of a block = (query, head) pairs of a
// GQA group would not cut these reads: a tile serves as many rows either way.)
// Shared memory (opt-in): Q [128][Dp+8] + 2 x (K, V) [64][Dp+8] fp16, rows padded by 8 halves
// (ldmatrix and the 16-byte copies conflict free): Dp 64 -> 54 KB, 128 -> 102 KB, 256 -> 198 KB
// (H100 / H200: 227 KB; A100's 163 KB takes Dp <= 128, the sm_75 kernel runs the rest).
// Key split (flash-decoding style; design decision): a chunk of few query tiles at depth (the
// stall-free scheduler's 128 .. 512 queries at 8K .. 32K: 48 .. 96 blocks of 1 per SM on 132 SMs)
// would leave the GPU part idle, so run_sm80 may cut each query tile's tiles into S contiguous
// parts (grid z; split_rule below, attention_prefill_set_splits). A part runs the same loop over
// its tiles only and stores its unnormalized state (m, l in the log2 domain, O) to scratch;
// attn::attention_combine (the decode kernels' combine, same layout) merges the parts, divides
// and gates. Rows a part does not reach keep m = -inf, l = 0, O = 0 (weight 0 in the combine; part
// 0 holds key 0, which every row sees). Unsplit, the output is the kernel's own, as before.
// Accuracy: that of the sm_75 kernel, bit for bit in the operands (the same fp16 values of Q * scale,
// K, V and P); the sums differ in order only (64-key tiles, m16n8k16). Split, P is rounded to fp16
// against each part's running max instead: within that rounding of the unsplit output.
#include <algorithm>
#include <atomic>

#include "kernels/cuda/attention_decode.cuh"  // attn::attention_combine
#include "kernels/cuda/attention_prefill.cuh"
#include "kernels/cuda/linear_common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#pragma nv_diag_suppress 177  // the kernel's body is compiled for sm_80+ only: its helpers go unused here
#endif

namespace pe {
namespace cuda {
namespace prefill {
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32, kBM = kWarps * 16, kBN = 64;

template <int DP>
struct Cfg {
  static constexpr int LD = DP + 8;             // shared row stride in halves
  static constexpr int CPR = DP / 8;            // 16-byte chunks per row
  static constexpr int RPP = kThreads / CPR;    // key rows per pass of the block
  static constexpr int CHUNKS = kBN / RPP;      // chunks per thread per K (or V) tile
  static constexpr int NT = kBN / 8;            // n tiles of S per warp
  static constexpr int RR = kBN / 32;           // cache rows held per lane
  static constexpr int kTile = kBN * LD;        // halves of one K or V buffer
  static constexpr bool kQRegs = DP <= 128;     // Q fragments held in registers
  static constexpr size_t kSmem = static_cast<size_t>(kBM + 4 * kBN) * LD * sizeof(__half);
  static_assert(CHUNKS * RPP == kBN && 32 % RPP == 0, "tile shape");
};

// cp.async exists from sm_80; the kernel's body is compiled there only.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// Lane l resolves the cache rows of keys t0 + l + 32 r (r < RR), -1 past n_keys: the page-table
// loads of the tile after next, issued a tile before issue_tile needs them.
template <int DP>
__device__ __forceinline__ void tile_rows(const PrefillParams& p, int t0, int n_keys, int g, int lane,
                                          int64_t (&rows)[Cfg<DP>::RR]) {
#pragma unroll
  for (int r = 0; r < Cfg<DP>::RR; ++r) {
    const int t = t0 + lane + 32 * r;
    rows[r] = t < n_keys ? cache_row(p, t, g) : -1;
  }
}

// Issues this thread's copies of the K and V tile whose rows tile_rows resolved into Kb / Vb:
// chunk i is key j = i * RPP + tid / CPR (its row shuffled from lane j % 32), values
// c * 8 .. c * 8 + 7 with c = tid % CPR. Missing keys and columns past head_dim: zeros.
template <int DP>
__device__ __forceinline__ void issue_tile(const PrefillParams& p, const int64_t (&rows)[Cfg<DP>::RR], int tid,
                                           __half* Kb, __half* Vb) {
  using C = Cfg<DP>;
  const int c = tid % C::CPR;
  const int64_t rb = 2 * static_cast<int64_t>(p.D);  // bytes of a 16-bit cache row
  const bool col = c * 8 < p.D;
  const uint8_t* kbase = static_cast<const uint8_t*>(p.kv.k);
  const uint8_t* vbase = static_cast<const uint8_t*>(p.kv.v);
#pragma unroll
  for (int i = 0; i < C::CHUNKS; ++i) {
    const int j = i * C::RPP + tid / C::CPR;
    const int64_t row = __shfl_sync(0xffffffffu, rows[(i * C::RPP) / 32], j & 31);
    const bool ok = row >= 0 && col;
    const int64_t off = ok ? row * rb + c * 16 : 0;
    cp_async16(Kb + j * C::LD + c * 8, kbase + off, ok ? 16 : 0);
    cp_async16(Vb + j * C::LD + c * 8, vbase + off, ok ? 16 : 0);
  }
  cp_async_commit();
}

// BF16 -> fp16 in place, of the chunks issue_tile gave this thread (after its wait: its own
// copies are visible to it).
template <int DP>
__device__ __forceinline__ void bf16_tile_to_f16(int tid, __half* buf) {
  using C = Cfg<DP>;
  const int c = tid % C::CPR;
#pragma unroll
  for (int i = 0; i < C::CHUNKS; ++i) {
    uint4* ptr = reinterpret_cast<uint4*>(buf + (i * C::RPP + tid / C::CPR) * C::LD + c * 8);
    const uint4 w = *ptr;
    auto cvt = [](uint32_t u) { return half2_bits(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u)); };
    *ptr = make_uint4(cvt(w.x), cvt(w.y), cvt(w.z), cvt(w.w));
  }
}

template <int DP, bool BF16>
__global__ void __launch_bounds__(kThreads, 1) prefill_sm80_kernel(PrefillParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using C = Cfg<DP>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* Qs = reinterpret_cast<__half*>(smem_raw);
  __half* KV = Qs + kBM * C::LD;  // buffer b: K at KV + 2b kTile, V at KV + (2b + 1) kTile

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;  // fragment row group / thread in quad
  const int h = blockIdx.x, g = h / p.group;
  const int i0 = (gridDim.y - 1 - blockIdx.y) * kBM;  // longest query tiles first
  const int D = p.D;
  const int n_keys = p.q_start_pos + min(i0 + kBM, p.n_q);  // the block's keys (>= 1)
  // Key split: part blockIdx.z of splits takes tiles [it0, it1) of the block's (as many tiles
  // each, the last part fewer; parts past the keys none: they write empty states).
  const int n_all = (n_keys + kBN - 1) / kBN, per_part = (n_all + p.splits - 1) / p.splits;
  const int it0 = min(n_all, static_cast<int>(blockIdx.z) * per_part), it1 = min(n_all, it0 + per_part);

  int64_t rows[C::RR];  // cache rows of the next tile to issue
  if (it0 < it1) {
    tile_rows<DP>(p, it0 * kBN, n_keys, g, lane, rows);
    issue_tile<DP>(p, rows, tid, KV, KV + C::kTile);  // in flight during the Q staging
    tile_rows<DP>(p, (it0 + 1) * kBN, n_keys, g, lane, rows);
  }

  // Q * scale * log2(e) as fp16 (zero rows past n_q, zero columns past head_dim).
  stage_q<kBM, C::CPR, C::LD>(p, Qs, i0, h, D, tid, kThreads);

  // This warp's rows: queries i0 + 16 warp + (gq, gq + 8).
  const int wi0 = i0 + 16 * warp;
  const bool warp_rows = wi0 < p.n_q;
  const int pos_first = p.q_start_pos + wi0;                       // warp's first row
  const int pos_last = p.q_start_pos + min(wi0 + 15, p.n_q - 1);  // warp's last real row
  const int pos0 = pos_first + gq, pos1 = pos0 + 8;                // this thread's rows
  const int n_ks = min(DP, (D + 15) & ~15) / 16;                    // k steps of 16 dims with data

  float o[DP / 8][4];
#pragma unroll
  for (int d = 0; d < DP / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  uint32_t qf[C::kQRegs ? DP / 16 : 1][4];  // Q fragments (Dp <= 128)

  for (int it = it0; it < it1; ++it) {
    const int t0 = it * kBN;
    __half* Ks = KV + ((it - it0) & 1) * 2 * C::kTile;  // the part's first tile in buffer 0
    __half* Vs = Ks + C::kTile;
    cp_async_wait_all();
    if constexpr (BF16) {
      bf16_tile_to_f16<DP>(tid, Ks);
      bf16_tile_to_f16<DP>(tid, Vs);
    }
    __syncthreads();  // tile it (and Q) visible; every warp is past tile it - 1 (its buffers free)
    if (it + 1 < it1) {
      __half* Kn = KV + ((it + 1 - it0) & 1) * 2 * C::kTile;
      issue_tile<DP>(p, rows, tid, Kn, Kn + C::kTile);
      tile_rows<DP>(p, t0 + 2 * kBN, n_keys, g, lane, rows);
    }
    if constexpr (C::kQRegs) {
      if (it == it0) {
#pragma unroll
        for (int ks = 0; ks < DP / 16; ++ks)
          ldsm_x4(qf[ks], Qs + (warp * 16 + (lane & 15)) * C::LD + ks * 16 + (lane >> 4) * 8);
      }
    }
    // Warp-uniform: does any of this warp's rows see a key of this tile?
    if (!warp_rows || t0 > pos_last) continue;

    float s[C::NT][4];
#pragma unroll
    for (int n = 0; n < C::NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < DP / 16; ++ks) {
      if (ks >= n_ks) break;
      uint32_t a[4];
      if constexpr (C::kQRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = qf[ks][e];
      } else {
        ldsm_x4(a, Qs + (warp * 16 + (lane & 15)) * C::LD + ks * 16 + (lane >> 4) * 8);
      }
#pragma unroll
      for (int np = 0; np < kBN / 16; ++np) {
        uint32_t r[4];
        ldsm_x4(r, Ks + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * C::LD + ks * 16 + ((lane >> 3) & 1) * 8);
        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
        mma_16816(s[2 * np], a, b0);
        mma_16816(s[2 * np + 1], a, b1);
      }
    }
    softmax_tile(s, o, m0, m1, l0, l1, t0, kBN, pos_first, pos0, pos1, tq);
    // P as A fragments of k steps of 16 keys (the C layout of n tiles 2k, 2k+1), then O += P V.
#pragma unroll
    for (int k = 0; k < kBN / 16; ++k) {
      const uint32_t pa[4] = {half2_bits(s[2 * k][0], s[2 * k][1]), half2_bits(s[2 * k][2], s[2 * k][3]),
                              half2_bits(s[2 * k + 1][0], s[2 * k + 1][1]),
                              half2_bits(s[2 * k + 1][2], s[2 * k + 1][3])};
#pragma unroll
      for (int dp = 0; dp < DP / 16; ++dp) {
        if (dp >= n_ks) break;
        // Matrices: keys 16k + 0..7 / 8..15 of dims 16dp + 0..7, then of dims + 8..15.
        uint32_t r[4];
        ldsm_x4_trans(r, Vs + (k * 16 + (lane & 15)) * C::LD + dp * 16 + (lane >> 4) * 8);
        const uint32_t v0[2] = {r[0], r[1]}, v1[2] = {r[2], r[3]};
        mma_16816(o[2 * dp], pa, v0);
        mma_16816(o[2 * dp + 1], pa, v1);
      }
    }
  }

  if (!warp_rows) return;
  finish_rows(p, o, m0, m1, l0, l1, wi0, gq, tq, h);
#else
  (void)p;  // never launched: run_sm80 only where the device runs sm_80+ code (sm80_code)
#endif
}

int padded_dim(int64_t D) { return D <= 64 ? 64 : D <= 128 ? 128 : 256; }

size_t smem_bytes(int dp) {
  return dp == 64 ? Cfg<64>::kSmem : dp == 128 ? Cfg<128>::kSmem : Cfg<256>::kSmem;
}

// Whether the current device runs this build's sm_80+ code: a device of compute capability >= 8.0
// may still run sm_75 PTX (a "75;90" build on an A100), where the kernel is empty.
bool sm80_code() {
  static std::atomic<int> known[64] = {};
  return per_device(known, [] {
    cudaFuncAttributes a;
    PE_CUDA_CHECK(cudaFuncGetAttributes(&a, prefill_sm80_kernel<64, false>));
    return a.ptxVersion >= 80 && a.binaryVersion >= 80;
  });
}

std::atomic<int> g_variant{2};
std::atomic<int> g_splits{0};  // attention_prefill_set_splits: 0 the rule below, 1 none, n exactly n

// Blocks of the kernel resident per SM (1 at Dp 256 on an H100: 198 KB of shared memory), per
// device and Dp; the F16 kernel stands for both (same shared memory, launch bounds 256 x 1).
template <int DP>
int resident_blocks() {
  static std::atomic<int> known[64] = {};
  int dev = 0;
  PE_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < 64;
  int v = cached ? known[dev].load(std::memory_order_relaxed) : 0;
  if (v > 0) return v;
  PE_CUDA_CHECK(cudaFuncSetAttribute(prefill_sm80_kernel<DP, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(Cfg<DP>::kSmem)));
  PE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, prefill_sm80_kernel<DP, false>, kThreads,
                                                              Cfg<DP>::kSmem));
  v = std::max(v, 1);
  if (cached) known[dev].store(v, std::memory_order_relaxed);
  return v;
}

int resident(int dp) {
  return dp == 64 ? resident_blocks<64>() : dp == 128 ? resident_blocks<128>() : resident_blocks<256>();
}

template <int DP, bool BF16>
void launch(const PrefillParams& p, cudaStream_t stream) {
  launch_blocks(prefill_sm80_kernel<DP, BF16>, Cfg<DP>::kSmem, kThreads, kBM, p, stream);
}

template <bool BF16>
void launch_d(const PrefillParams& p, cudaStream_t stream) {
  switch (padded_dim(p.D)) {
    case 64: return launch<64, BF16>(p, stream);
    case 128: return launch<128, BF16>(p, stream);
    default: return launch<256, BF16>(p, stream);
  }
}

// Key split rule (design decision). Blocks run one 64-key tile after another at a near-constant
// rate, a part of T tiles costs ~T + kPartOverheadTiles (Q staging, the pipeline's fill, the
// partial state's store, the combine), and the grid runs in waves of SMs x resident blocks: of the
// splits S <= kMaxSplits whose parts keep >= kMinPartTiles tiles (of the longest query tile) and
// whose grid is at most 3 waves (the scratch: S x n_q x heads <= 3 x wave x 128 rows of head_dim +
// 2 floats, 52 MB at head_dim 256 on 132 SMs), the one of least ceil(heads x query tiles x S /
// wave) x (ceil(tiles / S) + kPartOverheadTiles), taken only where it beats no split by 10 %.
// Grids of >= 2 waves (whole prompts, long chunks) run unsplit: their query tiles' lengths
// differ (the causal triangle) and the GPU fills anyway. The overhead is fitted to the 27B shape
// (24 heads, head_dim 256) on an H100 (132 SMs x 1 block; `bench_kernels --only attn_prefill`,
// F16): 512 queries at 32K 4 parts 2.44 ms against 2.79 unsplit, 256 at 32K 8 parts 1.27 against
// 2.80, 128 at 32K 11 parts 0.64 against 2.83, but 512 at 8K 4 parts 0.90 against 0.74 and at 4K
// 0.65 against 0.40 (an overhead of 2 tiles split those): with 16, 512 queries split only from
// ~16K keys, 128 / 256 at 32K into 5 / 8 parts.
constexpr int kMaxSplits = 16, kMinPartTiles = 16, kPartOverheadTiles = 16;

int split_rule(int64_t n_q, int64_t q_start_pos, int64_t n_heads, int dp) {
  const int64_t n_qt = (n_q + kBM - 1) / kBM, blocks = n_heads * n_qt;
  const int64_t wave = static_cast<int64_t>(sm_count()) * resident(dp);
  if (blocks >= 2 * wave) return 1;
  const int64_t tiles = (q_start_pos + n_q + kBN - 1) / kBN;
  auto cost = [&](int64_t s) { return (blocks * s + wave - 1) / wave * ((tiles + s - 1) / s + kPartOverheadTiles); };
  int best = 1;
  int64_t best_cost = cost(1) * 9 / 10;  // a split must beat none by 10 %
  for (int s = 2; s <= kMaxSplits; ++s) {
    if ((tiles + s - 1) / s < kMinPartTiles || blocks * s > 3 * wave) break;
    if (cost(s) < best_cost) {
      best = s;
      best_cost = cost(s);
    }
  }
  return best;
}

}  // namespace

int sm80_splits(int64_t n_q, int64_t q_start_pos, int64_t n_heads, int64_t head_dim) {
  if (n_q <= 0 || n_heads <= 0 || head_dim < 1 || head_dim > 256) return 1;
  const int forced = g_splits.load(std::memory_order_relaxed);
  if (forced >= 1) return forced;
  return split_rule(n_q, q_start_pos, n_heads, padded_dim(head_dim));
}

size_t sm80_part_bytes(int splits, int64_t n_q, int64_t n_heads, int64_t head_dim) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(splits) * n_q * n_heads * (head_dim + 2) * sizeof(float);
}

void run_sm80(const PrefillParams& p0, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  PrefillParams p = p0;
  p.splits = sm80_splits(p.n_q, p.q_start_pos, p.n_heads, p.D);
  // Scratch short of the parts (sized under another rule or setting): as many parts as it holds,
  // none below 2.
  const size_t per_split = sm80_part_bytes(2, p.n_q, p.n_heads, p.D) / 2;
  if (!scratch) p.splits = 1;
  else if (sm80_part_bytes(p.splits, p.n_q, p.n_heads, p.D) > scratch_bytes)
    p.splits = static_cast<int>(std::min<size_t>(scratch_bytes / per_split, static_cast<size_t>(p.splits)));
  if (p.splits < 2) p.splits = 1;
  p.part = p.splits > 1 ? static_cast<float*>(scratch) : nullptr;
#if PE_WITH_SM90A
  if (attention_prefill_sm90_applies(p.kv)) launch_sm90(p, stream);  // attention_prefill_sm90.cu
  else
#endif
  if (p.kv.dtype == DType::BF16) launch_d<true>(p, stream);
  else launch_d<false>(p, stream);
  if (p.splits > 1)
    attn::attention_combine(p.part, p.splits, static_cast<int64_t>(p.n_q) * p.n_heads, p.D, p.gate, p.out, stream);
}

}  // namespace prefill

size_t attention_prefill_scratch_bytes(int64_t n_q, int64_t q_start_pos, int64_t n_heads, int64_t head_dim) {
  // attention_prefill_sm80_applies without the cache dtype and the variant (either may change
  // after the sizing).
  if (n_q < 1 || n_heads < 1 || head_dim < 8 || head_dim > 256 || head_dim % 8 != 0 || compute_capability() < 80)
    return 0;
  if (prefill::smem_bytes(prefill::padded_dim(head_dim)) > static_cast<size_t>(smem_optin()) || !prefill::sm80_code())
    return 0;
  return prefill::sm80_part_bytes(prefill::sm80_splits(n_q, q_start_pos, n_heads, head_dim), n_q, n_heads, head_dim);
}

void attention_prefill_set_splits(int splits) {
  prefill::g_splits.store(std::clamp(splits, 0, prefill::kMaxSplits), std::memory_order_relaxed);
}

void attention_prefill_set_variant(int variant) {
  prefill::g_variant.store(std::clamp(variant, 0, kAttentionPrefillVariants - 1), std::memory_order_relaxed);
}

bool attention_prefill_sm80_applies(const PagedKV& kv) {
  if (prefill::g_variant.load(std::memory_order_relaxed) == 0) return false;
  if (kv.dtype != DType::F16 && kv.dtype != DType::BF16) return false;
  if (kv.head_dim < 1 || kv.head_dim > 256 || compute_capability() < 80) return false;
  return prefill::smem_bytes(prefill::padded_dim(kv.head_dim)) <= static_cast<size_t>(smem_optin()) &&
         prefill::sm80_code();
}

bool attention_prefill_sm90_built() {
#if PE_WITH_SM90A
  return true;
#else
  return false;
#endif
}

bool attention_prefill_sm90_applies(const PagedKV& kv) {
#if PE_WITH_SM90A
  if (prefill::g_variant.load(std::memory_order_relaxed) < 2) return false;
  if (kv.dtype != DType::F16 && kv.dtype != DType::BF16) return false;
  if (kv.head_dim < 1 || kv.head_dim > 256 || compute_capability() != 90) return false;
  return prefill::sm90_smem_bytes(kv.head_dim) <= static_cast<size_t>(smem_optin()) && prefill::sm90_code();
#else
  (void)kv;
  return false;
#endif
}

}  // namespace cuda
}  // namespace pe
