// Paged KV cache write: k, v [n, n_kv_heads, head_dim] fp32 -> the cache rows of positions
// start_pos + i (row (page_table[t / page_size] * page_size + t % page_size) * n_kv_heads + head),
// encoded with kv_codec.cuh so the bytes and scales equal the CPU kv_write's.
// One warp per (token, kv head, K or V) row: the I8 row max is a warp reduction and an NVFP4
// group of 16 values is 8 consecutive lanes (one byte each), reduced with 3 shuffles.
#include "kernels/cuda/kv_codec.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kWarps = 4;

template <DType KV>
__device__ void encode_row(const float* __restrict__ src, int D, uint8_t* __restrict__ dst,
                           float* __restrict__ scales, int lane) {
  if constexpr (KV == DType::F32) {
    for (int e = lane; e < D; e += 32) reinterpret_cast<float*>(dst)[e] = src[e];
  } else if constexpr (KV == DType::F16) {
    for (int e = lane; e < D; e += 32)
      reinterpret_cast<uint16_t*>(dst)[e] = __half_as_ushort(__float2half_rn(src[e]));
  } else if constexpr (KV == DType::BF16) {
    for (int e = lane; e < D; e += 32) reinterpret_cast<uint16_t*>(dst)[e] = kv_enc_bf16(src[e]);
  } else if constexpr (KV == DType::FP8_E4M3) {
    for (int e = lane; e < D; e += 32) dst[e] = kv_enc_fp8(src[e]);
  } else if constexpr (KV == DType::I8) {
    float m = 0.0f;
    for (int e = lane; e < D; e += 32) m = fmaxf(m, fabsf(src[e]));
    m = warp_max(m);
    const float s = __fdiv_rn(m, 127.0f);
    const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
    for (int e = lane; e < D; e += 32) {
      const float x = fminf(fmaxf(__fmul_rn(src[e], inv), -127.0f), 127.0f);
      dst[e] = static_cast<uint8_t>(static_cast<int8_t>(__float2int_rn(x)));
    }
    if (lane == 0) scales[0] = s;
  } else {  // NVFP4: lane owns byte b (values 2b, 2b+1); the loop bound is uniform for shuffles
    const int n_bytes = D / 2;
    for (int b0 = 0; b0 < n_bytes; b0 += 32) {
      const int b = b0 + lane;
      const bool active = b < n_bytes;
      const float x0 = active ? src[2 * b] : 0.0f, x1 = active ? src[2 * b + 1] : 0.0f;
      float m = fmaxf(fabsf(x0), fabsf(x1));
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      const float s = __fdiv_rn(m, 6.0f);
      const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
      if (active) {
        dst[b] = static_cast<uint8_t>(kv_enc_fp4(__fmul_rn(x0, inv)) | (kv_enc_fp4(__fmul_rn(x1, inv)) << 4));
        if ((b & 7) == 0) scales[b / 8] = s;
      }
    }
  }
}

template <DType KV>
__global__ void __launch_bounds__(kWarps * 32)
    kv_write_kernel(PagedKV kv, const int32_t* __restrict__ pt, int64_t start_pos, int64_t n,
                    const float* __restrict__ k, const float* __restrict__ v) {
  pdl_wait();  // launched as a programmatic dependent (launch_pdl)
  pdl_trigger();
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t H = kv.n_kv_heads;
  if (task >= n * H * 2) return;  // whole warps exit together
  const bool is_v = task & 1;
  const int64_t i = task / (2 * H), h = (task / 2) % H;
  const int D = static_cast<int>(kv.head_dim);
  const int64_t t = start_pos + i;
  const int64_t row = (static_cast<int64_t>(pt[t / kv.page_size]) * kv.page_size + t % kv.page_size) * H + h;
  const int64_t rb = kv_row_bytes(KV, D), rs = kv_row_scales(KV, D);
  float* scales = is_v ? kv.v_scale : kv.k_scale;
  encode_row<KV>((is_v ? v : k) + (i * H + h) * D, D,
                 static_cast<uint8_t*>(is_v ? kv.v : kv.k) + row * rb,
                 rs ? scales + row * rs : nullptr, threadIdx.x & 31);
}

template <DType KV>
void launch(const PagedKV& kv, const int32_t* pt, int64_t start_pos, int64_t n, const float* k,
            const float* v, cudaStream_t stream) {
  const int64_t tasks = n * kv.n_kv_heads * 2;
  launch_pdl(kv_write_kernel<KV>, dim3(grid_1d(tasks, kWarps)), dim3(kWarps * 32), 0, stream, kv, pt, start_pos, n,
             k, v);
}

}  // namespace

void kv_write(const PagedKV& kv, const int32_t* page_table, int64_t start_pos, int64_t n,
              const float* k, const float* v, cudaStream_t stream) {
  if (kv.dtype == DType::NVFP4 && kv.head_dim % kKvFp4Group != 0)
    fail(PE_ERR_UNSUPPORTED, "cuda::kv_write: nvfp4 cache needs head_dim % 16 == 0");
  if (kv_row_scales(kv.dtype, kv.head_dim) && (!kv.k_scale || !kv.v_scale))
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::kv_write: ", dtype_name(kv.dtype), " cache without scales");
  if (n <= 0 || kv.n_kv_heads <= 0 || kv.head_dim <= 0) return;
  switch (kv.dtype) {
    case DType::F32: launch<DType::F32>(kv, page_table, start_pos, n, k, v, stream); break;
    case DType::F16: launch<DType::F16>(kv, page_table, start_pos, n, k, v, stream); break;
    case DType::BF16: launch<DType::BF16>(kv, page_table, start_pos, n, k, v, stream); break;
    case DType::FP8_E4M3: launch<DType::FP8_E4M3>(kv, page_table, start_pos, n, k, v, stream); break;
    case DType::I8: launch<DType::I8>(kv, page_table, start_pos, n, k, v, stream); break;
    case DType::NVFP4: launch<DType::NVFP4>(kv, page_table, start_pos, n, k, v, stream); break;
    default: fail(PE_ERR_UNSUPPORTED, "cuda::kv_write: unsupported cache dtype ", dtype_name(kv.dtype));
  }
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
