// Small CUDA ops that connect the big ones inside the model forward (fused projections are split
// into heads, q/k are normalized in place inside a wider row or normed and rotated on the way out
// of it, penalties touch a few logits).
// Device pointers, asynchronous on `stream`, no allocation. Each has a CPU twin it is tested
// against in native/tests/test_backend_ops_cuda.inc.
#pragma once
#include <cstdint>

#include "kernels/ops.h"
#include "kernels/sampling.h"

typedef struct CUstream_st* cudaStream_t;

namespace pe {
namespace cuda {

// tokens[i] = sampled[from[i]] where from[i] >= 0 (else unchanged), i < n: a step's token ids
// taken from the previous step's sampled ids without a trip through the host (overlapped steps,
// engine/engine.h). (CPU twin: the CPU backend's feed_tokens.)
void feed_tokens(int32_t* tokens, const int32_t* from, const int32_t* sampled, int64_t n, cudaStream_t stream);

// dst[t, h, :] = src[t * token_stride + h * head_stride + (0 .. dim)], dst dense
// [n_tokens, n_heads, dim]. (CPU twin: a memcpy per head.)
void gather_heads(const float* src, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t head_stride,
                  int64_t dim, float* dst, cudaStream_t stream);

// In place l2 norm of n_heads rows of `dim` that start at x + t * token_stride for every token t
// (rows of one token contiguous): x / sqrt(sum(x^2) + eps) * scale. (CPU twin: cpu::l2_norm per
// token.) dim <= 1024.
void l2_norm_heads(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t dim, float eps,
                   float scale, cudaStream_t stream);

// The inputs of (gated or ungated) attention in one launch: q and gate out of the q_proj rows, q/k head norms
// and partial RoPE, k and v made dense (cpu::attention_inputs in ops.h: same math, aliasing rules
// and layouts; pos is a device array). One warp per (token, q head), (token, k head) and (token,
// v head); D <= 512, rot_dim even, <= D and <= 256. Tolerance vs the CPU twin: normalized error 1e-5 (rms_norm, rope).
// With kv, k and v go straight into the paged cache instead of a.k / a.v (unused then): token t's
// rows are cache row cache_rows[t] (page * page_size + offset, device array), encoded with the
// bytes and scales cuda::kv_write gives the dense k and v of the same call (its CPU twin:
// cpu::attention_inputs, then cpu::kv_write). Saves kv_write's launch in every attention layer.
void attention_inputs(const cpu::AttnInputArgs& a, cudaStream_t stream, const cpu::PagedKV* kv = nullptr,
                      const int32_t* cache_rows = nullptr);

// Penalties on one logits row, given the distinct ids of prompt + output (n entries) and how
// often each occurs in the output (0 for prompt-only ids): the repetition penalty on every id,
// then -= frequency * count + presence where count > 0. Equal to cpu::apply_penalties.
void apply_penalties(float* logits, const int32_t* ids, const int32_t* out_counts, int32_t n,
                     const SamplingConfig& p, cudaStream_t stream);

}  // namespace cuda
}  // namespace pe
