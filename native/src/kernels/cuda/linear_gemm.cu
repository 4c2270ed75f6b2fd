// linear for prefill-sized batches (n > 8 tokens): out[n, rows] = x[n, cols] * W^T on the fp16
// tensor cores, fp32 accumulation.
//
// Block tile 64 tokens x 128 weight rows x 32 k, 8 warps (2 x 4), warp tile 32 x 32. Each k tile
// is loaded from global memory into registers one step ahead (no cp.async on sm_75), converted to
// fp16 (x clamped to +-65504; BF16 -> fp16 exact in the normal range; FP8 * block scale, I8 * row
// scale, NVFP4 * group * global scale rounded to fp16) and stored into a double-buffered shared
// tile (rows padded to 40 halves: ldmatrix without bank conflicts). Fragments come from ldmatrix; the product is mma.sync m16n8k16 on
// sm_80+ and two m16n8k8 on sm_75 (same fragments). Weights are never materialized in fp16 beyond
// one 128 x 32 tile. Shapes with cols % 8 != 0 or unaligned pointers use scalar guarded loads.
#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int BM = 64, BN = 128, BK = 32, LDS = BK + 8, kThreads = 256;

struct Raw {
  uint4 a, b;  // up to 8 raw elements (32 bytes)
  float s;     // FP8 block / I8 row / NVFP4 group * global scale
};

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  lo = fminf(fmaxf(lo, -65504.0f), 65504.0f);
  hi = fminf(fmaxf(hi, -65504.0f), 65504.0f);
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint4 floats_to_half8(const float* f) {
  return make_uint4(pack_half2(f[0], f[1]), pack_half2(f[2], f[3]), pack_half2(f[4], f[5]),
                    pack_half2(f[6], f[7]));
}

// Raw bits of 8 weights at (row, k) .. (row, k+7); VEC: aligned and in bounds (row < rows).
template <DType DT, bool VEC>
__device__ __forceinline__ Raw load_w(const WeightView& w, int64_t row, int64_t k) {
  Raw r;
  r.s = 1.0f;
  if constexpr (VEC) {
    if (row >= w.rows || k >= w.cols) {  // cols % 8 == 0: a group is all in or all out
      r.a = r.b = make_uint4(0, 0, 0, 0);
      return r;
    }
    const int64_t i = row * w.cols + k;
    if constexpr (DT == DType::F32) {
      r.a = *reinterpret_cast<const uint4*>(static_cast<const float*>(w.data) + i);
      r.b = *reinterpret_cast<const uint4*>(static_cast<const float*>(w.data) + i + 4);
    } else if constexpr (DT == DType::I8) {
      const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const int8_t*>(w.data) + i);
      r.a = make_uint4(v.x, v.y, 0, 0);
      r.s = w.row_scale[row];
    } else if constexpr (DT == DType::NVFP4) {  // 8 e2m1 values = 4 bytes, one 16-value group
      r.a = make_uint4(static_cast<const uint32_t*>(w.data)[i >> 3], 0, 0, 0);
      r.s = e4m3_to_f32(w.group_scale[i >> 4]) * w.global_scale;
    } else if constexpr (DT == DType::FP8_E4M3) {
      const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(w.data) + i);
      r.a = make_uint4(v.x, v.y, 0, 0);
      const int64_t ncb = (w.cols + w.block - 1) / w.block;
      r.s = w.block_scale[(row / w.block) * ncb + k / w.block] * 256.0f;
    } else {
      r.a = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w.data) + i);
    }
  } else {  // decoded to fp32 here (scale applied), treated as F32 by convert_w
    float f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
      f[e] = (row < w.rows && k + e < w.cols) ? weight_elem(w, row, k + e) : 0.0f;
    r.a = *reinterpret_cast<const uint4*>(f);
    r.b = *reinterpret_cast<const uint4*>(f + 4);
  }
  return r;
}

template <DType DT, bool VEC>
__device__ __forceinline__ uint4 convert_w(const Raw& r) {
  if constexpr (!VEC || DT == DType::F32) {
    float f[8];
    *reinterpret_cast<uint4*>(f) = r.a;
    *reinterpret_cast<uint4*>(f + 4) = r.b;
    return floats_to_half8(f);
  } else if constexpr (DT == DType::F16) {
    return r.a;
  } else if constexpr (DT == DType::I8) {
    float f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
      f[e] = static_cast<float>(static_cast<int8_t>((e < 4 ? r.a.x : r.a.y) >> (8 * (e & 3)))) * r.s;
    return floats_to_half8(f);
  } else if constexpr (DT == DType::NVFP4) {
    float f[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // pair i holds nibbles i and i + 4, value * 2^-14
      const float2 p = __half22float2(as_h2(i == 0   ? e2m1x2_to_h2<0>(r.a.x)
                                            : i == 1 ? e2m1x2_to_h2<1>(r.a.x)
                                            : i == 2 ? e2m1x2_to_h2<2>(r.a.x)
                                                     : e2m1x2_to_h2<3>(r.a.x)));
      f[i] = p.x * (r.s * 16384.0f);
      f[i + 4] = p.y * (r.s * 16384.0f);
    }
    return floats_to_half8(f);
  } else if constexpr (DT == DType::BF16) {
    const uint32_t u[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
    float f[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      f[2 * e] = __uint_as_float(u[e] << 16);
      f[2 * e + 1] = __uint_as_float(u[e] & 0xffff0000u);
    }
    return floats_to_half8(f);
  } else {
    const uint32_t u[2] = {r.a.x, r.a.y};
    float f[8];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float2 lo = __half22float2(fp8x2_to_half2_div256(u[e]));
      const float2 hi = __half22float2(fp8x2_to_half2_div256(u[e] >> 16));
      f[4 * e] = lo.x * r.s;
      f[4 * e + 1] = lo.y * r.s;
      f[4 * e + 2] = hi.x * r.s;
      f[4 * e + 3] = hi.y * r.s;
    }
    return floats_to_half8(f);
  }
}

template <bool VEC>
__device__ __forceinline__ uint4 load_x(const float* x, int64_t n, int64_t cols, int64_t t,
                                        int64_t k) {
  float f[8];
  if (VEC && t < n && k < cols) {
    *reinterpret_cast<float4*>(f) = *reinterpret_cast<const float4*>(x + t * cols + k);
    *reinterpret_cast<float4*>(f + 4) = *reinterpret_cast<const float4*>(x + t * cols + k + 4);
  } else if (VEC) {
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = 0.0f;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = (t < n && k + e < cols) ? x[t * cols + k + e] : 0.0f;
  }
  return floats_to_half8(f);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

template <DType DT, bool VEC>
__global__ void __launch_bounds__(kThreads)
    gemm_kernel(const float* __restrict__ x, int64_t n, WeightView w, float* __restrict__ out) {
  __shared__ __align__(16) __half As[2][BM][LDS];
  __shared__ __align__(16) __half Bs[2][BN][LDS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BM, n0 = static_cast<int64_t>(blockIdx.x) * BN;
  const int64_t cols = w.cols;
  const int lr = tid >> 2, lk = (tid & 3) * 8;  // this thread's load row and k offset
  const int n_k = static_cast<int>((cols + BK - 1) / BK);

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  uint4 xa;
  Raw wr[2];
  auto load = [&](int kt) {
    const int64_t k = static_cast<int64_t>(kt) * BK + lk;
    xa = load_x<VEC>(x, n, cols, m0 + lr, k);
#pragma unroll
    for (int i = 0; i < 2; ++i) wr[i] = load_w<DT, VEC>(w, n0 + lr + 64 * i, k);
  };
  auto store = [&](int buf) {
    *reinterpret_cast<uint4*>(&As[buf][lr][lk]) = xa;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      *reinterpret_cast<uint4*>(&Bs[buf][lr + 64 * i][lk]) = convert_w<DT, VEC>(wr[i]);
  };

  load(0);
  store(0);
  __syncthreads();
  for (int kt = 0; kt < n_k; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < n_k) load(kt + 1);
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
      uint32_t af[2][4], bf[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi], &As[buf][warp_m * 32 + mi * 16 + (lane & 15)][ks + (lane >> 4) * 8]);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, &Bs[buf][warp_n * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3)]
                          [ks + ((lane >> 3) & 1) * 8]);
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_16816(acc[mi][ni], af[mi], bf[ni]);  // linear_common.cuh
    }
    if (kt + 1 < n_k) store(buf ^ 1);
    __syncthreads();
  }
  // Epilogue: c0,c1 at (row g, cols 2t, 2t+1), c2,c3 at row g + 8 (tokens x weight rows).
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t t = m0 + warp_m * 32 + mi * 16 + (lane >> 2) + (e >> 1) * 8;
        const int64_t r = n0 + warp_n * 32 + ni * 8 + (lane & 3) * 2 + (e & 1);
        if (t < n && r < w.rows) out[t * w.rows + r] = acc[mi][ni][e];
      }
}

template <DType DT>
void launch(bool vec, const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t s) {
  const dim3 grid(grid_1d(w.rows, BN), grid_1d(n, BM));
  if (vec) gemm_kernel<DT, true><<<grid, kThreads, 0, s>>>(x, n, w, out);
  else gemm_kernel<DT, false><<<grid, kThreads, 0, s>>>(x, n, w, out);
}

}  // namespace

void linear_gemm(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream) {
  auto al = [](const void* p, int a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; };
  bool vec = w.cols % 8 == 0 && al(x, 16);
  if (w.dtype == DType::FP8_E4M3) vec = vec && al(w.data, 8) && w.block % 8 == 0;
  else if (w.dtype == DType::I8) vec = vec && al(w.data, 8);
  else if (w.dtype == DType::NVFP4) vec = vec && al(w.data, 4);
  else vec = vec && al(w.data, 16);
  if (n > 65535LL * BM) fail(PE_ERR_INVALID_ARGUMENT, "cuda::linear: too many tokens ", n);
  switch (w.dtype) {
    case DType::F32: launch<DType::F32>(vec, x, n, w, out, stream); break;
    case DType::F16: launch<DType::F16>(vec, x, n, w, out, stream); break;
    case DType::BF16: launch<DType::BF16>(vec, x, n, w, out, stream); break;
    case DType::I8: launch<DType::I8>(vec, x, n, w, out, stream); break;
    case DType::NVFP4: launch<DType::NVFP4>(vec, x, n, w, out, stream); break;
    default: launch<DType::FP8_E4M3>(vec, x, n, w, out, stream); break;
  }
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
