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

constexpr int kPass = 8;  // values (NVFP4: bytes) per lane per pass: 256 (512) per warp

// A lane's values base + 32 i + lane, i < kPass, of a row of D (0 past the end): all loads of a
// pass go out before the first use (session 7: the FP8 encode's branches kept the compiler from
// batching them, 8 dependent loads per row: kv_write took 6.4 us against F16's 3.1 under ncu).
__device__ __forceinline__ void load_pass(const float* __restrict__ src, int D, int base, int lane, float (&x)[kPass]) {
#pragma unroll
  for (int i = 0; i < kPass; ++i) {
    const int e = base + 32 * i + lane;
    x[i] = e < D ? src[e] : 0.0f;
  }
}

template <DType KV>
__device__ void encode_row(const float* __restrict__ src, int D, uint8_t* __restrict__ dst,
                           float* __restrict__ scales, int lane) {
  if constexpr (KV == DType::NVFP4) {  // lane owns byte b (values 2b, 2b+1); uniform loop bound for shuffles
    const int n_bytes = D / 2;
    for (int b0 = 0; b0 < n_bytes; b0 += 32 * kPass) {
      float2 x[kPass];
#pragma unroll
      for (int i = 0; i < kPass; ++i) {
        const int b = b0 + 32 * i + lane;
        x[i] = b < n_bytes ? make_float2(src[2 * b], src[2 * b + 1]) : make_float2(0.0f, 0.0f);
      }
#pragma unroll
      for (int i = 0; i < kPass; ++i) {
        if (b0 + 32 * i >= n_bytes) break;  // warp-uniform
        const int b = b0 + 32 * i + lane;
        float m = fmaxf(fabsf(x[i].x), fabsf(x[i].y));
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float s = __fdiv_rn(m, 6.0f);
        const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
        if (b < n_bytes) {
          dst[b] = static_cast<uint8_t>(kv_enc_fp4(__fmul_rn(x[i].x, inv)) | (kv_enc_fp4(__fmul_rn(x[i].y, inv)) << 4));
          if ((b & 7) == 0) scales[b / 8] = s;
        }
      }
    }
    return;
  }
  float inv = 1.0f;
  if constexpr (KV == DType::I8) {  // the row's max first (a second pass over a row of > 256)
    float m = 0.0f;
    for (int base = 0; base < D; base += 32 * kPass) {
      float x[kPass];
      load_pass(src, D, base, lane, x);
#pragma unroll
      for (int i = 0; i < kPass; ++i) m = fmaxf(m, fabsf(x[i]));
    }
    m = warp_max(m);
    const float s = __fdiv_rn(m, 127.0f);
    inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
    if (lane == 0) scales[0] = s;
  }
  for (int base = 0; base < D; base += 32 * kPass) {
    float x[kPass];
    load_pass(src, D, base, lane, x);
#pragma unroll
    for (int i = 0; i < kPass; ++i) {
      const int e = base + 32 * i + lane;
      if (e >= D) break;
      if constexpr (KV == DType::F32) {
        reinterpret_cast<float*>(dst)[e] = x[i];
      } else if constexpr (KV == DType::F16) {
        reinterpret_cast<uint16_t*>(dst)[e] = __half_as_ushort(__float2half_rn(x[i]));
      } else if constexpr (KV == DType::BF16) {
        reinterpret_cast<uint16_t*>(dst)[e] = kv_enc_bf16(x[i]);
      } else if constexpr (KV == DType::FP8_E4M3) {
        dst[e] = kv_enc_fp8(x[i]);
      } else {  // I8
        const float q = fminf(fmaxf(__fmul_rn(x[i], inv), -127.0f), 127.0f);
        dst[e] = static_cast<uint8_t>(static_cast<int8_t>(__float2int_rn(q)));
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
