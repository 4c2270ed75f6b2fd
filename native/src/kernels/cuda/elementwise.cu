// Element-wise ops: embedding gather, SwiGLU, residual add, the GDN gates. fp32 outputs.
//   embedding: out[i, :] = fp32(table[ids[i], :])  (F32/F16/BF16, FP8 with block scales)
//   swiglu:    out[t, j] = silu(gate_up[t, j]) * gate_up[t, I + j]
//   add:       out = a + b (out may alias a)
//   gdn_gates: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (softplus(x) = x, x > 20)
// Grid-stride loops; nothing to fuse here that the callers do not already fuse.
#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535LL * 16));
}

__global__ void embedding_kernel(WeightView t, const int32_t* ids, int64_t n, float* out) {
  const int64_t total = n * t.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t tok = i / t.cols, c = i % t.cols;
    out[i] = weight_at(t, ids[tok], c);
  }
}

__global__ void swiglu_kernel(const float* gu, int64_t n, int64_t I, float* out) {
  pdl_wait();     // launched as a programmatic dependent (launch_pdl)
  pdl_trigger();  // the down GEMV may start prefetching its weights
  const int64_t total = n * I;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / I, j = i % I;
    const float g = gu[t * 2 * I + j];
    out[i] = silu_f(g) * gu[t * 2 * I + I + j];
  }
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void gdn_gates_kernel(const float* a, const float* b, int64_t ab_stride, int64_t n,
                                 int64_t H, const float* A_log, const float* dt_bias, float* g,
                                 float* beta) {
  const int64_t total = n * H;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, h = i % H;
    const float x = a[t * ab_stride + h] + dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    g[i] = -expf(A_log[h]) * sp;
    beta[i] = 1.0f / (1.0f + expf(-b[t * ab_stride + h]));
  }
}

}  // namespace

void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out,
               cudaStream_t stream) {
  check_weight(table, "cuda::embedding");
  if (n <= 0 || table.cols <= 0) return;
  embedding_kernel<<<blocks_for(n * table.cols), kThreads, 0, stream>>>(table, ids, n, out);
  PE_CUDA_LAUNCH_CHECK();
}

void swiglu(const float* gate_up, int64_t n, int64_t I, float* out, cudaStream_t stream) {
  if (n <= 0 || I <= 0) return;
  launch_pdl(swiglu_kernel, dim3(blocks_for(n * I)), dim3(kThreads), 0, stream, gate_up, n, I, out);
  PE_CUDA_LAUNCH_CHECK();
}

void add(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, n, out);
  PE_CUDA_LAUNCH_CHECK();
}

void gdn_gates(const float* a, const float* b, int64_t ab_stride, int64_t n, int64_t n_heads,
               const float* A_log, const float* dt_bias, float* g, float* beta,
               cudaStream_t stream) {
  if (n <= 0 || n_heads <= 0) return;
  gdn_gates_kernel<<<blocks_for(n * n_heads), kThreads, 0, stream>>>(a, b, ab_stride, n, n_heads,
                                                                      A_log, dt_bias, g, beta);
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
