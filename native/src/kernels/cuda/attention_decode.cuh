// Internal to the decode attention: what its two kernel files share. attention_decode.cu holds
// the fp32 SIMT kernel, the split-K combine, the launch and the dispatch; attention_decode_mma.cu
// the tensor-core kernel, which takes the same DecodeParams and leaves the same outputs and
// partial states.
#pragma once
#include "kernels/cuda/kv_codec.cuh"

namespace pe {
namespace cuda {
namespace attn {

constexpr int kMaxSplits = 256;    // partial states per row (scratch bound)
constexpr int kMinSplitKeys = 32;  // fewer keys per block than this costs more than it hides
constexpr int kDecodeMaxQ = 16;

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kWindow = 512;  // keys whose cache rows are resolved per shared-memory pass
constexpr int kMaxD = 256, kMaxVecs = 8;

struct DecodeParams {
  const float* q;
  const float* gate;
  float* out;
  float* part;
  const int32_t* pt;
  PagedKV kv;
  int64_t n_q, q_start_pos, n_heads;
  int group, hb, n_hb, qb, n_qb, split_len, lpk_log2;
  float q_mul;   // scale * log2(e) * unit of the K chunks
  float v_unit;  // unit of the V chunks
};

void attention_combine(const float* part, int splits, int64_t n_rows, int D, const float* gate,
                       float* out, cudaStream_t stream);

int64_t max_splits(int64_t n_keys);

// Splits fill the GPU once (SMs x resident blocks), at least kMinSplitKeys keys each; splits > 1
// write partial states and attention_combine finishes.
void launch_decode(void (*kernel)(DecodeParams), int resident, DecodeParams p, int64_t n_keys,
                   void* scratch, size_t scratch_bytes, cudaStream_t stream);

// The tensor-core kernel where its operands are exact in fp16 (F16, FP8, I8, NVFP4) and
// head_dim is one it is built for; the SIMT kernel otherwise (F32, BF16, other head_dims).
// Returns false, running nothing, where it does not apply. Instantiated in attention_decode_mma.cu
// for F16, FP8_E4M3, I8 and NVFP4.
template <DType KV>
bool run_decode_tc_dim(const DecodeParams& p, int64_t n_keys, void* scratch, size_t scratch_bytes,
                       cudaStream_t stream);

}  // namespace attn
}  // namespace cuda
}  // namespace pe
