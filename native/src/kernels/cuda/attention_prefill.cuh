// Internal to the tensor-core prefill attention: what its kernel files share.
// attention_prefill_mma.cu holds the sm_75 kernel, the checks and the dispatch;
// attention_prefill_sm80.cu the sm_80+ kernel (F16 / BF16 caches), which it takes where
// attention_prefill_sm80_applies. Both read the same PrefillParams and write the same outputs.
#pragma once
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

// Cache row of (position t, kv head g).
__device__ __forceinline__ int64_t cache_row(const PrefillParams& p, int t, int g) {
  const int ps = static_cast<int>(p.kv.page_size);
  const int page = __ldg(p.pt + t / ps);
  return (static_cast<int64_t>(page) * ps + t % ps) * p.kv.n_kv_heads + g;
}

// attention_prefill_sm80.cu, where attention_prefill_sm80_applies (cuda_ops.h); p checked by
// attention_prefill_mma. Splits the keys (sm80_splits) where scratch_bytes holds the parts,
// else runs whole query tiles; p.part and p.splits are its to set.
void run_sm80(const PrefillParams& p, void* scratch, size_t scratch_bytes, cudaStream_t stream);
// The key parts run_sm80 takes for this call on the current device with scratch enough
// (attention_prefill_set_splits, cuda_ops.h; 1 = none), and the scratch they need: what
// attention_paged_scratch_bytes sizes for and run_sm80 launches with, so the two agree.
int sm80_splits(int64_t n_q, int64_t q_start_pos, int64_t n_heads, int64_t head_dim);
size_t sm80_part_bytes(int splits, int64_t n_q, int64_t n_heads, int64_t head_dim);

}  // namespace prefill
}  // namespace cuda
}  // namespace pe
