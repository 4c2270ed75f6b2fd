// Internal to the tensor-core prefill attention: what its kernel files share.
// attention_prefill_mma.cu holds the sm_75 kernel, the checks and the dispatch;
// attention_prefill_sm80.cu the sm_80+ kernel (F16 / BF16 caches), which it takes where
// attention_prefill_sm80_applies. Both read the same PrefillParams and write the same outputs.
#pragma once
#include <atomic>

#include "kernels/cuda/kv_codec.cuh"

namespace pe {
namespace cuda {
namespace prefill {

struct PrefillParams {
  const float* q;
  const float* gate;
  float* out;
  const int32_t* pt;
  PagedKV kv;
  int n_q, q_start_pos, n_heads, group, D;
  float q_mul;  // scale * log2(e)
  // Key split of the sm_80 kernel (run_sm80 sets them; the sm_75 kernel reads neither): parts of
  // each query tile's keys, blockIdx.z; splits > 1 write unnormalized partial states to part in
  // attn::attention_combine's layout (attention_prefill_sm80.cu's header).
  float* part;
  int splits;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Fragment loads (layouts as linear_gemm.cu). "memory": keep them after the tile stores.
__device__ __forceinline__ void ldsm_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
  lo = fminf(fmaxf(lo, -65504.0f), 65504.0f);
  hi = fminf(fmaxf(hi, -65504.0f), 65504.0f);
  const __half2 h = __floats2half2_rn(lo, hi);  // lo in the low 16 bits (lower column)
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Stages a block's kBM query rows from i0 as fp16 Q * q_mul (scale * log2 e) in Qs, LD halves a
// row of CPR 16-byte chunks: zero rows past n_q, zero columns past D. All threads of the block.
template <int kBM, int CPR, int LD>
__device__ __forceinline__ void stage_q(const PrefillParams& p, __half* Qs, int i0, int h, int D, int tid,
                                        int n_threads) {
  for (int e = tid; e < kBM * CPR; e += n_threads) {
    const int r = e / CPR, c = e % CPR, i = i0 + r;
    uint4 hv = make_uint4(0, 0, 0, 0);
    if (i < p.n_q && c * 8 < D) {
      const float* src = p.q + (static_cast<int64_t>(i) * p.n_heads + h) * D + c * 8;
      float x[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) x[k] = src[k] * p.q_mul;
      hv = make_uint4(half2_bits(x[0], x[1]), half2_bits(x[2], x[3]), half2_bits(x[4], x[5]),
                      half2_bits(x[6], x[7]));
    }
    *reinterpret_cast<uint4*>(Qs + r * LD + c * 8) = hv;
  }
}

// Cache row of (position t, kv head g).
__device__ __forceinline__ int64_t cache_row(const PrefillParams& p, int t, int g) {
  const int ps = static_cast<int>(p.kv.page_size);
  const int page = __ldg(p.pt + t / ps);
  return (static_cast<int64_t>(page) * ps + t % ps) * p.kv.n_kv_heads + g;
}

// One key tile of the online softmax, for a warp's 16 query rows (this thread: rows pos0 = the
// warp's first row pos_first + gq and pos1 = pos0 + 8, the m16n8 C layout): s[n] holds keys
// t0 + 8 n + 2 tq + (0, 1) of both rows, in the log2 domain. The causal mask where the tile of
// `bn` keys reaches past pos_first, the running maxima m and this thread's sums l, s turned into
// the tile's probabilities, O rescaled where a max moved. A row that has seen no key yet (a key
// part of a split starting past it) stays at m = -inf, P = 0, l = 0.
template <int NT, int OD>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], float (&o)[OD][4], float& m0, float& m1, float& l0,
                                             float& l1, int t0, int bn, int pos_first, int pos0, int pos1, int tq) {
  if (t0 + bn - 1 > pos_first) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = t0 + 8 * n + 2 * tq + (e & 1);
        if (key > (e < 2 ? pos0 : pos1)) s[n][e] = -INFINITY;
      }
  }
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
    mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
  }
  // A row's 8 columns of an n tile live in the 4 threads of a quad.
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
  const float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
  const float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);
  const bool moved = mn0 != m0 || mn1 != m1;
  m0 = mn0;
  m1 = mn1;
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    s[n][0] = exp2f(s[n][0] - b0);
    s[n][1] = exp2f(s[n][1] - b0);
    s[n][2] = exp2f(s[n][2] - b1);
    s[n][3] = exp2f(s[n][3] - b1);
    sum0 += s[n][0] + s[n][1];
    sum1 += s[n][2] + s[n][3];
  }
  l0 = l0 * c0 + sum0;  // this thread's columns only; the quad is summed at the end
  l1 = l1 * c1 + sum1;
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int d = 0; d < OD; ++d) {
      o[d][0] *= c0;
      o[d][1] *= c0;
      o[d][2] *= c1;
      o[d][3] *= c1;
    }
  }
}

// The warp's 16 finished rows (from wi0; this thread's rows gq and gq + 8) of head h to p.out:
// O / l (l this row's whole sum), times sigmoid(gate) where given; rows past n_q are skipped.
template <int OD>
__device__ __forceinline__ void store_rows(const PrefillParams& p, const float (&o)[OD][4], float l0, float l1,
                                           int wi0, int gq, int tq, int h) {
  const int D = p.D;
  const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int i = wi0 + gq + (e >> 1) * 8;
    if (i >= p.n_q) continue;
    const int64_t base = (static_cast<int64_t>(i) * p.n_heads + h) * D;
    const float inv = e < 2 ? inv0 : inv1;
#pragma unroll
    for (int d = 0; d < OD; ++d) {
      const int col = 8 * d + 2 * tq + (e & 1);
      if (col >= D) break;
      float v = o[d][e] * inv;
      if (p.gate) v *= sigmoid_f(p.gate[base + col]);
      p.out[base + col] = v;
    }
  }
}

// A key part's unnormalized state of the warp's 16 rows (from wi0; this thread's rows gq, gq + 8;
// l this row's whole sum): (m, l) at part[(z * rows + row) * 2], O at part[rows * 2 * splits +
// (z * rows + row) * D] (attn::attention_combine's layout), z = blockIdx.z, row = query * n_heads +
// head. Rows no key of the part reaches: m = -inf, l = 0, O = 0.
template <int OD>
__device__ __forceinline__ void store_part(const PrefillParams& p, const float (&o)[OD][4], float m0, float m1,
                                           float l0, float l1, int wi0, int gq, int tq, int h) {
  const int D = p.D;
  const int64_t n_rows = static_cast<int64_t>(p.n_q) * p.n_heads, z = blockIdx.z;
  float* acc = p.part + n_rows * 2 * p.splits;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int i = wi0 + gq + hr * 8;
    if (i >= p.n_q) continue;
    const int64_t row = z * n_rows + static_cast<int64_t>(i) * p.n_heads + h;
    if (tq == 0) *reinterpret_cast<float2*>(p.part + row * 2) = make_float2(hr ? m1 : m0, hr ? l1 : l0);
#pragma unroll
    for (int d = 0; d < OD; ++d) {
      const int col = 8 * d + 2 * tq;  // and col + 1: D % 8 == 0
      if (col >= D) break;
      *reinterpret_cast<float2*>(acc + row * D + col) = make_float2(o[d][2 * hr], o[d][2 * hr + 1]);
    }
  }
}

// The end of the sm_80 / sm_90a kernels for the warp's 16 rows: this thread's partial sums l
// summed over its quad, then the key part's state (split) or the finished rows.
template <int OD>
__device__ __forceinline__ void finish_rows(const PrefillParams& p, const float (&o)[OD][4], float m0, float m1,
                                            float l0, float l1, int wi0, int gq, int tq, int h) {
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (p.splits > 1) return store_part(p, o, m0, m1, l0, l1, wi0, gq, tq, h);
  store_rows(p, o, l0, l1, wi0, gq, tq, h);
}

// A yes / no fact of the current device, probed once per device (known: 0 unknown, 1 no, 2 yes).
template <class Probe>
bool per_device(std::atomic<int> (&known)[64], Probe probe) {
  int dev = 0;
  PE_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < 64;
  int v = cached ? known[dev].load(std::memory_order_relaxed) : 0;
  if (v) return v == 2;
  v = probe() ? 2 : 1;
  if (cached) known[dev].store(v, std::memory_order_relaxed);
  return v == 2;
}

// Launches a kernel of the sm_80 / sm_90a shape: grid heads x query tiles of bm (the kernel takes
// them longest first) x p.splits key parts; the shared-memory opt-in set per call (the attribute
// is per device).
template <class Kernel>
void launch_blocks(Kernel kernel, size_t smem, int threads, int bm, const PrefillParams& p, cudaStream_t stream) {
  PE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const unsigned n_qt = static_cast<unsigned>((p.n_q + bm - 1) / bm);
  kernel<<<dim3(static_cast<unsigned>(p.n_heads), n_qt, static_cast<unsigned>(p.splits)), threads, smem, stream>>>(p);
  PE_CUDA_LAUNCH_CHECK();
}

// attention_prefill_sm80.cu, where attention_prefill_sm80_applies (cuda_ops.h); p checked by
// attention_prefill_mma. Splits the keys (sm80_splits) where scratch_bytes holds the parts,
// else runs whole query tiles; p.part and p.splits are its to set.
void run_sm80(const PrefillParams& p, void* scratch, size_t scratch_bytes, cudaStream_t stream);
// The key parts run_sm80 takes for this call on the current device with scratch enough
// (attention_prefill_set_splits, cuda_ops.h; 1 = none), and the scratch they need: what
// attention_paged_scratch_bytes sizes for and run_sm80 launches with, so the two agree.
// attention_prefill_sm90.cu (built where the architectures include 90: PE_WITH_SM90A): whether
// the current device runs its sm_90a code, the shared memory its kernel takes at head_dim, and the
// launch of it for p (run_sm80 sets the splits and the parts as for the sm_80 kernel).
bool sm90_code();
size_t sm90_smem_bytes(int64_t head_dim);
void launch_sm90(const PrefillParams& p, cudaStream_t stream);
int sm80_splits(int64_t n_q, int64_t q_start_pos, int64_t n_heads, int64_t head_dim);
size_t sm80_part_bytes(int splits, int64_t n_q, int64_t n_heads, int64_t head_dim);

}  // namespace prefill
}  // namespace cuda
}  // namespace pe
