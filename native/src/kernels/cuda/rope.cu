// Partial NeoX RoPE in place on x[n_tokens, n_heads, head_dim] (token stride given); the first
// rot_dim dims rotate, i < rot_dim/2: y[i] = x[i] cos - x[i+R/2] sin, y[i+R/2] = x[i+R/2] cos +
// x[i] sin, angle = pos * inv_freq[i].
// Same rounding as the CPU twin: inv_freq computed on the host (double pow, rounded to fp32) and
// passed by value, the angle is the fp32 product, cos/sin are taken in double (fast-math sinf
// loses accuracy at large positions). One thread per (token, i) computes cos/sin once and
// rotates that pair in every head.
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kMaxHalf = 128;

struct InvFreq {
  float v[kMaxHalf];
};

__global__ void rope_kernel(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads,
                            int64_t head_dim, int half, const int32_t* pos, InvFreq inv) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_tokens * half) return;
  const int64_t t = i / half;
  const int d = static_cast<int>(i % half);
  const float angle = static_cast<float>(pos[t]) * inv.v[d];
  double sd, cd;
  sincos(static_cast<double>(angle), &sd, &cd);
  const float c = static_cast<float>(cd), s = static_cast<float>(sd);
  float* xt = x + t * token_stride;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* a = xt + h * head_dim;
    const float x0 = a[d], x1 = a[d + half];
    a[d] = x0 * c - x1 * s;
    a[d + half] = x1 * c + x0 * s;
  }
}

}  // namespace

void rope_neox(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t head_dim,
               int64_t rot_dim, const int32_t* pos, float theta, cudaStream_t stream) {
  if (rot_dim <= 0 || n_tokens <= 0) return;
  if (rot_dim > head_dim || rot_dim % 2 != 0 || rot_dim / 2 > kMaxHalf)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::rope_neox: rot_dim must be even, <= head_dim and <= ",
         2 * kMaxHalf);
  const int half = static_cast<int>(rot_dim / 2);
  InvFreq inv{};
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rot_dim);
    inv.v[i] = 1.0f / static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
  }
  rope_kernel<<<grid_1d(n_tokens * half, 256), 256, 0, stream>>>(x, n_tokens, token_stride, n_heads,
                                                                 head_dim, half, pos, inv);
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
