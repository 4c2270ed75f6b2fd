// CUDA ops of the Qwen3.5 hybrid forward: the device twins of kernels/ops.h and sampling.h.
//
// Same math, shapes and layouts as the CPU reference (read ops.h); every pointer is a DEVICE
// pointer, every call is asynchronous on `stream`, takes its scratch from the caller and never
// allocates (one exception: gdn_chunked's convenience form). Launch errors throw pe::Error
// (PE_CUDA_CHECK: file:line and the CUDA message).
// WeightView / PagedKV / GdnArgs are the CPU structs with device pointers inside (block_scale too).
//
// Design decision (activations): activations, the residual stream, norms, softmax, GDN state and
// every accumulator are fp32, exactly as on the CPU; only the tensor-core paths for n > 8 tokens
// (the GEMM, and the quantized GEMV of 9..32 tokens) round their inputs to fp16 (x and the weights converted to fp16 in shared memory, fp32
// accumulation; |x| is clamped to 65504). FP8 weights are dequantized as fp8 * block_scale (the
// bf16-reference numbers of MODEL_SPEC §5, not W8A8). Code runs on sm_75 (no bf16/fp8 mma, no
// cp.async); newer GPUs take the same path, except the prefill attention's sm_80 kernel (F16 / BF16
// caches: cp.async, the same fp16 roundings; attention_prefill_sm80_applies) and, where a caller
// passes a workspace: on compute capability 9.0, FP8 GEMMs of >= kFp8GemmMinTokens tokens run
// W8A8 (x quantized to e4m3 per token per 128 columns; linear below), the numerics vLLM / SGLang
// use for these checkpoints.
//
// Tolerances against the CPU twin, normalized error ||gpu - cpu|| / ||cpu|| (tests enforce them):
//   embedding, kv_write, swiglu, add, conv1d, gdn_gates      exact .. 1e-5
//   rms_norm, rms_norm_gated, l2_norm, rope_neox            1e-5
//   add_rms_norm                                            1e-5 (bit-equal to add + rms_norm)
//   linear n <= 8 (GEMV: fp32 FMA; FP8/I8/NVFP4 mma, x hi+lo) 1e-5
//   linear n > 8  (GEMM, fp16 operands)                     3e-3 (fp16 rounding of x and W)
//   linear 9 <= n <= 32, FP8/I8/NVFP4 (GEMV, x as fp16)      3e-3 (the GEMM's bound: fp16 rounding of
//     x alone, the weights decode exactly; FP8 block scales applied in fp32)
//   linear FP8 W8A8 (sm_90, workspace given, n >= 128)      1e-3 against cpu::linear of
//     cpu::fp8_group_quantize(x) (measured 1.4e-4 on an H100); 5e-2 against cpu::linear of x
//     (the quantization of x itself: 2.1e-2 measured on random data)
//   attention_paged (fp32 SIMT, online softmax)             1e-5 (F32 cache), 1e-4 (others);
//     chunks of >= kAttentionMmaMinQueries go to attention_prefill_mma: 3e-3
//   attention_prefill_mma (fp16 mma, fp32 softmax)          3e-3 (fp16 rounding of q, K, V, P),
//     both kernels (sm_75, sm_80)
//   gdn_recurrent, gdn_chunked                              1e-4 (chunked vs recurrent order)
//   sample: same token as the CPU except where u falls within ~1e-6 of a CDF step;
//   logprobs: 1e-5 absolute, same top ids.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/cuda_device.h"
#include "kernels/ops.h"
#include "kernels/sampling.h"

typedef struct CUstream_st* cudaStream_t;  // same typedef as cuda_runtime.h

namespace pe {
namespace cuda {

using cpu::GdnArgs;  // the CPU structs, with device pointers inside
using cpu::PagedKV;

void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out,
               cudaStream_t stream);

void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
              float* out, cudaStream_t stream);
// z: groups of z_heads rows, z_stride floats apart (0: dense), as cpu::rms_norm_gated.
void rms_norm_gated(const float* x, const float* z, const float* w, int64_t n_rows, int64_t dim,
                    float eps, float* out, cudaStream_t stream, int64_t z_heads = 1, int64_t z_stride = 0);
void l2_norm(float* x, int64_t n_rows, int64_t dim, float eps, float scale, cudaStream_t stream);
// x += r, then out = rms_norm(x): the residual add and the next norm in one launch, the same bits
// as add + rms_norm. out must not alias x or r.
void add_rms_norm(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
                  float* out, cudaStream_t stream);

// Weights: F32, F16, BF16, FP8_E4M3 (block scales), I8 (row scales), NVFP4 (group + global
// scales, cols % 16 == 0): the formats of ops.h, all on both paths.
// n <= 8: GEMV. F32/F16/BF16: fp32 SIMT, several rows per warp, 16-byte loads, short matrices
// split the columns over warps. FP8/I8/NVFP4: mma.sync with the weights decoded to fp16 exactly
// by integer ops and x as an fp16 hi + lo pair (fp32-level accuracy, |x| clamped to 65504), cost
// independent of n (linear_gemv_q.cu). Unaligned or odd shapes take a scalar kernel.
// 9 <= n <= linear_gemv_max_tokens() (32), FP8/I8/NVFP4 where the n <= 8 GEMV takes the weight:
// the quantized GEMV with x rounded to fp16, 16 tokens an mma (linear_gemv_q_wide.cu: speculative
// decoding's verify rows at the decode step's weight bandwidth).
// 9 <= n <= 64, F32/F16/BF16 where rows x cols x n <= 2^28: the n <= 8 GEMV over token groups of
// 8 (a small model's verify rows: launch latency, not the weights, is their cost; linear_gemv.cu).
// Other n > 8: mma.sync m16n8k16 GEMM (fp16 operands converted in shared memory, fp32 accumulation).
// No scratch, except for the sm_90 FP8 GEMM below. x and out must not alias.
// norm: x is a split norm's h (SplitNorm below), each token's sums are scaled by its 1 / rms;
// only where linear_split_norm_supported.
// workspace (optional; linear_workspace_bytes): where it is given and large enough, the device is
// compute capability 9.0 exactly and the build has the sm_90 FP8 GEMM (CMake found CUTLASS; see
// linear_fp8_sm90_available), FP8 weights with 128 x 128 block scales, rows % 4 == 0, cols % 16
// == 0, n >= the FP8 GEMM's token threshold (kFp8GemmMinTokens) and 16-byte aligned x and out run
// W8A8 on wgmma (linear_gemm_fp8_sm90.h: x quantized per token per 128 columns into the workspace,
// the weight read from its row-major copy (WeightView::rowmajor) or else untiled into the
// workspace first, CUTLASS's blockwise-scaled GEMM); every other call ignores
// it. The workspace must not be in use by another call in flight on another stream.
struct SplitNorm;
struct GemmWorkspace {
  void* data = nullptr;  // device memory, 256-byte aligned
  size_t bytes = 0;
};
void linear(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream,
            const SplitNorm* norm = nullptr, const GemmWorkspace* workspace = nullptr);
// Design decision (threshold, tools/gpu/KERNELS.md "Prefill"): from 128 tokens. The untiling costs
// a copy of the weight per call (~0.1 ms for the 27B gate | up on an H100), which the GEMM repays
// many times from a few hundred tokens (gate | up at 512 tokens: 0.185 ms against 1.109). Below 128
// the mma.sync GEMM was taken to be as fast; the engine showed otherwise (steps of 33..127 rows on
// the 27B ran several times slower per token: the step pacer steers clear of them, Model::slow_rows).
// Lowering this to kGemvMaxTokens + 1 wants the op harness run at those n first (a 128-token tile
// then holds fewer rows than the tile).
constexpr int64_t kFp8GemmMinTokens = 128;
// Whether the sm_90 FP8 GEMM is compiled in and the current device is compute capability 9.0.
bool linear_fp8_sm90_available();
// The workspace linear needs for calls of up to n tokens on w (0 where no path would use one:
// not available, another format or shape, n below the threshold). Monotonic in n.
size_t linear_workspace_bytes(int64_t n, const WeightView& w);
// Tuning hook for tools/gpu/bench_kernels and the tests (A/B of the sm_90 FP8 GEMM): variant 0 =
// off (the mma.sync GEMM for every FP8 call), 1 = 128 x 128 x 128 tiles, cluster 1 x 1 (the
// default), 2 = cluster 1 x 2; min_tokens = the threshold (a workspace reserved for a larger one
// may be too small for the calls it lets in: those fall back). Not for use while other threads run
// linear.
void linear_gemm_set_fp8_sm90(int variant, int64_t min_tokens = kFp8GemmMinTokens);
// The fewest tokens the sm_90 FP8 GEMM takes now (kFp8GemmMinTokens unless set above); 0 where it
// does not run (not built, not compute capability 9.0, or switched off).
int64_t linear_fp8_sm90_min_tokens();
// The mlp's gate | up GEMV with the swiglu in its epilogue: w holds the gate rows [0, inter) and
// the up rows [up0, up0 + inter); out[n, inter] = silu(x W_gate^T) * (x W_up^T), without the
// [n, 2 inter] round trip or a launch: the same bits as linear into [n, rows] followed by swiglu
// where that GEMV also takes >= 16 rows per warp (tiled at 16 / 32 rows, or >= 2048 rows).
// Supported for n <= 8 and quantized weights the GEMV takes at >= 16 rows per warp (up0 a multiple
// of 8, of the tile rows when tiled and of the FP8 block); linear_swiglu fails otherwise. (The
// GEMV of 9..32 tokens has no fused epilogue: callers take linear, then swiglu.)
bool linear_swiglu_supported(const float* x, int64_t n, const WeightView& w, int64_t up0, int64_t inter);
void linear_swiglu(const float* x, int64_t n, const WeightView& w, int64_t up0, int64_t inter, float* out,
                   cudaStream_t stream, const SplitNorm* norm = nullptr);
// The residual add and the rms norm after it split over the two decode GEMVs around them (in place
// of add_rms_norm's launch between them):
// - the producer, linear_add_norm (the mixer's out projection, the mlp's down), adds its output
//   to the residual rows: x += in W^T; h = x * (offset ? 1 + w : w), the norm's weight but not its
//   1 / rms yet; and per token one partial sum of x^2 per row block of its GEMV, in
//   partial[token * parts + block] (n * split_norm_partial_floats(dim) floats), setting parts;
// - the consumer, linear or linear_swiglu with `norm` (the next in projection, gate | up), reads h
//   and multiplies each token's sums by 1 / sqrt(sum of its partials / dim + eps).
// Summed in a fixed order (no atomics): deterministic. x and h match add_rms_norm's x and its
// output before the 1 / rms (the same fp32 add); the consumer's output matches add_rms_norm +
// linear within the GEMV's 1e-5 (the 1 / rms applied after the sum instead of before).
// Supported (both sides) for n <= 8 (not the GEMV of 9..32 tokens) and the weights of the
// quantized GEMV (FP8 / I8 / NVFP4);
// the producer's weight has dim rows.
struct SplitNorm {
  float* x = nullptr;        // [n, dim] residual rows
  float* h = nullptr;        // [n, dim] x * norm weight (the consumer's input)
  const float* w = nullptr;  // [dim] norm weight
  bool offset = true;        // the weight applied as 1 + w (Qwen3.5's norms)
  float eps = 1e-6f;
  int64_t dim = 0;
  float* partial = nullptr;  // [n, parts]
  int parts = 0;             // set by linear_add_norm
};
int64_t split_norm_partial_floats(int64_t dim);
bool linear_split_norm_supported(const float* x, int64_t n, const WeightView& w);
void linear_add_norm(const float* in, int64_t n, const WeightView& w, SplitNorm& norm, cudaStream_t stream);
// The embedding as a split norm's producer: norm.x = the rows embedding gives, norm.h and the
// partial sums of x^2 as linear_add_norm leaves them (sets parts), so the first layer's input norm
// is applied by its in projection instead of a launch of its own. n <= 65535 tokens.
void embedding_norm(const WeightView& table, const int32_t* ids, int64_t n, SplitNorm& norm, cudaStream_t stream);
// The GEMV tile layout of quantized device weights (ops.h WeightView::tile, linear_common.cuh
// tiled_offset): every linear path reads it; the quantized GEMV streams each step's 4 KB in one run.
// gemv_tile_rows: the tile rows R for w (the quantized GEMV's rows per warp for its height: 32, 16
// or 8), 0 where w is not FP8 / I8 / NVFP4 or its row bytes are not a multiple of 4096 / R.
// tile_weight: src.data (row-major, on the device) copied to dst in the layout of R = tile rows;
// dst holds tiled_weight_bytes (rows rounded up to R), zero-filled; returns src's view on dst with
// its tile set (the scales stay src's).
int gemv_tile_rows(const WeightView& w);
size_t tiled_weight_bytes(const WeightView& w, int tile);
WeightView tile_weight(const WeightView& src, void* dst, int tile, cudaStream_t stream);
// Tuning hook for tools/gpu/bench_kernels (A/B of the GEMM tiles): from this many tokens the GEMM
// uses 128-token tiles instead of 64, every weight format (default 128; linear_gemm.cu). Not for
// use while other threads run linear.
void linear_gemm_set_big_tile_tokens(int64_t n);
// Tuning hook for tools/gpu/bench_kernels and the tests (A/B of the quantized GEMV past 8 tokens):
// linear takes the quantized GEMV up to this many tokens, 8 .. kGemvMaxTokens (clamped; default
// kGemvMaxTokens; 8: every n > 8 on the GEMM, as before linear_gemv_q_wide.cu). The sm_90 FP8
// GEMM's threshold stays above kGemvMaxTokens. Not for use while other threads run linear.
constexpr int kGemvMaxTokens = 32;
void linear_gemv_set_max_tokens(int n);
int linear_gemv_max_tokens();
// The quantized GEMV's (FP8/I8/NVFP4, n <= 8; pdl and wide_split also 9..32) tuning. The defaults are the fastest measured on the
// 27B decode step (tools/gpu/KERNELS.md, "Quantized GEMV"); tools/gpu/bench_kernels and the tests
// set others through linear_gemv_set_tuning. Every setting gives the same results within the GEMV
// tolerance. Not for use while other threads run linear.
struct GemvTuning {
  int rows_per_warp = 0;               // 1, 2 or 4 groups of 8 rows per warp; 0: by the row count
  int64_t staged_x_max_bytes = 32768;  // x split once per block into shared memory up to this
                                       // size (<= 128 KB), else per warp in registers; 0: never
  bool fp8_cvt = true;                 // FP8 decoded by cvt.rn.f16x2.e4m3x2 where the GPU has it
  int fp8_stage_one_wave = 2;          // FP8 by cvt at 32 rows per warp: x staged only where the
                                       // launch is one wave: 1 where the row blocks fit in one,
                                       // 2 also where stream-K balance makes one; 0: always (past
                                       // one wave x in registers is faster for FP8; I8 and NVFP4
                                       // are faster staged on every shape)
  int min_blocks = 2;                  // staged kernels' register budget: 2 or 3 blocks per SM
  bool pdl = true;                     // sm_90+: launched as a programmatic dependent of the
                                       // previous kernel, its first weight steps loaded while
                                       // that kernel runs
  int pdl_prefetch_steps = 1;          // with pdl, tiled weights: the steps per warp prefetched
                                       // to L2 before waiting for the previous kernel
  bool stream_k = true;                // where the row blocks leave SMs idle and rows have at
  int stream_k_min_steps = 48;         // least this many column steps (128 FP8 columns at 32 rows
                                       // per warp): one block per slot, each a share of the row
                                       // blocks x column steps, split rows summed across blocks
  int stream_k_balance_pct = 100;      // stream-K also where the row blocks take more than one
                                       // wave and the last is at most this % full (0: never, 100:
                                       // wherever it is part full): one wave of equal shares
  int stream_k_quantum = 8;            // stream-K block boundaries on multiples of this many
                                       // steps; 0: 1 (fill), 8 = the warps (balance)
  int roll = 1;                        // tiled weights, the next step loaded in halves during this
                                       // step's math (gemv_q_kernel's kRoll): 0 never, 1 I8 only
                                       // (faster there, slower for FP8), 2 every dtype
  int preload = 2;                     // 1, without roll: the warp's first step loaded into
                                       // registers before pdl_wait (as roll does; pdl_prefetch_steps
                                       // then count from the second); 2: also each later row
                                       // block's first step, before the previous one's sums (roll
                                       // too)
  bool stream_k_spin = true;           // a split row block summed by its first block, from the
                                       // later blocks' parts, published at their start as marked
                                       // words (not waited for); only where the grid is resident
                                       // at once. false: the last block to finish sums (a counter)
  int x_early = 3;                     // after pdl_wait, loads in flight together: 1 the split
                                       // norm's partials (one a thread) with x's; 2 two of x's
                                       // chunks a thread where x is staged
  int wide_split = 0;                  // 9..32 tokens (linear_gemv_q_wide.cu): column splits per
                                       // block row; 0: as many as fill one wave of the GPU
  int wide_min_blocks = 0;             // 17..32 tokens: the register budget, 1 or 2 blocks per SM;
                                       // 0: 1 for NVFP4 (it spills at 2), 2 for FP8 / I8
};
void linear_gemv_set_tuning(const GemvTuning& t);
GemvTuning linear_gemv_tuning();

// pos: device array [n_tokens]. rot_dim <= 256.
void rope_neox(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t head_dim,
               int64_t rot_dim, const int32_t* pos, float theta, cudaStream_t stream);

// Cache dtypes F32, F16, BF16, FP8_E4M3, I8 (+ k_scale/v_scale), NVFP4 (+ scales, head_dim % 16
// == 0): the bytes and scales written equal the CPU kv_write's (kv_codec.cuh), so pages move
// between the backends unchanged. page_table: device array. Cache pointers 16-byte aligned.
void kv_write(const PagedKV& kv, const int32_t* page_table, int64_t start_pos, int64_t n,
              const float* k, const float* v, cudaStream_t stream);

// Scratch for attention_paged with these sizes (0 when the call needs none): partial softmax
// states of the split-K kernels, n_splits * n_q * n_heads * (head_dim + 2) floats. The bound uses
// n_splits = min(256, ceil((q_start_pos + n_q) / 32)) (the launch picks at most that, by the
// GPU's size), so size it for the longest context of the call. Chunks of >= kAttentionMmaMinQueries
// queries: the sm_80 prefill kernel's key split (attention_prefill_scratch_bytes, by the current
// device; with less, it splits less).
size_t attention_paged_scratch_bytes(int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                                     int64_t n_kv_heads, int64_t head_dim);
// Every cache dtype of kv_write; head_dim <= 256. Decode (n_q <= 16, head_dim % 8 == 0, 16-byte
// aligned q and cache): one block per (kv head, query block, key split), all q heads of the
// GQA group share each K/V load, splits fill the GPU, a second kernel combines the partial
// softmaxes (attention_decode.cu). Otherwise (prefill): tiles of queries x keys with an online
// softmax, fp32 SIMT (attention.cu); chunks of >= kAttentionMmaMinQueries queries on shapes
// attention_prefill_mma supports run there (tensor cores, its tolerance). Quantized caches are
// dequantized exactly as on the CPU (same values), so their tolerance is that of the F16 cache.
constexpr int64_t kAttentionMmaMinQueries = 64;
// Tuning hook for tools/gpu/bench_kernels and the tests: the tensor-core decode kernel (F16, FP8,
// I8, NVFP4 caches) for every dtype. -1 = the per-dtype default: splits of at most 32 keys (1K
// context at batch 1 on an H200) on the pairs kernel, longer ones on the kernel measured fastest
// for the dtype and the call's longest context (F16 and FP8: 0 up to 4K keys, then 1; I8: 0;
// NVFP4: 2). 0 = the first window's cache rows resolved and each warp's first K / V step loaded
// before the kernel waits for the one before it; 1 = the rows resolved after that wait, their
// page-table loads under the Q setup; 2 = for NVFP4 caches, 1 with whole-chunk K / V / scale loads
// a step ahead, exchanged through shared memory, and P scaled in the mma B layout (the other
// dtypes run 1); 3 = splits of at most 32 keys on the pairs kernel (two warps share each 16-key
// step, half its dims each; attention_decode_pairs.cu), longer splits as 2. Same results in every
// variant, bit for bit, except the pairs kernel (the scores summed in two halves: within float
// rounding). Values outside -1..kAttentionDecodeVariants-1 are clamped. Not for use while other
// threads run attention_paged. The kernels these were measured against: tools/gpu/lab.
constexpr int kAttentionDecodeVariants = 4;
void attention_decode_set_variant(int variant);
// Tuning hook (bench_kernels, tests): the fewest keys a decode split handles (<= 0: the default,
// 32; at least 16). Same results for any value within the op's tolerance (the splits' partial
// states are summed in another grouping). Not for use while other threads run attention_paged.
void attention_decode_set_min_split_keys(int keys);
void attention_paged(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                     const PagedKV& kv, const int32_t* page_table, float scale, const float* gate,
                     float* out, void* scratch, size_t scratch_bytes, cudaStream_t stream);

// Prefill attention on the fp16 tensor cores (attention_prefill_mma.cu): exactly the semantics of
// attention_paged (causal, GQA, optional sigmoid gate, every cache dtype), flash style: blocks of
// 64 queries of one head, K/V tiles decoded to fp16 in shared memory, S = Q K^T and O += P V by
// mma.sync (fp32 accumulation), online softmax in fp32 registers. One launch; the sm_80 kernel
// (below) may split the keys into scratch (attention_prefill_scratch_bytes) and combine the parts
// in a second: with less scratch than that it splits less or not at all (never fails).
// Tolerance vs the CPU twin: normalized error 3e-3 (Q * scale, K, V and P rounded to fp16; expected
// ~1e-4 .. 1e-3; measured on the H200 up to 1.2e-3).
// Supported: n_q >= 1 (at most 65535 * 64), head_dim % 8 == 0 and <= 256 (run padded to 64, 128 or
// 256), NVFP4 head_dim % 16 == 0, cache pointers 16-byte aligned; q, gate, out need only float
// alignment. attention_prefill_mma throws pe::Error (PE_ERR_UNSUPPORTED) on shapes the check
// refuses, PE_ERR_INVALID_ARGUMENT on bad head counts, missing scales or positions >= 2^31.
bool attention_prefill_mma_supported(int64_t n_q, const PagedKV& kv);
void attention_prefill_mma(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                           const PagedKV& kv, const int32_t* page_table, float scale, const float* gate,
                           float* out, void* scratch, size_t scratch_bytes, cudaStream_t stream);
// Where attention_prefill_sm80_applies (F16 / BF16 cache, a device of compute capability >= 8.0
// running code built for it, enough shared memory to opt in to: H100 / H200 for head_dim > 128),
// attention_prefill_mma runs attention_prefill_sm80.cu instead: 128-query blocks, 64-key tiles
// double-buffered by cp.async, one barrier per tile. Same semantics and tolerance (the same fp16
// roundings). On a device of compute capability 9.0 running a build with sm_90a
// (attention_prefill_sm90_applies) the same calls run attention_prefill_sm90.cu's kernel: the
// same blocks, tiles, split and roundings on wgmma. Tuning hook for tools/gpu/bench_kernels and
// the tests: variant 0 = the sm_75 kernel for every call, 1 = the sm_80 kernel where it applies,
// 2 = the sm_90a kernel where it applies, else as 1 (the default). Not for use while other
// threads run attention.
constexpr int kAttentionPrefillVariants = 3;
void attention_prefill_set_variant(int variant);
bool attention_prefill_sm80_applies(const PagedKV& kv);
bool attention_prefill_sm90_applies(const PagedKV& kv);
bool attention_prefill_sm90_built();  // the build has the sm_90a kernel (its architectures include 90)
// Key split of the sm_80 kernel (flash-decoding style): where heads x 128-query tiles fill less
// than 2 waves of the GPU (prefill chunks of 64 .. ~1K queries at depth beside decoding requests),
// each query tile's keys are cut into S contiguous parts run as separate blocks, which write
// unnormalized softmax states (m, l, O) to scratch; attention_paged's combine kernel merges them
// and applies the gate. Results: those of no split within the fp16 rounding of P (each part
// rescales by its own running max). Rule in attention_prefill_sm80.cu (at most 16 parts, each
// >= 4 tiles of 64 keys, the grid <= 3 waves). The scratch a call of these sizes takes on the
// current device (0 where it does not split or the sm_80 kernel cannot run this head_dim); part of
// attention_paged_scratch_bytes. Tuning hook (bench_kernels, tests): splits 0 = the rule (the
// default), 1 = never split, n in 2..16 = exactly n parts for every sm_80 call (parts past a
// query tile's keys write empty states), scratch permitting. Not for use while other threads run
// attention.
size_t attention_prefill_scratch_bytes(int64_t n_q, int64_t q_start_pos, int64_t n_heads, int64_t head_dim);
void attention_prefill_set_splits(int splits);

// K <= 16; state: the ring [K, C] of ops.h. One launch (the ring's readers of a channel write
// its new rows, after their reads); u, out and state must not alias.
void conv1d_causal(const float* u, int64_t n, int64_t u_stride, int64_t C, const float* w,
                   int64_t K, int64_t pos0, float* state, float* out, cudaStream_t stream);

void gdn_gates(const float* a, const float* b, int64_t ab_stride, int64_t n, int64_t n_heads,
               const float* A_log, const float* dt_bias, float* g, float* beta,
               cudaStream_t stream);

// dk <= 256 (state columns are split over blocks; the state is read and written once per call).
void gdn_recurrent(const GdnArgs& a, cudaStream_t stream);
// Chunk-parallel WY/UT form, fp32; equal to gdn_recurrent up to rounding. chunk <= 64, dk <= 128.
// Two launches per segment of up to 32 chunks: the per-chunk triangular solve and decayed Q K^T
// for all chunks at once, then the chunks in order with the state split by columns over blocks.
// Scratch: gdn_chunked_scratch_bytes(n, Hv, chunk) (T', P and gamma of every chunk of a segment,
// (2 * 64 * 64 + 64) floats per chunk and value head; 50 MB for the 27B shape at n >= 2048).
// A smaller scratch works if it holds at least one chunk (Hv * 33 KB): the call then runs more,
// shorter segments. The state carries over between segments and calls.
size_t gdn_chunked_scratch_bytes(int64_t n, int64_t Hv, int64_t chunk = 64);
void gdn_chunked(const GdnArgs& a, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                 int64_t chunk = 64);
// Convenience form for tests and tools: the one op that allocates, its scratch from the
// stream-ordered pool (cudaMallocAsync / cudaFreeAsync on `stream`). The model passes scratch.
void gdn_chunked(const GdnArgs& a, cudaStream_t stream, int64_t chunk = 64);

void swiglu(const float* gate_up, int64_t n, int64_t I, float* out, cudaStream_t stream);
void add(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream);

// Sampling on device logits [V] (not modified). The result id is written to *token (device).
// Scratch: sample_scratch_bytes(V). u as in sampling.h (the caller draws uniform_at).
// Penalties are applied by the caller on the CPU side for now (not on device yet).
size_t sample_scratch_bytes(int64_t V);
void sample(const float* logits, int64_t V, const SamplingConfig& p, float u, int32_t* token,
            void* scratch, size_t scratch_bytes, cudaStream_t stream);
// Whether sample takes the two-pass argmax for p (greedy or top_k 1, vocabularies from 4096; smaller
// ones: one block's walk a row). Then sample_greedy_rows does `rows` consecutive logits rows
// [rows, V] in the same two launches whatever the count (a batch's decode rows, a verify's rows):
// token[i] = sample's id for row i; rows 1 .. greedy_rows_max(V, scratch_bytes).
bool greedy_two_pass(const SamplingConfig& p, int64_t V);
int64_t greedy_rows_max(int64_t V, size_t scratch_bytes);
void sample_greedy_rows(const float* logits, int64_t V, int64_t rows, int32_t* token, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream);

// In place on device logits [V]: -inf where bit (t % 32) of the device mask allowed[t / 32] is
// clear (cpu::apply_token_mask's twin; the caller skips masks that allow no token, see
// token_mask_allows_any).
void apply_token_mask(float* logits, int64_t V, const uint32_t* allowed, cudaStream_t stream);

// Device outputs: *token_logprob (of the id at *token, device memory: a sampled id need not come
// back to the host first), top_ids[n_top], top_logprobs[n_top] (n_top <= 64).
void logprobs(const float* logits, int64_t V, const int32_t* token, int32_t n_top, float* token_logprob,
              int32_t* top_ids, float* top_logprobs, cudaStream_t stream);

}  // namespace cuda
}  // namespace pe

// ---- GDN decode step batched over sequences (kernels/cuda/gdn_decode.cu) ----
namespace pe {
namespace cuda {

using cpu::GdnDecodeArgs;

// The device twin of cpu::gdn_decode (ops.h): conv step + SiLU with the conv ring's new row
// written, q/k l2 norms, gates and the delta rule step of n_seqs sequences (one token each, each
// in its own state slot) in one launch. slots, pos: device arrays; slots distinct within a call.
// dk <= 256, K <= 16, n_seqs and Hv <= 65535. The recurrent state is read and written once (the
// op is bound by it). The state, the slots and the positions are read before the launch waits
// for the kernel before it (programmatic dependent launch, sm_90): no kernel of the last few
// launched before may write them (the model's last writer of a slot's state is the previous
// forward, which the host waited for; tests and the pools write them by copies), except in a
// chained call (a.chained: a plain launch, after the call that wrote its input slots).
// rows / out_slots / strides as ops.h (device arrays).
// Tolerance against the CPU twin (test_backend_ops): normalized error 1e-5 on out and on the
// recurrent state after several steps with the state carried (measured <= 3e-7 on H200, sm_90
// SASS and compute_75 PTX JIT); the conv state is copied exactly. The fused gated norm (norm_w
// set) needs dv <= kGdnDecodeFusedNormMaxDv (same tolerance).
constexpr int64_t kGdnDecodeFusedNormMaxDv = 128;
void gdn_decode(const GdnDecodeArgs& a, cudaStream_t stream);

// The device twin of cpu::gdn_chain (ops.h): a verify step's chained sequences in two launches
// whatever their token counts (gdn_decode's chained calls took one per token position): the conv
// over every token with each out slot's ring written (a thread per channel and sequence: the live
// slot's old taps are read by the thread that writes its ring last), then the recurrent steps of
// each sequence's tokens in turn with the state kept in registers (read once, written to each
// token's out slot). Device int arrays; conv_out is required. Same limits and tolerance as
// gdn_decode.
using cpu::GdnChainArgs;
void gdn_chain(const GdnChainArgs& a, cudaStream_t stream);

}  // namespace cuda
}  // namespace pe
