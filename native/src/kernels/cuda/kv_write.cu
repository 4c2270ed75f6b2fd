// Paged KV cache write: k, v [n, n_kv_heads, head_dim] fp32 -> the cache rows of positions
// start_pos + i (row (page_table[t / page_size] * page_size + t % page_size) * n_kv_heads + head),
// encoded with kv_codec.cuh so the bytes and scales equal the CPU kv_write's.
// One warp per (token, kv head, K or V) row (kv_encode_row.cuh).
#include "kernels/cuda/kv_encode_row.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kWarps = 4;

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
  kv_row::encode_row<KV>((is_v ? v : k) + (i * H + h) * D, D, static_cast<uint8_t*>(is_v ? kv.v : kv.k) + row * rb,
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
  kv_row::with_cache_dtype(kv, "cuda::kv_write", [&](auto t) {
    if (n <= 0 || kv.n_kv_heads <= 0 || kv.head_dim <= 0) return;
    launch<decltype(t)::value>(kv, page_table, start_pos, n, k, v, stream);
  });
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
