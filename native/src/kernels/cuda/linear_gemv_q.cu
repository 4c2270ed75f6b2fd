// linear for decode-sized batches (n <= 8 tokens) with quantized weights (FP8 e4m3 with block
// scales, I8 with row scales, NVFP4 with group + global scales): out[n, rows] = x[n, cols] * W^T.
//
// Why tensor cores for a GEMV: a fp32 FMA per weight per token plus the decode is ~100 integer
// and FMA instructions per 16-byte load, about what an H200 SM can issue while HBM delivers that
// load (and 8 tokens would need 8x the FMAs). With mma.sync the per-weight cost is the decode
// alone (1.25 - 2.5 instructions per weight, integer ops, no F2F) for any n <= 8.
//
// Layout ("swap AB"): A (16 x k) = [x_hi; x_lo] -- rows 0..7 the tokens rounded to fp16, rows
// 8..15 the fp16 residuals x - x_hi, so the two halves sum to x within ~2^-22 relative (the
// result keeps the fp32 GEMV's 1e-5 tolerance; |x| is clamped to 65504). B (k x 8) = 8 weight
// rows; C[token][row] = hi part, C[8 + token][row] = lo part, added at the end.
// The k order inside an mma is free, so each lane streams its own 16-byte chunk of a weight row
// (ld.global.nc, 16 fp8/int8 or 32 e2m1 values) and feeds it as 8 or 16 k-pairs; lane (g, t) also
// builds the matching x pairs of token g. Chunks of a row are interleaved over the 4 lanes t, so
// 4 lanes read 64 contiguous bytes per step.
// Tiling: a warp owns T groups of 8 rows (T = 4, 2, 1 as the matrix gets shorter, so that the
// grid still fills the GPU; R / 8 for a weight in the GEMV tile layout of R rows, which stores
// each step's chunks contiguously), 8 chunks (128 bytes) per lane in flight per step; the 8 warps of a
// block split the columns and sum through shared memory. Where the row blocks are fewer than the
// GPU's block slots and the rows are long (mlp down: 160 blocks for 264 slots, 136 steps a row),
// stream-K: every slot gets a block and an equal share of the row blocks x column steps (see
// g_stream_part).
// FP8 block scales apply per 128-column segment (block % 128 == 0); I8 row scales and the NVFP4
// global scale apply at the end; NVFP4 group scales multiply the decoded fp16 pairs (exact,
// linear_common.cuh).
// x: with n * cols small enough, the block splits x once into shared memory (StagedX); else each
// warp splits its columns' x in registers at every step.
// Its measured numbers and the tuning's reasons: tools/gpu/KERNELS.md, "Quantized GEMV".
#include <algorithm>
#include <atomic>

#include "kernels/cuda/linear_gemv_q.cuh"
#include "kernels/cuda/linear_gemv_q_split_norm.cuh"
#include "kernels/cuda/linear_gemv_q_stream_k.cuh"

namespace pe {
namespace cuda {
namespace {

using namespace gemv_q;

// Largest staged x any tuning may ask for (the kernels' dynamic shared-memory limit).
constexpr int kStagedXLimit = 128 * 1024;

// The staged kernel's static shared memory besides x: the warps' sums (red), the split norm's 1 / rms,
// partials and x^2 sums (norm_inv, norm_np, sq_rg), swiglu's row-block sums (fin) and the stream-K
// flag.
__host__ __device__ constexpr int64_t red_bytes(int T, bool sw) {
  return kWarps * T * 512 + 32 + kWarps * 128 + T * 32 + (sw ? T * 256 : 4) + 16;
}

// Stream-K scratch (linear_gemv_q_stream_k.cuh): per device and static: the GEMV calls of a
// device run in stream order (every launch of the library is on cuda::stream()), and the
// finisher of a row block resets its counter.
__device__ float g_stream_part[2 * kMaxStreamBlocks * kPartFloats];
// With spin, a published part word is marked (bits ^ kPartMark; zero is empty): a NaN payload no fp32
// operation makes (results that are NaN come out as 0x7fffffff).
constexpr unsigned kPartMark = 0x7fbadbadu;
__device__ int g_stream_count[kMaxStreamRowBlocks];

// kStagedX: the block splits x into hi/lo pairs once, into shared memory (StagedX); otherwise
// every warp splits its columns' x in registers for each row group step (~1/3 of the kernel's
// instructions then; it is issue-bound at 60 % of the issue slots).
// kCvt: FP8 decoded by cvt.rn.f16x2.e4m3x2 on sm_89+ (decode_chunk). kMinBlocks: blocks per SM
// the registers are budgeted for.
// pdl: launched as a programmatic dependent of the previous kernel (sm_90+): the warp's first
// steps (pf_steps of them where tiled, else one) are prefetched into L2 while that kernel still
// runs; x is read and out written after pdl_wait. Every block triggers its dependents at the
// start (pdl_trigger).
// kSwiglu (GemvSwiglu, T >= 2): w holds gate rows [0, inter) and up rows [up0, up0 + inter); row block
// rb is the outputs o0 = 4T rb .. o0 + 4T - 1: row groups r < T / 2 read gate rows o0 + 8r.., the
// others the up rows of the same outputs, and the epilogue writes silu(gate) * up to out[n, inter]
// (the swiglu kernel's math on the same sums: the same bits as linear + swiglu). Whole row blocks.
// ep.norm_* / ep.res_*: the split norm's consumer / producer (linear_gemv_q_split_norm.cuh).
// kRoll: the warp's next step is loaded in two halves, each as soon as this step's same half is
// decoded, so half the loads stay in flight through the math (the same registers); the first
// step is loaded before pdl_wait. Without it a step issues its 8 loads, waits for them, then
// decodes (the next loads wait for the math).
template <DType DT, int T, bool kStagedX, bool kCvt, int kMinBlocks, bool kTiled, bool kSwiglu, bool kRoll>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    gemv_q_kernel(const float* __restrict__ x, int n, WeightView w, int seg_per_block, bool pdl, int pf_steps,
                  int preload, bool spin, int x_early, GemvEpilogue ep, Split sp, float* __restrict__ out) {
  static_assert(!kSwiglu || T >= 2, "swiglu: gate and up row groups in each row block");
  static_assert(T * 64 <= kWarps * 32, "a row block's sums: one per thread at most");
  pdl_trigger();
  constexpr int VPC = values_per_chunk<DT>();
  constexpr int NP = VPC / 2;     // k-pairs per chunk
  constexpr int C = 8 / T;        // chunks per row group per step
  constexpr int KI = step_cols<DT, T>();  // columns per step (4 C VPC)
  constexpr bool kFp8 = DT == DType::FP8_E4M3;
  using SX = StagedX<DT>;
  __shared__ float4 red[kWarps][T][32];
  __shared__ float norm_inv[8];  // the consumer's 1 / rms per token
  __shared__ float norm_np[kWarps * 32];  // its partials, one per thread (split_norm_early)
  __shared__ float sq_rg[T][8];  // the producer's x^2 per row group and token
  __shared__ float fin[kSwiglu ? T * 64 : 1];  // swiglu: the row block's gate and up sums
  static_assert(sizeof(red) + sizeof(norm_inv) + sizeof(norm_np) + sizeof(sq_rg) + sizeof(fin) + 16 == red_bytes(T, kSwiglu),
                "red_bytes: the static shared memory");
  extern __shared__ uint4 xs[];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t rows = w.rows, cols = w.cols;
  constexpr int kOutRows = kSwiglu ? 4 * T : 8 * T;  // outputs per row block
  const int64_t out_rows = kSwiglu ? ep.inter : rows;
  const int64_t row_bytes = DT == DType::NVFP4 ? cols / 2 : cols;
  const int n_it = static_cast<int>((cols + KI - 1) / KI);  // column steps per row block
  // This block's units [u0, u1): row blocks rb_lo (from step k_lo) .. rb_hi (to step k_hi).
  int rb_lo, rb_hi, k_lo, k_hi;
  {
    const int64_t u0 = unit_start(blockIdx.x, sp, gridDim.x), u1 = unit_start(blockIdx.x + 1, sp, gridDim.x);
    rb_lo = static_cast<int>(u0 / n_it), k_lo = static_cast<int>(u0 % n_it);
    rb_hi = static_cast<int>((u1 - 1) / n_it), k_hi = static_cast<int>((u1 - 1) % n_it) + 1;
  }
  const uint8_t* rowp[T];    // row-major: the lane's rows
  const uint8_t* tile_base;  // tiled (w.tile == 8T): the row block's first tile, at the lane's chunk
  const uint8_t* tile_up;    // kSwiglu: its up rows' tile, at their first row group
  const uint8_t* grow[T];    // NVFP4 group scales of the lane's row
  // FP8 block-scale row of the row block: one for its 8T rows (w.block % 128 == 0, row blocks
  // aligned to 8T <= 32; rows past the end are clamped, computed and not written).
  const float* srow = nullptr;
  const float* srow_up = nullptr;  // kSwiglu: the up rows' scale row
  int64_t ncb = 0;
  if constexpr (kFp8) ncb = (cols + w.block - 1) / w.block;
  const auto set_rows = [&](int64_t row0) {  // row0: the row block's first output row
#pragma unroll
    for (int r = 0; r < T; ++r) {
      int64_t row = min(row0 + 8 * r + g, rows - 1);  // clamped rows are computed, not written
      if constexpr (kSwiglu) {
        constexpr int H = T / 2;
        row = (r < H ? 0 : ep.up0) + min(row0 + 8 * (r % H) + g, ep.inter - 1);
      }
      rowp[r] = static_cast<const uint8_t*>(w.data) + row * row_bytes;
      grow[r] = DT == DType::NVFP4 ? w.group_scale + row * (cols / 16) : nullptr;
    }
    const auto tile_at = [&](int64_t row) {  // row % 8 == 0: its row group's chunk of the first step
      return static_cast<const uint8_t*>(w.data) + (row / (8 * T)) * n_it * 4096 + lane * 16 +
             (row % (8 * T)) / 8 * (8 / T) * 512;
    };
    tile_base = tile_at(row0);
    if constexpr (kSwiglu) tile_up = tile_at(ep.up0 + row0);
    if constexpr (kFp8) {
      srow = w.block_scale + (min(row0, out_rows - 1) / w.block) * ncb;
      if constexpr (kSwiglu) srow_up = w.block_scale + ((ep.up0 + min(row0, out_rows - 1)) / w.block) * ncb;
    }
  };
  // The lane's chunk (r, c) of step it (column col): in its row, or in the step's tile.
  // Tiled weights have whole steps only (cols % KI == 0, gemv_tile_rows): no column checks.
  constexpr bool kWhole = kTiled;
  const auto chunk = [&](int r, int c, int it, int64_t col) -> const uint8_t* {
    if constexpr (kTiled && kSwiglu)
      return (r < T / 2 ? tile_base : tile_up) + static_cast<int64_t>(it) * 4096 + ((r % (T / 2)) * C + c) * 512;
    if constexpr (kTiled) return tile_base + static_cast<int64_t>(it) * 4096 + (r * C + c) * 512;
    else return rowp[r] + (DT == DType::NVFP4 ? col / 2 : col);
  };
  set_rows(static_cast<int64_t>(rb_lo) * kOutRows);
  const bool has_x = g < n;
  const float* xrow = x + static_cast<int64_t>(has_x ? g : 0) * cols;
  const int64_t x_pitch = kStagedX ? SX::token_pitch(cols) : 0;
  const unsigned char* xsrow = reinterpret_cast<const unsigned char*>(xs) + (has_x ? g : 0) * x_pitch;
  const int it_first = k_lo + warp;  // this warp's first step
  const int it_end = rb_lo == rb_hi ? k_hi : n_it;
  // The step's weight chunks, NVFP4 group scales and FP8 block scales (kRoll: the next step's).
  uint4 raw[T][C];
  uint32_t gsc[T][C];
  float bsc[(C + 1) / 2] = {}, bsc_up[(C + 1) / 2] = {};
  const auto load_chunk = [&](int r, int c, int it) {
    const int64_t col = static_cast<int64_t>(it) * KI + (c * 4 + t) * VPC;
    raw[r][c] = make_uint4(0, 0, 0, 0);
    gsc[r][c] = 0;
    if (kWhole || col < cols) {  // cols % VPC == 0: a chunk is all in or all out
      raw[r][c] = load_stream(chunk(r, c, it, col));
      if constexpr (DT == DType::NVFP4) gsc[r][c] = __ldg(reinterpret_cast<const uint16_t*>(grow[r] + col / 16));
    }
  };
  const auto load_scales = [&](int it) {
    if constexpr (kFp8) {
#pragma unroll
      for (int s = 0; s < C / 2; ++s) {
        const int seg = it * (KI / 128) + s;  // 128-column segment index
        const bool valid = kWhole || static_cast<int64_t>(seg) * 128 < cols;
        const int cb = seg_per_block == 1 ? seg : seg / seg_per_block;
        bsc[s] = valid ? load_nc_f32(srow + cb) * fp8_decode_unit<kCvt>() : 0.0f;
        if constexpr (kSwiglu) bsc_up[s] = valid ? load_nc_f32(srow_up + cb) * fp8_decode_unit<kCvt>() : 0.0f;
      }
    }
  };
  const auto load_step = [&](int it) {
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int r = 0; r < T; ++r) load_chunk(r, c, it);
    load_scales(it);
  };
  // kRoll, preload: the first step into registers now (the weights do not depend on the previous
  // kernel); without kRoll the step loop then skips its first load.
  bool preloaded = !kRoll && preload > 0 && it_first < it_end;
  bool next_set = false;  // preload >= 2: the row block's rows set and first step loaded already
  if ((kRoll || preloaded) && it_first < it_end) load_step(it_first);
  if (pdl && kTiled) {
    // pf_steps steps into L2 while the previous kernel runs (the weights do not depend on it; kRoll:
    // the first pf_steps but the first, preload: the pf_steps after it, in registers): one 128-byte
    // line per lane of each 4 KB step (swiglu: 2 KB of the gate and 2 KB of the up tile).
    const uint8_t* step0 = tile_base - lane * 16;
    const uint8_t* up_step0 = nullptr;
    if constexpr (kSwiglu) up_step0 = tile_up - lane * 16;
    for (int s = kRoll || preloaded ? 1 : 0; s < pf_steps + (preloaded ? 1 : 0); ++s) {
      const int it = it_first + s * kWarps;
      if (it >= it_end) break;
      if constexpr (kSwiglu) prefetch_l2((lane < 16 ? step0 : up_step0) + static_cast<int64_t>(it) * 4096 + (lane & 15) * 128);
      else prefetch_l2(step0 + static_cast<int64_t>(it) * 4096 + lane * 128);
    }
  } else if (pdl && !kRoll && !preloaded && it_first < it_end) {  // row-major: the lane's chunks of its first step
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t col = static_cast<int64_t>(it_first) * KI + (c * 4 + t) * VPC;
#pragma unroll
      for (int r = 0; r < T; ++r)
        if (col < cols) prefetch_l2(chunk(r, c, it_first, col));
    }
  }
  pdl_wait();
  // The split norm's partials (x_early & 1): loaded now, summed once x is staged (or after the first
  // row block's steps); else (or more than one a thread) summed now by warps 0 .. n-1, which then
  // stage x or start their steps one L2 round trip after the others.
  const bool norm_early = (x_early & 1) && split_norm_early(ep, n, kWarps * 32);
  float norm_part = 0.0f;
  if (norm_early) norm_part = split_norm_load(ep, n);
  else if (ep.norm_partial) split_norm_inv(ep, n, ep.norm_partial, norm_inv);
  if constexpr (kStagedX) {
    // x's chunks (cols % VPC == 0, gemv_q_supported: chunk j at x + j VPC) into StagedX; with
    // x_early & 2 two a thread in flight at once (gate|up's 320 and out_proj's 384 chunks at n = 1
    // took two L2 round trips with one).
    const int64_t n_chunks = cols / VPC, total = n * n_chunks;
    const int per = x_early & 2 ? 2 : 1;
    const auto stage = [&](int64_t j, const float* f) {
      uint32_t xh[NP], xl[NP];
      x_split<DT>(f, xh, xl);
      uint4* dst = reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(xs) + (j / n_chunks) * x_pitch +
                                            (j % n_chunks) * SX::kChunkPitch);
#pragma unroll
      for (int q = 0; q < NP / 2; ++q) dst[q] = make_uint4(xh[2 * q], xl[2 * q], xh[2 * q + 1], xl[2 * q + 1]);
    };
    for (int64_t j = threadIdx.x; j < total; j += per * kWarps * 32) {
      const int64_t j2 = j + kWarps * 32;
      const bool second = per == 2 && j2 < total;
      float f0[VPC], f1[VPC];
      x_load<DT>(x + j * VPC, true, f0);
      x_load<DT>(x + j2 * VPC, second, f1);
      stage(j, f0);
      if (second) stage(j2, f1);
    }
    if (norm_early) norm_np[threadIdx.x] = norm_part;
    __syncthreads();
    if (norm_early) split_norm_inv(ep, n, norm_np, norm_inv);  // read after the epilogue's barrier
  }

  // Row blocks of this block's units, in order: whole (written here) or a part (summed as `spin`
  // says).
  const int n_rb = rb_hi - rb_lo + 1;
#pragma unroll 1
  for (int i = 0; i < n_rb; ++i) {
    const int rb = rb_lo + i;
    const int64_t row0 = static_cast<int64_t>(rb) * kOutRows;
    const int k0 = rb == rb_lo ? k_lo : 0, k1 = rb == rb_hi ? k_hi : n_it;
    if (i != 0 && !next_set) {
      set_rows(row0);
      if (kRoll && k0 + warp < k1) load_step(k0 + warp);
    }
    next_set = false;
    float acc[T][4];
#pragma unroll
    for (int r = 0; r < T; ++r)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][e] = 0.0f;

    for (int it = k0 + warp; it < k1; it += kWarps) {
      const int64_t kb = static_cast<int64_t>(it) * KI;
      const int next = it + kWarps;
      const bool more = kRoll && next < k1;
      if constexpr (!kRoll) {  // all loads of the step first: 8 x 16 bytes per lane in flight
        if (!preloaded) load_step(it);
        preloaded = false;
      }
      float sc[(C + 1) / 2], sc_up[(C + 1) / 2];  // this step's block scales
#pragma unroll
      for (int s = 0; s < (C + 1) / 2; ++s) {
        sc[s] = bsc[s];
        sc_up[s] = bsc_up[s];
      }
      if (more) load_scales(next);
      float tmp[T][4];
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int64_t col = kb + (c * 4 + t) * VPC;
        uint32_t xh[NP], xl[NP];
        if constexpr (kStagedX) {
          const uint4* src = reinterpret_cast<const uint4*>(xsrow + (col / VPC) * SX::kChunkPitch);
#pragma unroll
          for (int q = 0; q < NP / 2; ++q) {
            const uint4 v = has_x && (kWhole || col < cols) ? src[q] : make_uint4(0, 0, 0, 0);
            xh[2 * q] = v.x; xl[2 * q] = v.y; xh[2 * q + 1] = v.z; xl[2 * q + 1] = v.w;
          }
        } else {
          x_pairs<DT>(xrow + col, has_x && (kWhole || col < cols), xh, xl);
        }
#pragma unroll
        for (int r = 0; r < T; ++r) {
          uint32_t wh[NP];
          decode_chunk<DT, kCvt>(raw[r][c], gsc[r][c], wh);
          if constexpr (kFp8) {  // per 128-column segment: tmp, then * block scale
            if (c % 2 == 0) {
#pragma unroll
              for (int e = 0; e < 4; ++e) tmp[r][e] = 0.0f;
            }
#pragma unroll
            for (int p = 0; p < NP; p += 2) {
              const uint32_t a[4] = {xh[p], xl[p], xh[p + 1], xl[p + 1]};
              const uint32_t b[2] = {wh[p], wh[p + 1]};
              mma_16816(tmp[r], a, b);
            }
            if (c % 2 == 1) {
#pragma unroll
              for (int e = 0; e < 4; ++e)
                acc[r][e] = fmaf(tmp[r][e], kSwiglu && r >= T / 2 ? sc_up[c / 2] : sc[c / 2], acc[r][e]);
            }
          } else {
#pragma unroll
            for (int p = 0; p < NP; p += 2) {
              const uint32_t a[4] = {xh[p], xl[p], xh[p + 1], xl[p + 1]};
              const uint32_t b[2] = {wh[p], wh[p + 1]};
              mma_16816(acc[r], a, b);
            }
          }
        }
        // kRoll: once a half of the step is decoded, that half's loads of the next step go out
        // together (issued chunk by chunk they are slower).
        if (more && (c == C / 2 - 1 || c == C - 1)) {
#pragma unroll
          for (int h = c + 1 - C / 2; h <= c; ++h)
#pragma unroll
            for (int r = 0; r < T; ++r) load_chunk(r, h, next);
        }
      }
    }

    // Sum the warps' column slices; C[token g][rows 2t, 2t+1] = hi (c0, c1) + lo (c2, c3).
#pragma unroll
    for (int r = 0; r < T; ++r) red[warp][r][lane] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    // preload >= 2: the next row block's first step in flight while this one's sums are made (a
    // stream-K part's publication takes L2 round trips); its step loop then skips that load.
    if (preload >= 2 && i + 1 < n_rb) {
      const int rb_next = rb + 1;  // not rb_lo: from step 0
      set_rows(static_cast<int64_t>(rb_next) * kOutRows);
      if (warp < (rb_next == rb_hi ? k_hi : n_it)) {
        load_step(warp);
        preloaded = !kRoll;
      }
      next_set = true;
    }
    if (!kStagedX && norm_early && i == 0) norm_np[threadIdx.x] = norm_part;
    __syncthreads();
    if (!kStagedX && norm_early && i == 0) {  // the 1 / rms before the first outputs
      split_norm_inv(ep, n, norm_np, norm_inv);
      __syncthreads();
    }
    const bool whole = k0 == 0 && k1 == n_it;
    // A split row block's sums. Without spin: each block's part to its slot (block, first or second
    // row block), summed by the last of them to finish (a counter). With spin (the grid resident at
    // once): summed by its first block (k0 == 0; its last row block), from the later blocks' parts,
    // which they publish at once as words marked nonzero (kPartMark), each waited for by its reader.
    // Every slot read is zeroed (so the next spinning launch finds them empty).
    float* const part = g_stream_part + (2 * blockIdx.x + (rb == rb_lo ? 0 : 1)) * kPartFloats;
    float sq = 0.0f;      // the producer's new x^2 of this thread's output
    bool stored = whole;  // this block has the row block's sums (and writes its outputs)
    const bool first_sums = spin && !whole && k0 == 0;  // holds its own part: `own`
    float own = 0.0f;
    // Sum idx of the row block, whole: to its output (swiglu: to fin, for the pairs below).
    const auto finish = [&](int idx, float s) {
      if constexpr (kSwiglu) {
        fin[idx] = s;
      } else {
        const int r = idx >> 6, l = (idx >> 1) & 31, j = idx & 1;
        const int token = l >> 2;
        const int64_t row = row0 + 8 * r + 2 * (l & 3) + j;
        if (token >= n || row >= rows) return;
        if constexpr (DT == DType::I8) s *= w.row_scale[row];
        if constexpr (DT == DType::NVFP4) s *= w.global_scale * 128.0f;
        sq = store_output(ep, norm_inv, token, row, rows, s, out);
      }
    };
    for (int idx = threadIdx.x; idx < T * 64; idx += kWarps * 32) {
      const int r = idx >> 6, l = (idx >> 1) & 31, j = idx & 1;
      float s = 0.0f;
#pragma unroll
      for (int wp = 0; wp < kWarps; ++wp) {
        const float4 v = red[wp][r][l];
        s += j ? v.y + v.w : v.x + v.z;
      }
      if (whole) finish(idx, s);
      else if (first_sums) own = s;
      else if (spin) st_relaxed_gpu(reinterpret_cast<unsigned*>(part) + idx, __float_as_uint(s) ^ kPartMark);
      else part[idx] = s;
    }
    if (!whole && spin) {
      if (first_sums) {  // the later blocks publish and go on
        const int64_t b_last = block_of_unit((static_cast<int64_t>(rb) + 1) * n_it - 1, sp, gridDim.x);
        for (int idx = threadIdx.x; idx < T * 64; idx += kWarps * 32) {
          float s = 0.0f + own;  // the same order as the counter's sum below: block b_first first
          for (int64_t b = blockIdx.x + 1; b <= b_last; ++b) {
            unsigned* const slot = reinterpret_cast<unsigned*>(g_stream_part + 2 * b * kPartFloats) + idx;
            s += __uint_as_float(wait_nonzero(slot) ^ kPartMark);
            st_relaxed_gpu(slot, 0u);
          }
          finish(idx, s);
        }
        stored = true;
      }
    } else if (!whole) {
      __shared__ bool last;
      const int64_t nb = gridDim.x;
      const int64_t b_first = block_of_unit(static_cast<int64_t>(rb) * n_it, sp, nb);
      const int64_t b_last = block_of_unit((static_cast<int64_t>(rb) + 1) * n_it - 1, sp, nb);
      __threadfence();  // this block's part is visible before its count
      __syncthreads();
      if (threadIdx.x == 0) last = atomicAdd(&g_stream_count[rb], 1) == static_cast<int>(b_last - b_first);
      __syncthreads();
      if (last) {
        __threadfence();
        for (int idx = threadIdx.x; idx < T * 64; idx += kWarps * 32) {
          float s = 0.0f;
          for (int64_t b = b_first; b <= b_last; ++b) {  // b's first row block or its last?
            float* const slot = g_stream_part + (2 * b + (rb == unit_start(b, sp, nb) / n_it ? 0 : 1)) * kPartFloats + idx;
            s += __ldcg(slot);
            *slot = 0.0f;
          }
          finish(idx, s);
        }
        if (threadIdx.x == 0) g_stream_count[rb] = 0;
      }
      stored = last;
    }
    if constexpr (kSwiglu) {  // silu(gate) * up of the row block's 4T outputs
      __syncthreads();         // fin
      for (int idx = threadIdx.x; stored && idx < T * 32; idx += kWarps * 32) {
        const int l = (idx >> 1) & 31, j = idx & 1, r = idx >> 6;
        float sg = fin[idx], su = fin[idx + (T / 2) * 64];
        const int token = l >> 2;
        const int64_t o = row0 + 8 * r + 2 * (l & 3) + j;
        if (token >= n || o >= ep.inter) continue;
        if constexpr (DT == DType::I8) {
          sg *= w.row_scale[o];
          su *= w.row_scale[ep.up0 + o];
        }
        if constexpr (DT == DType::NVFP4) {
          sg *= w.global_scale * 128.0f;
          su *= w.global_scale * 128.0f;
        }
        if (ep.norm_partial) {
          sg *= norm_inv[token];
          su *= norm_inv[token];
        }
        out[static_cast<int64_t>(token) * ep.inter + o] = silu_f(sg) * su;
      }
    } else if (ep.res_x && stored) {
      add_norm_partial<T>(ep, n, rb, static_cast<int>((rows + kOutRows - 1) / kOutRows), sq, sq_rg);
    }
    __syncthreads();  // red (and fin) are rewritten by the next row block
  }
}

// Returns the row blocks (the producer's partials per token, GemvEpilogue::res_partial).
template <DType DT, int T, bool kStagedX, bool kCvt, int kMinBlocks, bool kTiled, bool kSwiglu, bool kRoll>
int run(const float* x, int n, const WeightView& w, const GemvEpilogue& ep, int seg_per_block, float* out,
         int64_t xbytes, cudaStream_t stream) {
  auto* kernel = gemv_q_kernel<DT, T, kStagedX, kCvt, kMinBlocks, kTiled, kSwiglu, kRoll>;
  if constexpr (kStagedX) {
    static std::atomic<uint64_t> attr_set{0};  // per device: the dynamic shared-memory limit raised
    int dev = 0;
    PE_CUDA_CHECK(cudaGetDevice(&dev));
    const uint64_t bit = uint64_t(1) << (dev & 63);
    if (!(attr_set.load() & bit)) {  // kStagedXLimit, or what the device's opt-in leaves (sm_75: 64 KB)
      const int limit = static_cast<int>(std::min<int64_t>(kStagedXLimit, smem_optin() - red_bytes(T, kSwiglu)));
      PE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
      attr_set |= bit;
    }
  }
  const bool pdl = pdl_supported() && g_tuning.pdl;  // the library's sm_90 code (device.cu)
  const Plan p = plan_grid(g_tuning, row_blocks_of<DT, T>(w, ep), steps_of<DT, T>(w),
                           static_cast<int64_t>(sm_count()) * kMinBlocks, kSwiglu);
  // Stream-K's spinning sum only where the whole grid is resident at once (a block waits for later
  // ones): at least min(kMinBlocks, what shared memory allows) blocks per SM.
  const int64_t per_sm = std::min<int64_t>(kMinBlocks, smem_per_sm() / (red_bytes(T, kSwiglu) + xbytes + 1024));
  const bool spin = g_tuning.stream_k_spin && p.grid != p.row_blocks && p.grid <= per_sm * sm_count();
  launch_ex(pdl, kernel, dim3(static_cast<unsigned>(p.grid)), dim3(kWarps * 32), static_cast<size_t>(xbytes), stream,
            x, n, w, seg_per_block, pdl, g_tuning.pdl_prefetch_steps, g_tuning.preload, spin, g_tuning.x_early, ep, p.sp,
            out);
  return static_cast<int>(p.row_blocks);
}

// The register budget (2 or 3 blocks per SM; 3 only for staged x: the register path spills) and
// the FP8 decode (kCvt only for FP8).
template <DType DT, int T, bool kTiled, bool kSwiglu, bool kRoll>
int run_t(const float* x, int n, const WeightView& w, const GemvEpilogue& ep, int seg_per_block, float* out,
           int64_t xbytes, bool staged, cudaStream_t stream) {
  const bool cvt = DT == DType::FP8_E4M3 && g_tuning.fp8_cvt;
  const bool mb3 = staged && g_tuning.min_blocks >= 3;
  constexpr int kMb3 = kSwiglu ? 2 : 3;  // swiglu: 2 blocks per SM only (fewer kernels to build)
  if constexpr (DT == DType::FP8_E4M3) {
    if (cvt) {
      if (!staged) return run<DT, T, false, true, 2, kTiled, kSwiglu, kRoll>(x, n, w, ep, seg_per_block, out, 0, stream);
      if (mb3) return run<DT, T, true, true, kMb3, kTiled, kSwiglu, kRoll>(x, n, w, ep, seg_per_block, out, xbytes, stream);
      return run<DT, T, true, true, 2, kTiled, kSwiglu, kRoll>(x, n, w, ep, seg_per_block, out, xbytes, stream);
    }
  }
  (void)cvt;
  if (!staged) return run<DT, T, false, false, 2, kTiled, kSwiglu, kRoll>(x, n, w, ep, seg_per_block, out, 0, stream);
  if (mb3) return run<DT, T, true, false, kMb3, kTiled, kSwiglu, kRoll>(x, n, w, ep, seg_per_block, out, xbytes, stream);
  return run<DT, T, true, false, 2, kTiled, kSwiglu, kRoll>(x, n, w, ep, seg_per_block, out, xbytes, stream);
}

template <DType DT, bool kTiled, bool kSwiglu, bool kRoll>
int run_rows(int T, const float* x, int n, const WeightView& w, const GemvEpilogue& ep, int seg_per_block, float* out,
              int64_t xbytes, bool staged, cudaStream_t stream) {
  if (T >= 4) return run_t<DT, 4, kTiled, kSwiglu, kRoll>(x, n, w, ep, seg_per_block, out, xbytes, staged, stream);
  if (kSwiglu || T >= 2) return run_t<DT, 2, kTiled, kSwiglu, kRoll>(x, n, w, ep, seg_per_block, out, xbytes, staged, stream);
  if constexpr (!kSwiglu) return run_t<DT, 1, kTiled, false, kRoll>(x, n, w, ep, seg_per_block, out, xbytes, staged, stream);
  return 0;  // not reached: swiglu takes T >= 2
}

template <DType DT>
int launch(const float* x, int n, const WeightView& w, const GemvEpilogue& ep, float* out, cudaStream_t stream) {
  // Rows per warp: 32 (x pairs amortized over 4 row groups) unless that leaves fewer than
  // ~130 blocks: on the H200 (T = 1, 2, 4 forced on every 27B shape, x in registers) T = 4 is
  // the fastest or within noise from 4224 rows up, T = 1 below 2048 (k/v_proj).
  const int seg_per_block = DT == DType::FP8_E4M3 ? static_cast<int>(w.block / 128) : 1;
  const int64_t xbytes = StagedX<DT>::bytes(n, w.cols);
  // A tiled weight's layout fixes T (its tiles are the steps of T row groups).
  const int T = ep.inter > 0 ? swiglu_rows_per_warp(w) : w.tile ? w.tile / 8 : gemv_rows_per_warp(w.rows);
  // Staged up to the tuning's size, kStagedXLimit and what a block of the device may hold (sm_75: 64 KB).
  bool staged = xbytes <= std::min<int64_t>(g_tuning.staged_x_max_bytes, kStagedXLimit) &&
                xbytes + red_bytes(T, ep.inter > 0) <= smem_optin();
  // FP8 by cvt at 32 rows per warp: x in registers where the launch of the staged kernel takes
  // more than one wave (GemvTuning::fp8_stage_one_wave; run_t's register budget).
  if (DT == DType::FP8_E4M3 && g_tuning.fp8_cvt && g_tuning.fp8_stage_one_wave && T >= 4 && staged) {
    const int64_t slots = static_cast<int64_t>(sm_count()) * (g_tuning.min_blocks >= 3 && ep.inter == 0 ? 3 : 2);
    const int64_t rb = row_blocks_of<DT, 4>(w, ep);
    const bool balanced = g_tuning.fp8_stage_one_wave >= 2 &&
                          plan_grid(g_tuning, rb, steps_of<DT, 4>(w), slots, ep.inter > 0).grid <= slots;
    staged = rb <= slots || balanced;
  }
  // Rolled loads (kRoll) for tiled weights only (the layer weights of a quantized model); which
  // dtypes: GemvTuning::roll.
  const bool roll = g_tuning.roll >= 2 || (g_tuning.roll == 1 && DT == DType::I8);
  if (ep.inter > 0) {
    if (w.tile && roll) return run_rows<DT, true, true, true>(T, x, n, w, ep, seg_per_block, out, xbytes, staged, stream);
    if (w.tile) return run_rows<DT, true, true, false>(T, x, n, w, ep, seg_per_block, out, xbytes, staged, stream);
    return run_rows<DT, false, true, false>(T, x, n, w, ep, seg_per_block, out, xbytes, staged, stream);
  }
  if (w.tile && roll) return run_rows<DT, true, false, true>(T, x, n, w, ep, seg_per_block, out, xbytes, staged, stream);
  if (w.tile) return run_rows<DT, true, false, false>(T, x, n, w, ep, seg_per_block, out, xbytes, staged, stream);
  return run_rows<DT, false, false, false>(T, x, n, w, ep, seg_per_block, out, xbytes, staged, stream);
}

}  // namespace

int linear_gemv_q(const float* x, int64_t n, const WeightView& w, const GemvEpilogue& ep, float* out,
                  cudaStream_t stream) {
  const int nn = static_cast<int>(n);
  switch (w.dtype) {
    case DType::FP8_E4M3: return launch<DType::FP8_E4M3>(x, nn, w, ep, out, stream);
    case DType::I8: return launch<DType::I8>(x, nn, w, ep, out, stream);
    default: return launch<DType::NVFP4>(x, nn, w, ep, out, stream);
  }
}

}  // namespace cuda
}  // namespace pe
