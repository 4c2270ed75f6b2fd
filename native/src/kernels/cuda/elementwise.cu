// Element-wise ops: embedding gather, SwiGLU, residual add, the GDN gates. fp32 outputs.
//   embedding: out[i, :] = fp32(table[ids[i], :])  (F32/F16/BF16, FP8 with block scales)
//   embedding_norm: the same rows as a split norm's producer (x, h and partial sums of x^2)
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

// Block (part, token): columns [part * span, ...) of the token's row; the block's sum of x^2 to
// partial[token * parts + part] (block_sum: a fixed order).
__global__ void embedding_norm_kernel(WeightView t, const int32_t* ids, int64_t span, float* x, float* h,
                                      const float* w, bool offset, float* partial) {
  __shared__ float red[32];
  const int64_t token = blockIdx.y, c0 = blockIdx.x * span, c1 = min(c0 + span, t.cols);
  const int32_t id = ids[token];
  float sq = 0.0f;
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
    const float v = weight_at(t, id, c);
    x[token * t.cols + c] = v;
    h[token * t.cols + c] = v * (offset ? 1.0f + w[c] : w[c]);
    sq += v * v;
  }
  sq = block_sum(sq, red);
  if (threadIdx.x == 0) partial[token * gridDim.x + blockIdx.x] = sq;
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

void embedding_norm(const WeightView& table, const int32_t* ids, int64_t n, SplitNorm& norm, cudaStream_t stream) {
  check_weight(table, "cuda::embedding_norm");
  if (n <= 0 || n > 65535 || table.cols != norm.dim || !norm.x || !norm.h || !norm.w || !norm.partial)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::embedding_norm: ", n, " tokens of ", table.cols, " columns into a split norm of ",
         norm.dim, " (x, h, w and partial set)");
  constexpr int64_t kSpan = 512;  // columns a block: 2 a thread
  const int64_t parts = std::min((table.cols + kSpan - 1) / kSpan, split_norm_partial_floats(norm.dim));
  const int64_t span = (table.cols + parts - 1) / parts;
  embedding_norm_kernel<<<dim3(static_cast<unsigned>(parts), static_cast<unsigned>(n)), kThreads, 0, stream>>>(
      table, ids, span, norm.x, norm.h, norm.w, norm.offset, norm.partial);
  PE_CUDA_LAUNCH_CHECK();
  norm.parts = static_cast<int>(parts);
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
