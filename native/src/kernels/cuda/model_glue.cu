#include "kernels/cuda/model_glue.h"

#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

__global__ void gather_heads_kernel(const float* src, int64_t n_tokens, int64_t token_stride, int64_t n_heads,
                                    int64_t head_stride, int64_t dim, float* dst) {
  const int64_t total = n_tokens * n_heads * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % dim, th = i / dim, h = th % n_heads, t = th / n_heads;
    dst[i] = src[t * token_stride + h * head_stride + d];
  }
}

// One warp per (token, head) row.
__global__ void l2_norm_heads_kernel(float* x, int64_t n_rows, int64_t token_stride, int64_t n_heads, int64_t dim,
                                     float eps, float scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= n_rows) return;
  const int lane = threadIdx.x & 31;
  float* p = x + (row / n_heads) * token_stride + (row % n_heads) * dim;
  float ss = 0.0f;
  for (int64_t d = lane; d < dim; d += 32) ss += p[d] * p[d];
  ss = warp_sum(ss);
  const float inv = scale / sqrtf(ss + eps);
  for (int64_t d = lane; d < dim; d += 32) p[d] *= inv;
}

__global__ void penalties_kernel(float* logits, const int32_t* ids, const int32_t* counts, int32_t n, float rep,
                                 float presence, float frequency) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float l = logits[ids[i]];
  if (rep != 1.0f && rep > 0.0f) l = l > 0.0f ? l / rep : l * rep;
  if (counts[i] > 0) l -= frequency * static_cast<float>(counts[i]) + presence;
  logits[ids[i]] = l;
}

}  // namespace

void gather_heads(const float* src, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t head_stride,
                  int64_t dim, float* dst, cudaStream_t stream) {
  const int64_t total = n_tokens * n_heads * dim;
  if (total <= 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 65535));
  gather_heads_kernel<<<grid, 256, 0, stream>>>(src, n_tokens, token_stride, n_heads, head_stride, dim, dst);
  PE_CUDA_LAUNCH_CHECK();
}

void l2_norm_heads(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t dim, float eps,
                   float scale, cudaStream_t stream) {
  const int64_t rows = n_tokens * n_heads;
  if (rows <= 0) return;
  if (dim > 1024) fail(PE_ERR_INVALID_ARGUMENT, "cuda::l2_norm_heads: dim ", dim, " > 1024");
  l2_norm_heads_kernel<<<grid_1d(rows, 8), 256, 0, stream>>>(x, rows, token_stride, n_heads, dim, eps, scale);
  PE_CUDA_LAUNCH_CHECK();
}

void apply_penalties(float* logits, const int32_t* ids, const int32_t* out_counts, int32_t n, const SamplingConfig& p,
                     cudaStream_t stream) {
  if (n <= 0) return;
  penalties_kernel<<<grid_1d(n, 256), 256, 0, stream>>>(logits, ids, out_counts, n, p.repetition_penalty,
                                                       p.presence_penalty, p.frequency_penalty);
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
