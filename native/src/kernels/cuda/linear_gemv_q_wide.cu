// linear for 9..32 tokens (speculative decoding's verify step: 8 sequences x (1 + k) rows) with
// quantized weights (FP8 block scales, I8, NVFP4): out[n, rows] = x[n, cols] * W^T, each weight
// read once and decoded once (the decode GEMV's decoders, chunks and tile layout:
// linear_gemv_q.cu), then fed to one mma per 16 tokens.
//
// Why not the decode GEMV (n <= 8) with more tokens: its A = [x_hi; x_lo] of 8 tokens, so 32
// tokens would take 4x its mmas per decoded weight (16 per FP8 chunk, about the H200's mma.sync
// rate at HBM speed), and each of its blocks (32 rows at most) reads all of x as fp32 from L2: 4
// bytes of x per FP8 weight byte at 32 tokens. Here:
// - A = 16 tokens rounded to fp16 (no lo part; |x| clamped to 65504): the mma.sync GEMM's
//   numerics, its tolerance (cuda_ops.h, 3e-3). NG = 1 (n <= 16) or 2 (n <= 32) token groups,
//   so a decoded B fragment feeds NG mmas (at n <= 16 as many as the decode GEMV's).
// - The 8 warps of a block own different rows (T row groups of 8 each, 64 T rows a block: the
//   decode GEMV's row block per warp, its tile when tiled) and walk the same columns in step, so
//   x is staged once per block, into shared memory as fp16 A fragments, one window at a time: 8
//   chunks of 16 bytes a weight row (128 FP8 / I8 columns = one FP8 scale segment, 256 NVFP4),
//   double-buffered, one barrier a window; the next window's x is loaded from L2 while this one
//   is multiplied. x read from L2 is 1 / (64 T) of x a row: at T = 4, 32 tokens, 0.5 byte per
//   FP8 weight byte.
// - Lane (g, t) streams the chunks of its rows g as in the decode GEMV (a step: C = 8 / T chunks
//   of each of T rows, 4 KB per warp; C / 2 windows a step), decodes each 4 k-pairs at a time
//   (the x quad they meet: one 16-byte shared load per token), and loads the next step's chunks
//   of a window into the same registers once that window is decoded.
// - FP8 block scales (uniform per warp and 128-column window) without a second accumulator:
//   acc = (acc / s + x * w) * s around the window's mmas (two fp32 roundings a window, ~1e-7);
//   a window whose scale is 0 is skipped. I8 row scales and the NVFP4 global scale at the end,
//   NVFP4 group scales on the decoded pairs (exact, linear_common.cuh).
// - Block rows fewer than the GPU's block slots (mlp down: 20 of 256 rows, 136 steps each) split
//   their columns over KS blocks (one wave of blocks, at least kMinSplitSteps steps each): each
//   writes its partial sums to a static scratch, and the last of a block row's KS blocks to
//   finish (a counter) adds them in split order: deterministic, no atomics on the sums.
// No fused epilogue (swiglu, split norm): those stay n <= 8 (linear_swiglu_supported,
// linear_split_norm_supported), their callers take linear + the separate ops above that.
#include <algorithm>

#include "kernels/cuda/linear_gemv_q.cuh"
#include "kernels/cuda/linear_gemv_q_stream_k.cuh"

namespace pe {
namespace cuda {
namespace {

using namespace gemv_q;

constexpr int kThreads = kWarps * 32;
constexpr int kMinSplitSteps = 2;                        // column steps a split block takes at least
constexpr int64_t kWidePartFloats = int64_t(9) << 18;    // split-K scratch: 2.36 M floats (9.4 MB)
constexpr int kMaxBlockRows = 4096;                      // split block rows (counters)
__device__ float g_wide_part[kWidePartFloats];
__device__ int g_wide_count[kMaxBlockRows];

int g_max_tokens = kGemvMaxTokens;  // linear_gemv_set_max_tokens

// One window of x in shared memory: [chunk q < 8][quad u][token] uint4, quad u of chunk q = the 4
// fp16 pairs of its columns 8u .. 8u + 7 in decode order (decode_chunk: FP8 / I8 pair i = columns
// 2i, 2i + 1; NVFP4 i, i + 4). A chunk's pitch is padded by 32 bytes, so the 8 lanes (2 tokens x
// 4 chunks t) of a shared-memory phase hit distinct banks. Staged by kPer items of 8 columns of
// one token a thread (a token's window is contiguous: coalesced loads).
template <DType DT, int NG>
struct XWindow {
  static constexpr int kTok = 16 * NG;
  static constexpr int kQuads = values_per_chunk<DT>() / 8;
  static constexpr int kPitch = kQuads * kTok + 2;
  static constexpr int kSize = 8 * kPitch;
  static constexpr int kItems = 8 * kQuads * kTok;
  static constexpr int kPer = kItems / kThreads;
  static constexpr int kCols = 8 * values_per_chunk<DT>();
  static_assert(kItems % kThreads == 0, "whole items a thread");
};

// fp16x2 of (a, b), |values| clamped to 65504 as the GEMM's x (split_x's first conversion).
__device__ __forceinline__ uint32_t h2_sat(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t h;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %2, %1;" : "=r"(h) : "f"(a), "f"(b));
  return h;
#else
  return as_u32(__floats2half2_rn(fminf(fmaxf(a, -65504.0f), 65504.0f), fminf(fmaxf(b, -65504.0f), 65504.0f)));
#endif
}

// Pairs 4q .. 4q + 3 of a chunk (decode_chunk's order; FP8 by cvt where the GPU has it, its unit
// fp8_decode_unit<true>); gs: NVFP4's group scale of the quad (* 2^7).
template <DType DT>
__device__ __forceinline__ void decode_quad(const uint4& raw, int q, __half2 gs, uint32_t* wh) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (DT == DType::NVFP4) {
    wh[0] = as_u32(__hmul2(as_h2(e2m1x2_to_h2<0>(u[q])), gs));
    wh[1] = as_u32(__hmul2(as_h2(e2m1x2_to_h2<1>(u[q])), gs));
    wh[2] = as_u32(__hmul2(as_h2(e2m1x2_to_h2<2>(u[q])), gs));
    wh[3] = as_u32(__hmul2(as_h2(e2m1x2_to_h2<3>(u[q])), gs));
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t v = u[2 * q + h];
      if constexpr (DT == DType::FP8_E4M3 && kFp8Cvt) {
        e4m3x4_cvt(v, wh[2 * h], wh[2 * h + 1]);
      } else if constexpr (DT == DType::FP8_E4M3) {
        wh[2 * h] = e4m3x2_to_h2<false>(v);
        wh[2 * h + 1] = e4m3x2_to_h2<true>(v);
      } else {
        wh[2 * h] = i8x2_to_h2<false>(v);
        wh[2 * h + 1] = i8x2_to_h2<true>(v);
      }
    }
  }
}

// Block b: block row b / ks (8 warps x 8T rows), column steps [s n_it / ks, (s + 1) n_it / ks),
// s = b % ks. kTiled: w in the GEMV tile layout of 8T rows (whole steps, padded rows).
// kMinBlocks: blocks per SM the registers are budgeted for (2: 128 a thread; run_mb).
template <DType DT, int T, int NG, bool kTiled, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gemv_q_wide_kernel(const float* __restrict__ x, int n, WeightView w, int ks, int seg_per_block,
                       float* __restrict__ out) {
  pdl_trigger();
  using XW = XWindow<DT, NG>;
  constexpr int VPC = values_per_chunk<DT>();
  constexpr int C = 8 / T;          // chunks per row group per step
  constexpr int WPS = C / 2;        // windows per step
  constexpr int KI = step_cols<DT, T>();
  constexpr bool kFp8 = DT == DType::FP8_E4M3;
  static_assert(WPS * XW::kCols == KI, "a step is whole windows");
  __shared__ uint4 xs[2][XW::kSize];
  __shared__ bool last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t rows = w.rows, cols = w.cols;
  const int64_t row_bytes = DT == DType::NVFP4 ? cols / 2 : cols;
  const int n_it = static_cast<int>((cols + KI - 1) / KI);
  const int br = blockIdx.x / ks, split = blockIdx.x % ks;
  const int it0 = static_cast<int>(static_cast<int64_t>(split) * n_it / ks);
  const int it1 = static_cast<int>(static_cast<int64_t>(split + 1) * n_it / ks);
  const int64_t rb = static_cast<int64_t>(br) * kWarps + warp;  // the warp's row block of 8T rows
  const bool active = rb * 8 * T < rows;  // warps past the last row block stage x and wait only
  const int64_t row0 = rb * 8 * T;

  const uint8_t* rowp[T];
  const uint8_t* grow[T];
#pragma unroll
  for (int r = 0; r < T; ++r) {
    const int64_t row = min(row0 + 8 * r + g, rows - 1);  // clamped rows are computed, not written
    rowp[r] = static_cast<const uint8_t*>(w.data) + row * row_bytes;
    grow[r] = DT == DType::NVFP4 ? w.group_scale + row * (cols / 16) : nullptr;
  }
  const uint8_t* tile_base = static_cast<const uint8_t*>(w.data) + rb * n_it * 4096 + lane * 16;
  const float* srow = nullptr;
  if constexpr (kFp8) srow = w.block_scale + (min(row0, rows - 1) / w.block) * ((cols + w.block - 1) / w.block);

  uint4 raw[T][C];
  uint32_t gsc[T][C];
  const auto load_chunk = [&](int r, int c, int it) {
    const int64_t col = static_cast<int64_t>(it) * KI + (c * 4 + t) * VPC;
    raw[r][c] = make_uint4(0, 0, 0, 0);
    gsc[r][c] = 0;
    if (active && (kTiled || col < cols)) {  // cols % VPC == 0: a chunk is all in or all out
      raw[r][c] = load_stream(kTiled ? tile_base + static_cast<int64_t>(it) * 4096 + (r * C + c) * 512
                                     : rowp[r] + (DT == DType::NVFP4 ? col / 2 : col));
      if constexpr (DT == DType::NVFP4) gsc[r][c] = __ldg(reinterpret_cast<const uint16_t*>(grow[r] + col / 16));
    }
  };
  // FP8: window win's block scale (one 128-column segment), in decode units.
  const auto scale_of = [&](int win) -> float {
    if constexpr (kFp8) {
      const bool valid = static_cast<int64_t>(win) * 128 < cols;
      return valid ? load_nc_f32(srow + (seg_per_block == 1 ? win : win / seg_per_block)) * fp8_decode_unit<true>()
                   : 0.0f;
    }
    return 1.0f;
  };
  // x of window win: kPer items of 8 columns (token i / (8 quads), columns from (i % (8 quads)) * 8).
  float4 xf[XW::kPer][2];
  const auto x_load = [&](int win) {
#pragma unroll
    for (int p = 0; p < XW::kPer; ++p) {
      const int i = threadIdx.x + p * kThreads;
      const int token = i / (8 * XW::kQuads);
      const int64_t col = static_cast<int64_t>(win) * XW::kCols + (i % (8 * XW::kQuads)) * 8;
      xf[p][0] = xf[p][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (token < n && col < cols) {
        const float* src = x + static_cast<int64_t>(token) * cols + col;
        xf[p][0] = load_nc_f4(src);
        xf[p][1] = load_nc_f4(src + 4);
      }
    }
  };
  const auto x_store = [&](uint4* dst) {
#pragma unroll
    for (int p = 0; p < XW::kPer; ++p) {
      const int i = threadIdx.x + p * kThreads;
      const int token = i / (8 * XW::kQuads), cq = i % (8 * XW::kQuads);
      const float4 a = xf[p][0], b = xf[p][1];
      uint4 v;
      if constexpr (DT == DType::NVFP4)
        v = make_uint4(h2_sat(a.x, b.x), h2_sat(a.y, b.y), h2_sat(a.z, b.z), h2_sat(a.w, b.w));
      else
        v = make_uint4(h2_sat(a.x, a.y), h2_sat(a.z, a.w), h2_sat(b.x, b.y), h2_sat(b.z, b.w));
      dst[(cq / XW::kQuads) * XW::kPitch + (cq % XW::kQuads) * XW::kTok + token] = v;
    }
  };

  if (it0 < it1) {
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int r = 0; r < T; ++r) load_chunk(r, c, it0);
  }
  pdl_wait();  // x (and the split scratch) only after the previous kernel
  float acc[T][NG][4];
  // FP8: the window's sums in units of its block scale (acc = (acc / s + x w) s).
  auto scale_acc = [&](float f) {
#pragma unroll
    for (int r = 0; r < T; ++r)
#pragma unroll
      for (int j = 0; j < NG; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][j][e] *= f;
  };
#pragma unroll
  for (int r = 0; r < T; ++r)
#pragma unroll
    for (int j = 0; j < NG; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.0f;
  int buf = 0;
  float s_cur = 1.0f;
  if (it0 < it1) {
    x_load(it0 * WPS);
    x_store(xs[0]);
    if (kFp8 && active) s_cur = scale_of(it0 * WPS);
    __syncthreads();
  }
  for (int it = it0; it < it1; ++it) {
#pragma unroll
    for (int h = 0; h < WPS; ++h) {
      const int win = it * WPS + h;
      const bool more = it + 1 < it1 || h + 1 < WPS;
      if (more) x_load(win + 1);
      float s_next = 1.0f;
      if (kFp8 && active && more) s_next = scale_of(win + 1);
      if (active && (!kFp8 || s_cur != 0.0f)) {
        if constexpr (kFp8) scale_acc(1.0f / s_cur);
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int c = 2 * h + cc;
          const uint4* xq = xs[buf] + (4 * cc + t) * XW::kPitch + g;  // the lane's chunk, token g
          __half2 gs[T][2];
          if constexpr (DT == DType::NVFP4) {
#pragma unroll
            for (int r = 0; r < T; ++r) {
              const __half2 s = __hmul2(as_h2(e4m3x2_to_h2<false>(gsc[r][c])), __float2half2_rn(32768.0f));
              gs[r][0] = __low2half2(s);
              gs[r][1] = __high2half2(s);
            }
          }
#pragma unroll
          for (int u = 0; u < XW::kQuads; ++u) {
            uint4 xa[NG][2];  // tokens 16j + g and 16j + 8 + g: A rows g and g + 8
#pragma unroll
            for (int j = 0; j < NG; ++j) {
              xa[j][0] = xq[u * XW::kTok + 16 * j];
              xa[j][1] = xq[u * XW::kTok + 16 * j + 8];
            }
#pragma unroll
            for (int r = 0; r < T; ++r) {
              uint32_t wh[4];
              decode_quad<DT>(raw[r][c], u, DT == DType::NVFP4 ? gs[r][u / 2] : __half2(), wh);
#pragma unroll
              for (int j = 0; j < NG; ++j) {
                const uint32_t a0[4] = {xa[j][0].x, xa[j][1].x, xa[j][0].y, xa[j][1].y};
                const uint32_t b0[2] = {wh[0], wh[1]};
                mma_16816(acc[r][j], a0, b0);
                const uint32_t a1[4] = {xa[j][0].z, xa[j][1].z, xa[j][0].w, xa[j][1].w};
                const uint32_t b1[2] = {wh[2], wh[3]};
                mma_16816(acc[r][j], a1, b1);
              }
            }
          }
        }
        if constexpr (kFp8) scale_acc(s_cur);
      }
      // This window's chunks decoded: the next step's same chunks into their registers.
      if (it + 1 < it1) {
#pragma unroll
        for (int cc = 0; cc < 2; ++cc)
#pragma unroll
          for (int r = 0; r < T; ++r) load_chunk(r, 2 * h + cc, it + 1);
      }
      if (more) x_store(xs[buf ^ 1]);  // read by nobody since the last barrier
      s_cur = s_next;
      buf ^= 1;
      __syncthreads();
    }
  }

  // Split block rows: every part to the scratch; the last block of the row sums them in order.
  // Item (warp, r, j, e, lane): the same thread in every block of the row.
  if (ks > 1) {
    constexpr int kSlot = kWarps * T * NG * 128;
    const auto at = [&](int r, int j, int e) { return ((warp * T + r) * NG + j) * 128 + e * 32 + lane; };
    float* part = g_wide_part + static_cast<int64_t>(blockIdx.x) * kSlot;
#pragma unroll
    for (int r = 0; r < T; ++r)
#pragma unroll
      for (int j = 0; j < NG; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[at(r, j, e)] = acc[r][j][e];
    __threadfence();  // the part is visible before the count
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&g_wide_count[br], 1) == ks - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float* first = g_wide_part + static_cast<int64_t>(br) * ks * kSlot;
#pragma unroll
    for (int r = 0; r < T; ++r)
#pragma unroll
      for (int j = 0; j < NG; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float s = 0.0f;
          for (int k = 0; k < ks; ++k) s += __ldcg(first + static_cast<int64_t>(k) * kSlot + at(r, j, e));
          acc[r][j][e] = s;
        }
    if (threadIdx.x == 0) g_wide_count[br] = 0;  // for the next launch (after its pdl_wait)
  }
  if (!active) return;
  // C[16j + g (+ 8)][rows 2t, 2t + 1] of row group r.
#pragma unroll
  for (int r = 0; r < T; ++r)
#pragma unroll
    for (int j = 0; j < NG; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int token = 16 * j + 8 * (e >> 1) + g;
        const int64_t row = row0 + 8 * r + 2 * t + (e & 1);
        if (token >= n || row >= rows) continue;
        float s = acc[r][j][e];
        if constexpr (DT == DType::I8) s *= w.row_scale[row];
        if constexpr (DT == DType::NVFP4) s *= w.global_scale * 128.0f;
        out[static_cast<int64_t>(token) * rows + row] = s;
      }
}

// The grid: block rows x ks column splits, ks filling one wave of the GPU's blocks (kMinBlocks per
// SM) where the block rows alone leave it part empty (GemvTuning::wide_split forces one), bounded
// by kMinSplitSteps steps a split, the scratch and the counters.
template <DType DT, int T, int NG, bool kTiled, int kMinBlocks>
void run(const float* x, int n, const WeightView& w, float* out, cudaStream_t stream) {
  const int64_t row_blocks = (w.rows + 8 * T - 1) / (8 * T);
  const int64_t block_rows = (row_blocks + kWarps - 1) / kWarps;
  const int64_t n_it = steps_of<DT, T>(w);
  const int64_t slots = static_cast<int64_t>(sm_count()) * kMinBlocks;
  constexpr int64_t kSlot = kWarps * T * NG * 128;
  int64_t ks = g_tuning.wide_split > 0 ? g_tuning.wide_split : slots / block_rows;
  ks = std::min(ks, n_it / kMinSplitSteps);
  ks = std::min(ks, kWidePartFloats / (block_rows * kSlot));
  if (block_rows > kMaxBlockRows) ks = 1;
  ks = std::max<int64_t>(ks, 1);
  const int seg_per_block = DT == DType::FP8_E4M3 ? static_cast<int>(w.block / 128) : 1;
  const bool pdl = pdl_supported() && g_tuning.pdl;
  launch_ex(pdl, gemv_q_wide_kernel<DT, T, NG, kTiled, kMinBlocks>, dim3(static_cast<unsigned>(block_rows * ks)), dim3(kThreads),
            0, stream, x, n, w, static_cast<int>(ks), seg_per_block, out);
}

// The register budget: 2 blocks per SM for 16 tokens (no spills at sm_90); for 32 tokens 2 or 1
// (GemvTuning::wide_min_blocks; at 2 ptxas spills 24..48 bytes for FP8 / I8 at T = 4 and up to
// 272 for NVFP4, whose default is 1: tools/gpu/KERNELS.md).
template <DType DT, int T, bool kTiled>
void run_mb(const float* x, int n, const WeightView& w, float* out, cudaStream_t stream) {
  if (n <= 16) return run<DT, T, 1, kTiled, 2>(x, n, w, out, stream);
  const int mb = g_tuning.wide_min_blocks > 0 ? g_tuning.wide_min_blocks : DT == DType::NVFP4 ? 1 : 2;
  if (mb >= 2) return run<DT, T, 2, kTiled, 2>(x, n, w, out, stream);
  run<DT, T, 2, kTiled, 1>(x, n, w, out, stream);
}

template <DType DT, bool kTiled>
void run_t(int T, const float* x, int n, const WeightView& w, float* out, cudaStream_t stream) {
  if (T >= 4) return run_mb<DT, 4, kTiled>(x, n, w, out, stream);
  if (T >= 2) return run_mb<DT, 2, kTiled>(x, n, w, out, stream);
  run_mb<DT, 1, kTiled>(x, n, w, out, stream);
}

template <DType DT>
void launch(const float* x, int n, const WeightView& w, float* out, cudaStream_t stream) {
  // The rows per warp of the decode GEMV (a tiled weight's layout fixes them): the same row
  // blocks and tiles for both.
  const int T = w.tile ? w.tile / 8 : gemv_rows_per_warp(w.rows);
  if (w.tile) return run_t<DT, true>(T, x, n, w, out, stream);
  run_t<DT, false>(T, x, n, w, out, stream);
}

}  // namespace

void linear_gemv_set_max_tokens(int n) { g_max_tokens = std::clamp(n, 8, kGemvMaxTokens); }
int linear_gemv_max_tokens() { return g_max_tokens; }

void linear_gemv_q_wide(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream) {
  const int nn = static_cast<int>(n);
  switch (w.dtype) {
    case DType::FP8_E4M3: return launch<DType::FP8_E4M3>(x, nn, w, out, stream);
    case DType::I8: return launch<DType::I8>(x, nn, w, out, stream);
    default: return launch<DType::NVFP4>(x, nn, w, out, stream);
  }
}

}  // namespace cuda
}  // namespace pe
