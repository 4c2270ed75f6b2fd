#include "kernels/cuda/model_glue.h"

#include <cmath>

#include "kernels/cuda/kv_encode_row.cuh"

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

constexpr int kInputWarps = 8, kMaxInputDim = 512, kMaxHalfRot = 128;

struct HalfInvFreq {
  float v[kMaxHalfRot];
};

// One warp per (token t, head slot h): slots < Hq are query heads (q normed + rotated, gate copied),
// the next Hkv key heads (k normed + rotated), the last Hkv value heads (v copied). The normed row
// is staged in shared memory and rotated there (RoPE pairs d with d + half across lanes; in-place
// k is read whole before it is written), then stored from it. The norm and the rotation repeat
// rms_norm's and rope_neox's arithmetic. Each lane loads its whole share of the row and the gate
// row (kInputRegs values each; the norm weight and cos / sin come before pdl_wait) before the
// first use, so the warp waits for one memory round trip instead of one per value (as the norms
// in rms_norm.cu; a load-use loop over a runtime length ran them one at a time). kCache: the k
// and v warps encode their rows straight into the cache (kv_encode_row.cuh, the bytes kv_write
// writes from the same values) instead of dense rows; k and v in separate warps keep the two
// encodes' latencies apart.
constexpr int kInputRegs = kMaxInputDim / 32, kRotRegs = kMaxHalfRot / 32;
template <DType KV, bool kCache>
__global__ void attention_inputs_kernel(cpu::AttnInputArgs a, HalfInvFreq inv, int half, PagedKV kv,
                                        const int32_t* __restrict__ cache_rows) {
  __shared__ float rows[kInputWarps][kMaxInputDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t slots = a.Hq + 2 * a.Hkv, D = a.D;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kInputWarps + warp;
  if (task >= a.n_tokens * slots) return;
  const int64_t t = task / slots, h = task % slots;
  // Before pdl_wait (launched as a programmatic dependent, launch_pdl): what no kernel of the step
  // writes -- the positions and cache rows (copied by the host before the step), the norm weights --
  // and the rotation's cos / sin, so they leave the wait-to-store path (tools/gpu/KERNELS.md,
  // "Attention inputs").
  const int64_t r = kCache ? static_cast<int64_t>(cache_rows[t]) * kv.n_kv_heads : 0;  // the token's first cache row
  const int64_t rb = kv_row_bytes(KV, D), rs = kv_row_scales(KV, D);
  const bool is_v = h >= a.Hq + a.Hkv, is_q = h < a.Hq;
  const float* w = is_q ? a.q_norm : a.k_norm;
  float wv[kInputRegs], cs[kRotRegs], sn[kRotRegs];
  if (!is_v) {
#pragma unroll
    for (int i = 0; i < kInputRegs; ++i) {  // the norm's factor: 1 + w (Qwen3.5) or w (Qwen3)
      const float wi = lane + 32 * i < D ? w[lane + 32 * i] : 0.0f;
      wv[i] = a.norm_offset ? 1.0f + wi : wi;
    }
    const float p = static_cast<float>(a.pos[t]);
#pragma unroll
    for (int i = 0; i < kRotRegs; ++i) {
      const int d = lane + 32 * i;
      double sd = 0.0, cd = 1.0;
      if (d < half) sincos(static_cast<double>(p * inv.v[d]), &sd, &cd);
      cs[i] = static_cast<float>(cd);
      sn[i] = static_cast<float>(sd);
    }
  }
  pdl_wait();
  pdl_trigger();
  if (is_v) {  // a value head: copied, or encoded into the cache
    const int64_t hh = h - a.Hq - a.Hkv;
    const float* src = a.v_in + t * a.v_stride + hh * D;
    if constexpr (kCache) {
      kv_row::encode_row<KV>(src, static_cast<int>(D), static_cast<uint8_t*>(kv.v) + (r + hh) * rb,
                             rs ? kv.v_scale + (r + hh) * rs : nullptr, lane);
    } else {
      float c[kInputRegs];
#pragma unroll
      for (int i = 0; i < kInputRegs; ++i) c[i] = lane + 32 * i < D ? src[lane + 32 * i] : 0.0f;
      float* dst = a.v + (t * a.Hkv + hh) * D;
#pragma unroll
      for (int i = 0; i < kInputRegs; ++i)
        if (lane + 32 * i < D) dst[lane + 32 * i] = c[i];
    }
    return;
  }
  const int64_t hh = is_q ? h : h - a.Hq;
  const float* src = is_q ? a.qg + t * a.qg_stride + hh * (a.gated ? 2 : 1) * D : a.k_in + t * a.k_stride + hh * D;
  float* row = rows[warp];
  float x[kInputRegs], c2[kInputRegs];
#pragma unroll
  for (int i = 0; i < kInputRegs; ++i) {
    const int d = lane + 32 * i;
    const bool in = d < D;
    x[i] = in ? src[d] : 0.0f;
    c2[i] = is_q && a.gated && in ? src[D + d] : 0.0f;  // the gate row follows the query row
  }
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kInputRegs; ++i) ss = fmaf(x[i], x[i], ss);  // padding adds 0: same bits
  ss = warp_sum(ss);
  const float inv_rms = 1.0f / sqrtf(ss / static_cast<float>(D) + a.eps);
#pragma unroll
  for (int i = 0; i < kInputRegs; ++i) {
    const int d = lane + 32 * i;
    if (d < D) row[d] = x[i] * inv_rms * wv[i];
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kRotRegs; ++i) {  // each lane rotates its own pairs in place
    const int d = lane + 32 * i;
    if (d >= half) break;
    const float x0 = row[d], x1 = row[d + half];
    row[d] = x0 * cs[i] - x1 * sn[i];
    row[d + half] = x1 * cs[i] + x0 * sn[i];
  }
  __syncwarp();
  if constexpr (kCache) {
    if (!is_q) {
      kv_row::encode_row<KV>(row, static_cast<int>(D), static_cast<uint8_t*>(kv.k) + (r + hh) * rb,
                             rs ? kv.k_scale + (r + hh) * rs : nullptr, lane);
      return;
    }
  }
  float* dst = is_q ? a.q + (t * a.Hq + hh) * D : a.k + (t * a.Hkv + hh) * D;
  const bool write_gate = is_q && a.gated;
  float* gate = write_gate ? a.gate + (t * a.Hq + hh) * D : nullptr;
#pragma unroll
  for (int i = 0; i < kInputRegs; ++i) {
    const int d = lane + 32 * i;
    if (d < D) {
      dst[d] = row[d];
      if (write_gate) gate[d] = c2[i];
    }
  }
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

__global__ void feed_tokens_kernel(int32_t* tokens, const int32_t* from, const int32_t* sampled, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && from[i] >= 0) tokens[i] = sampled[from[i]];
}

}  // namespace

void feed_tokens(int32_t* tokens, const int32_t* from, const int32_t* sampled, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  feed_tokens_kernel<<<grid_1d(n, 256), 256, 0, stream>>>(tokens, from, sampled, n);
  PE_CUDA_LAUNCH_CHECK();
}

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

void attention_inputs(const cpu::AttnInputArgs& a, cudaStream_t stream, const PagedKV* kv,
                      const int32_t* cache_rows) {
  const int64_t tasks = a.n_tokens * (a.Hq + 2 * a.Hkv);
  if (tasks <= 0 || a.D <= 0) return;
  if (a.D > kMaxInputDim || a.rot_dim < 0 || a.rot_dim > a.D || a.rot_dim % 2 != 0 || a.rot_dim / 2 > kMaxHalfRot)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::attention_inputs: head_dim ", a.D, " (<= ", kMaxInputDim, ") and rot_dim ",
         a.rot_dim, " (even, <= head_dim, <= ", 2 * kMaxHalfRot, ") out of range");
  if (kv) {
    if (!cache_rows || kv->n_kv_heads != a.Hkv || kv->head_dim != a.D)
      fail(PE_ERR_INVALID_ARGUMENT, "cuda::attention_inputs: the cache (", kv->n_kv_heads, " kv heads of ",
           kv->head_dim, ") does not match ", a.Hkv, " heads of ", a.D, ", or no cache rows");
  }
  const int half = static_cast<int>(a.rot_dim / 2);
  HalfInvFreq inv{};  // as rope_neox: fp32 of the double power
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(a.rot_dim);
    inv.v[i] = 1.0f / static_cast<float>(std::pow(static_cast<double>(a.theta), static_cast<double>(e)));
  }
  const dim3 grid(grid_1d(tasks, kInputWarps)), block(kInputWarps * 32);
  const PagedKV none{};
  if (!kv) {
    launch_pdl(attention_inputs_kernel<DType::F32, false>, grid, block, 0, stream, a, inv, half, none, cache_rows);
  } else {
    kv_row::with_cache_dtype(*kv, "cuda::attention_inputs", [&](auto t) {
      launch_pdl(attention_inputs_kernel<decltype(t)::value, true>, grid, block, 0, stream, a, inv, half, *kv,
                 cache_rows);
    });
  }
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
