// Internal to the decode attention: what its kernel files share. attention_decode.cu holds the
// fp32 SIMT kernel, the split-K combine, the launch and the dispatch; attention_decode_mma.cu the
// tensor-core kernels, attention_decode_pairs.cu the tensor-core kernel for short
// splits; all take the same DecodeParams and leave the same outputs and partial states.
#pragma once
#include "kernels/cuda/kv_codec.cuh"

namespace pe {
namespace cuda {
namespace attn {

constexpr int kMaxSplits = 256;    // partial states per row (scratch bound)
constexpr int kMinSplitKeys = 32;  // fewer keys per block than this costs more than it hides
// The lowest split length attention_decode_set_min_split_keys accepts; scratch is sized for it.
constexpr int kMinSplitKeysFloor = 16;
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
  // Tensor-core kernel: the page table and the cache rows of keys < q_start_pos are read before
  // pdl_wait (attention_decode_mma.cu says why that is safe; the pairs kernel also prefetches the
  // new keys' lines into L2 there, no L1 fill, and resolves every row before it in any case: the
  // page table needs no alignment). Needs every K / V row
  // on whole 32-byte sectors, NVFP4's scale rows too (a sector shared with a key the preceding
  // kv_write writes could be cached stale).
  bool early;
};

void attention_combine(const float* part, int splits, int64_t n_rows, int D, const float* gate,
                       float* out, cudaStream_t stream);

// A block's place in the launch grid (x: split; y: query block, head block, KV head kvh): queries
// i0 .. i0 + nqi - 1 and heads h0 .. h0 + nh - 1 of kvh, nv = nqi * nh vectors (vector v = query
// i0 + v / nh, head h0 + v % nh).
struct DecodeBlock {
  int split, kvh, nqi, h0, nh, nv;
  int64_t i0;
};
__device__ __forceinline__ DecodeBlock decode_block(const DecodeParams& p) {
  DecodeBlock b;
  b.split = blockIdx.x;
  const int qblk = blockIdx.y % p.n_qb, rest = blockIdx.y / p.n_qb, hblk = rest % p.n_hb;
  b.kvh = rest / p.n_hb;
  b.i0 = static_cast<int64_t>(qblk) * p.qb;
  b.nqi = static_cast<int>(min(static_cast<int64_t>(p.qb), p.n_q - b.i0));
  b.h0 = b.kvh * p.group + hblk * p.hb;
  b.nh = min(p.hb, p.group - hblk * p.hb);
  b.nv = b.nqi * b.nh;
  return b;
}

// Cache row (slot * n_kv_heads + head) of key t of KV head `head`, its page `page` (the page
// table's entry for t, where the caller read it ahead) or read here.
__device__ __forceinline__ int64_t cache_row(const DecodeParams& p, int32_t page, int64_t t, int head) {
  return (static_cast<int64_t>(page) * p.kv.page_size + t % p.kv.page_size) * p.kv.n_kv_heads + head;
}
__device__ __forceinline__ int64_t cache_row(const DecodeParams& p, int64_t t, int head) {
  return cache_row(p, p.pt[t / p.kv.page_size], t, head);
}

// Cache rows of keys w0 .. w0 + wn - 1 of KV head `head` into rows[] (the block's threads share
// the work; the caller synchronizes before and after).
__device__ __forceinline__ void resolve_rows(int64_t* rows, const DecodeParams& p, int64_t w0, int wn, int head,
                                             int tid) {
  for (int j = tid; j < wn; j += kThreads) rows[j] = cache_row(p, w0 + j, head);
}

// A block's result for its nv vectors (vector v = query i0 + v / nh, head h0 + v % nh), acc_at(v,
// d) reading the block's merged accumulator: o = acc / l times the gate when the block is the
// only split, else the unnormalized partial (acc, m, l) that attention_combine merges.
// unit_mul: a power of two on p.v_unit (the tensor-core kernel's FP8-by-cvt values).
template <class AccAt>
__device__ __forceinline__ void store_decode_result(const DecodeParams& p, const AccAt& acc_at, const float* fin_m,
                                                    const float* fin_l, int nv, int nh, int64_t i0, int h0,
                                                    int split, int D, int tid, float unit_mul = 1.0f) {
  const bool direct = gridDim.x == 1;
  const int64_t n_rows = p.n_q * p.n_heads;
  for (int e = tid; e < nv * D; e += kThreads) {
    const int v = e / D, d = e % D;
    const int64_t row = (i0 + v / nh) * p.n_heads + h0 + v % nh;
    const float val = acc_at(v, d) * (p.v_unit * unit_mul);
    if (direct) {
      float o = val / fin_l[v];
      if (p.gate) o *= sigmoid_f(p.gate[row * D + d]);
      p.out[row * D + d] = o;
    } else {
      p.part[n_rows * 2 * gridDim.x + (split * n_rows + row) * D + d] = val;
    }
  }
  if (!direct && tid < nv) {
    const int64_t row = (i0 + tid / nh) * p.n_heads + h0 + tid % nh;
    p.part[(split * n_rows + row) * 2] = fin_m[tid];
    p.part[(split * n_rows + row) * 2 + 1] = fin_l[tid];
  }
}

// Splits of at least min_keys keys, at most kMaxSplits; scratch_splits: the most any split length
// may use (kMinSplitKeysFloor), what attention_paged_scratch_bytes sizes for.
int64_t max_splits(int64_t n_keys, int64_t min_keys);
int64_t scratch_splits(int64_t n_keys);

// Splits fill the GPU once (SMs x resident blocks), at least min_split_keys() keys each; splits > 1
// write partial states and attention_combine finishes. Both launches are launch_pdl: the kernel
// calls pdl_wait() first.
int min_split_keys();  // kMinSplitKeys unless attention_decode_set_min_split_keys (cuda_ops.h) set it
int64_t decode_split_len(const DecodeParams& p, int resident, int64_t n_keys);  // keys per split
void launch_decode(void (*kernel)(DecodeParams), int resident, DecodeParams p, int64_t n_keys,
                   void* scratch, size_t scratch_bytes, cudaStream_t stream);

// The tensor-core kernel for splits of at most two warp steps (32 keys; 1K context at batch 1 on
// the H200), each step's dims split over two warps (attention_decode_pairs.cu). Instantiated for
// F16, FP8_E4M3, I8, NVFP4 at head_dim 64, 128, 256.
template <DType KV, int D>
void (*pairs_kernel())(DecodeParams);

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
