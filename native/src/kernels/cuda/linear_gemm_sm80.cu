// linear for prefill-sized batches on sm_80+ (linear_gemm_set_variant(1), cuda_ops.h): the math of
// linear_gemm.cu (x clamped to +-65504 and rounded to fp16, weights decoded by the same convert_w,
// mma.sync m16n8k16 with fp32 accumulation, the same grouped tile order), fed by cp.async.
//
// Block tile BM tokens x 256 weight rows x 32 k, 8 warps (2 x 4), warp tile BM/2 x 64: each B
// fragment feeds BM/32 mmas, each A fragment 8 (linear_gemm.cu: 4), and x is converted once per
// 256 weight rows (there: 128). BM = 128 from big_tile_tokens tokens (every dtype), else 64.
// Per k tile: the raw bytes (x fp32, weights as stored) go by cp.async into a ring of kStages
// slots, issued kStages tiles ahead of their conversion; each thread converts exactly the chunks it
// copied (its own wait_group makes them visible: no barrier on the ring), into a double-buffered
// fp16 tile read by ldmatrix; one __syncthreads per k tile. The conversion of tile kt + 1 sits
// between the two k16 steps of tile kt and after them, so its ALU work issues while the tensor
// pipe runs; the scales of tile kt + 1 (FP8 block, NVFP4 group) load before the products of kt.
// Shared memory 2 x (BM + 256) x 40 halves + kStages x (BM x 32 x 4 + 256 x 32 x weight bytes):
// 156 KB at BM = 128 for FP8/I8 (4 stages) and BF16/F16 (3), 140 KB NVFP4; one block per SM.
// Not taken (linear_gemm.cu's kernel runs them): F32 weights (a test format, 32-byte chunks),
// shapes off the vector path, devices whose opt-in shared memory is smaller (sm_86/89: 99 KB),
// and code JIT-compiled from PTX below compute_80 (its kernel body is empty).
#include <algorithm>
#include <atomic>

#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int BN = 256, BK = 32, LDS = BK + 8, kThreads = 256;

// Bytes of 8 weights: a thread's unit of copy and conversion (a "chunk").
template <DType DT>
constexpr int kChunkBytes = DT == DType::NVFP4 ? 4 : (DT == DType::FP8_E4M3 || DT == DType::I8) ? 8 : 16;
template <DType DT>
constexpr int kStages = kChunkBytes<DT> <= 8 ? 4 : 3;  // ring <= 96 KB: 156 KB in all fits the A100

// Byte offsets in the dynamic shared memory. The ring is laid out per thread ([slot][chunk][thread]):
// consecutive threads touch consecutive bytes, so copies and reads have no bank conflicts.
template <DType DT, int BM>
struct Layout {
  static constexpr int kXChunks = BM / 64;  // x chunks (8 floats = 2 x 16 bytes) per thread and tile
  static constexpr int kA = 0;                                   // __half [2][BM][LDS]
  static constexpr int kB = kA + 2 * BM * LDS * 2;               // __half [2][BN][LDS]
  static constexpr int kRawX = kB + 2 * BN * LDS * 2;            // uint4 [stage][2 * kXChunks][kThreads]
  static constexpr int kRawW = kRawX + kStages<DT> * 2 * kXChunks * kThreads * 16;  // [stage][4][kThreads]
  static constexpr int kBytes = kRawW + kStages<DT> * 4 * kThreads * kChunkBytes<DT>;
};

template <DType DT, int BM>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm80_kernel(const float* __restrict__ x, int64_t n, WeightView w, float* __restrict__ out, int num_n,
                     int group_m) {
#if __CUDA_ARCH__ >= 800
  using L = Layout<DT, BM>;
  constexpr int S = kStages<DT>, CB = kChunkBytes<DT>, XC = L::kXChunks, MI = BM / 32;
  extern __shared__ __align__(16) uint8_t smem[];
  auto As = reinterpret_cast<__half(*)[BM][LDS]>(smem + L::kA);
  auto Bs = reinterpret_cast<__half(*)[BN][LDS]>(smem + L::kB);
  uint4* raw_x = reinterpret_cast<uint4*>(smem + L::kRawX);
  uint8_t* raw_w = smem + L::kRawW;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  const int num_m = static_cast<int>((n + BM - 1) / BM);  // tile order: see linear_gemm.cu
  const int per_group = group_m * num_n, gid = static_cast<int>(blockIdx.x) / per_group;
  const int first_m = gid * group_m, gsize = min(num_m - first_m, group_m);
  const int in_group = static_cast<int>(blockIdx.x) - gid * per_group;
  const int64_t m0 = static_cast<int64_t>(first_m + in_group % gsize) * BM;
  const int64_t n0 = static_cast<int64_t>(in_group / gsize) * BN;
  const int64_t cols = w.cols;
  const int n_k = static_cast<int>((cols + BK - 1) / BK);

  // This thread's chunks of every k tile (k = kt * BK + lk): x rows m0 + lr + 64 j, weight rows
  // n0 + lr + 64 i (as linear_gemm.cu, with 4 weight rows).
  const int lr = tid >> 2, lk = (tid & 3) * 8;
  const float* xrow[XC];
  bool xin[XC];
#pragma unroll
  for (int j = 0; j < XC; ++j) {
    const int64_t t = m0 + lr + 64 * j;
    xin[j] = t < n;
    xrow[j] = x + (xin[j] ? t : 0) * cols;
  }
  const uint8_t* wrow[4];
  bool win[4];
  float wscale[4];   // of the tile being converted: I8 row scales (fixed), FP8 block * 256, NVFP4 group
  int64_t sidx[4];   // FP8: first block scale of the row's block row; NVFP4: first group of the row
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = n0 + lr + 64 * i, srow = min(row, w.rows - 1);
    win[i] = row < w.rows;
    wrow[i] = static_cast<const uint8_t*>(w.data) + (win[i] ? row : 0) * cols * CB / 8;
    wscale[i] = 1.0f;
    sidx[i] = 0;
    if constexpr (DT == DType::I8) wscale[i] = w.row_scale[srow];
    if constexpr (DT == DType::FP8_E4M3) sidx[i] = (srow / w.block) * ((cols + w.block - 1) / w.block);
    if constexpr (DT == DType::NVFP4) sidx[i] = srow * (cols / 16);
  }
  const uint32_t block = static_cast<uint32_t>(DT == DType::FP8_E4M3 ? w.block : 1);

  auto issue = [&](int kt, int slot) {  // cp.async of tile kt into ring slot `slot`; zeros outside
    const int64_t k = static_cast<int64_t>(kt) * BK + lk;
    const bool kin = k < cols;
#pragma unroll
    for (int j = 0; j < XC; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool in = xin[j] && kin;
        cp_async<16>(&raw_x[(slot * 2 * XC + 2 * j + h) * kThreads + tid], in ? xrow[j] + k + 4 * h : x, in);
      }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool in = win[i] && kin;
      cp_async<CB>(raw_w + ((slot * 4 + i) * kThreads + tid) * CB, in ? wrow[i] + k * CB / 8 : w.data, in);
    }
  };
  auto load_scales = [&](int kt) {  // of tile kt, into wscale (the same values as load_w)
    const int64_t k = static_cast<int64_t>(kt) * BK + lk;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (DT == DType::FP8_E4M3)
        wscale[i] = k < cols ? w.block_scale[sidx[i] + static_cast<uint32_t>(k) / block] * 256.0f : 0.0f;
      if constexpr (DT == DType::NVFP4)
        wscale[i] = win[i] && k < cols ? e4m3_to_f32(w.group_scale[sidx[i] + k / 16]) * w.global_scale : 0.0f;
    }
  };
  auto convert_x = [&](int slot, int buf) {
#pragma unroll
    for (int j = 0; j < XC; ++j) {
      float f[8];
      *reinterpret_cast<uint4*>(f) = raw_x[(slot * 2 * XC + 2 * j) * kThreads + tid];
      *reinterpret_cast<uint4*>(f + 4) = raw_x[(slot * 2 * XC + 2 * j + 1) * kThreads + tid];
      *reinterpret_cast<uint4*>(&As[buf][lr + 64 * j][lk]) = floats_to_half8(f);
    }
  };
  auto convert_weights = [&](int slot, int buf) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint8_t* p = raw_w + ((slot * 4 + i) * kThreads + tid) * CB;
      GemmRaw r;
      r.b = make_uint4(0, 0, 0, 0);
      r.s = wscale[i];
      if constexpr (CB == 16) r.a = *reinterpret_cast<const uint4*>(p);
      else if constexpr (CB == 8) r.a = make_uint4(reinterpret_cast<const uint2*>(p)->x, reinterpret_cast<const uint2*>(p)->y, 0, 0);
      else r.a = make_uint4(*reinterpret_cast<const uint32_t*>(p), 0, 0, 0);
      *reinterpret_cast<uint4*>(&Bs[buf][lr + 64 * i][lk]) = convert_w<DT, true>(r);
    }
  };

  float acc[MI][8][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  auto products = [&](int buf, int ks) {  // one k16 step of the warp tile
    uint32_t af[MI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
      ldmatrix_x4(af[mi], &As[buf][warp_m * (BM / 2) + mi * 16 + (lane & 15)][ks + (lane >> 4) * 8]);
#pragma unroll
    for (int np = 0; np < 4; ++np) {  // b[0..1]: n8 tile 2 np, b[2..3]: 2 np + 1
      uint32_t b[4];
      ldmatrix_x4(b, &Bs[buf][warp_n * 64 + np * 16 + (lane & 7) + ((lane >> 4) << 3)][ks + ((lane >> 3) & 1) * 8]);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        mma_16816(acc[mi][2 * np], af[mi], b);
        mma_16816(acc[mi][2 * np + 1], af[mi], b + 2);
      }
    }
  };

  // Ring: tile t lives in slot t % S. One commit per tile (empty past the end) keeps
  // "wait until S - 1 groups are in flight" equal to "tile kt + 1 has landed".
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (s < n_k) issue(s, s);
    cp_async_commit();
  }
  if constexpr (DT != DType::I8) load_scales(0);
  cp_async_wait<S - 1>();
  convert_x(0, 0);
  convert_weights(0, 0);
  __syncthreads();
  for (int kt = 0; kt < n_k; ++kt) {
    const int buf = kt & 1, next_slot = (kt + 1) % S;
    const bool more = kt + 1 < n_k;
    if (kt + S < n_k) issue(kt + S, kt % S);  // slot of tile kt: converted last iteration
    cp_async_commit();
    if constexpr (DT == DType::FP8_E4M3 || DT == DType::NVFP4)
      if (more) load_scales(kt + 1);
    products(buf, 0);
    if (more) {
      cp_async_wait<S - 1>();
      convert_x(next_slot, buf ^ 1);
    }
    products(buf, 16);
    if (more) convert_weights(next_slot, buf ^ 1);
    __syncthreads();
  }

  // Epilogue: c0,c1 at (token g, rows 2t, 2t+1), c2,c3 at token g + 8; float2 stores where aligned.
  const bool pairs = (w.rows & 1) == 0 && (reinterpret_cast<uintptr_t>(out) & 7) == 0;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t t = m0 + warp_m * (BM / 2) + mi * 16 + (lane >> 2) + h * 8;
        const int64_t r = n0 + warp_n * 64 + ni * 8 + (lane & 3) * 2;
        if (t >= n) continue;
        float* o = out + t * w.rows + r;
        if (pairs && r < w.rows) {
          *reinterpret_cast<float2*>(o) = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
        } else if (!pairs) {
          if (r < w.rows) o[0] = acc[mi][ni][2 * h];
          if (r + 1 < w.rows) o[1] = acc[mi][ni][2 * h + 1];
        }
      }
#endif
}

template <DType DT, int BM>
bool launch_tiles(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream) {
  constexpr int smem = Layout<DT, BM>::kBytes;
  // Per device (bit = ordinal): looked at, and runnable (body compiled for compute_80+, enough
  // opt-in shared memory, the limit raised).
  static std::atomic<uint64_t> checked{0}, runnable{0};
  int dev = 0;
  PE_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(checked.load() & bit)) {
    cudaFuncAttributes attr;
    PE_CUDA_CHECK(cudaFuncGetAttributes(&attr, gemm_sm80_kernel<DT, BM>));
    int optin = 0;
    PE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (attr.ptxVersion >= 80 && optin >= smem) {
      PE_CUDA_CHECK(cudaFuncSetAttribute(gemm_sm80_kernel<DT, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      runnable |= bit;
    }
    checked |= bit;
  }
  if (!(runnable.load() & bit)) return false;
  const int64_t num_n = grid_1d(w.rows, BN), num_m = grid_1d(n, BM);
  if (num_n * num_m > 0x7fffffffLL) fail(PE_ERR_INVALID_ARGUMENT, "cuda::linear: too many tiles");
  const int64_t group_m = std::clamp<int64_t>((int64_t(16) << 20) / (int64_t(BM) * w.cols * 4), 1, num_m);
  gemm_sm80_kernel<DT, BM><<<static_cast<unsigned>(num_n * num_m), kThreads, smem, stream>>>(
      x, n, w, out, static_cast<int>(num_n), static_cast<int>(group_m));
  PE_CUDA_LAUNCH_CHECK();
  return true;
}

template <DType DT>
bool launch(const float* x, int64_t n, const WeightView& w, int64_t big_tile_tokens, float* out, cudaStream_t s) {
  return n >= big_tile_tokens ? launch_tiles<DT, 128>(x, n, w, out, s) : launch_tiles<DT, 64>(x, n, w, out, s);
}

}  // namespace

// Called by linear_gemm (linear_gemm.cu) for the vector path only (cols % 8 == 0, aligned
// pointers, FP8 block % 8 == 0): a chunk of 8 weights is all inside the matrix or all outside.
bool linear_gemm_sm80(const float* x, int64_t n, const WeightView& w, int64_t big_tile_tokens, float* out,
                      cudaStream_t stream) {
  switch (w.dtype) {
    case DType::F16: return launch<DType::F16>(x, n, w, big_tile_tokens, out, stream);
    case DType::BF16: return launch<DType::BF16>(x, n, w, big_tile_tokens, out, stream);
    case DType::I8: return launch<DType::I8>(x, n, w, big_tile_tokens, out, stream);
    case DType::NVFP4: return launch<DType::NVFP4>(x, n, w, big_tile_tokens, out, stream);
    case DType::FP8_E4M3: return launch<DType::FP8_E4M3>(x, n, w, big_tile_tokens, out, stream);
    default: return false;  // F32: linear_gemm.cu
  }
}

}  // namespace cuda
}  // namespace pe
