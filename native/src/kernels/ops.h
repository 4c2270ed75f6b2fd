// CPU reference ops of the Qwen3.5 hybrid forward.
//
// Every op works on raw pointers to row-major fp32 activations (the CPU backend computes in fp32:
// it is the reference for every other backend). Weights may be stored smaller (WeightView).
// Ops are multithreaded through core/threadpool.h where the work is large enough; none allocates
// on the heap per call except where noted. x and out may alias only where a comment says so.
// Each op lives in its own file under kernels/cpu/ and has a C-level test against a naive
// reference in native/tests/test_ops_*.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace pe {

// A 2-D weight matrix [rows = out_features, cols = in_features], row-major.
// FP8_E4M3 weights carry block scales: W[i,j] = fp8(W[i,j]) * block_scale[(i/block)*n_col_blocks + j/block]
// with n_col_blocks = ceil(cols / block) (the checkpoints' weight_scale_inv, converted to fp32).
// I8 (on-load quantization, per output channel): W[i,j] = int8(W[i,j]) * row_scale[i].
// NVFP4 (on-load quantization): data holds two e2m1 values per byte (even column in the low
// nibble), row stride cols / 2 bytes, cols a multiple of 16; group_scale holds one fp8 e4m3 scale
// per 16 consecutive values of a row ([rows, cols / 16] bytes):
// W[i,j] = e2m1(W[i,j]) * fp8(group_scale[i * cols/16 + j/16]) * global_scale.
struct WeightView {
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
  const float* block_scale = nullptr;  // FP8 only
  int64_t block = 128;
  const float* row_scale = nullptr;      // I8 only
  const uint8_t* group_scale = nullptr;  // NVFP4 only
  float global_scale = 1.0f;             // NVFP4 only
  // CUDA device weights only (FP8, I8, NVFP4 data; the scales stay row-major): 0 row-major, or
  // the rows R (8, 16 or 32) of the GEMV tile layout, in which the bytes of every R rows x
  // 4096 / R bytes of a row block lie in one 4 KB tile, in the order the quantized GEMV's lanes
  // load them (cuda/linear_common.cuh, tiled_offset; cuda_ops.h, tile_weight).
  int32_t tile = 0;
  // CUDA FP8 weights in the tile layout only: the same matrix row-major, kept where the engine
  // keeps it for the sm_90 W8A8 prefill GEMM (model option prefill_weight_copy), else null.
  const void* rowmajor = nullptr;
};

namespace cpu {

// out[n, table.cols] = table[ids[i], :] converted to fp32. Ids are checked by the caller.
void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out);

// RMSNorm over rows of `dim`: y = x * rsqrt(mean(x^2) + eps) * (offset ? (1 + w) : w).
// x and out may alias. Used per token (dim = H) and per head (dim = head_dim).
void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
              float* out);

// Gated RMSNorm of the GDN output: y = x * rsqrt(mean(x^2) + eps) * w * silu(z), rows of `dim`.
// x and out may alias. z's rows come in groups of z_heads (a token's heads, contiguous), group g
// at z + g * z_stride (z_stride 0: z_heads * dim, dense), so z may be a projection's strided part.
void rms_norm_gated(const float* x, const float* z, const float* w, int64_t n_rows, int64_t dim,
                    float eps, float* out, int64_t z_heads = 1, int64_t z_stride = 0);

// Residual add fused with the next RMSNorm: x += r, then out = rms_norm(x, w, eps, offset) over
// rows of `dim`. Bit-identical to add(x, r, n_rows * dim, x) followed by rms_norm(x, ..., out).
// out must not alias x or r.
void add_rms_norm(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps,
                  bool offset, float* out);

// out[n, w.rows] = x[n, w.cols] * W^T, fp32 accumulation; W converted inside the kernel
// (F32, F16, BF16, FP8_E4M3 with block scales). x and out must not alias.
void linear(const float* x, int64_t n, const WeightView& w, float* out);

// x as the W8A8 FP8 GEMM sees it (the CPU twin of the sm_90 GEMM's quantizer, cuda_ops.h linear):
// per token t and group g of 128 columns, s = max(amax(x[t, group]), 1e-10) / 448 and
// out = e4m3(x / s) * s, e4m3 rounded to nearest even with saturation at +-448, the divisions
// rounded to nearest. linear(out) is then the GEMM's reference. x and out may alias.
void fp8_group_quantize(const float* x, int64_t n, int64_t cols, float* out);

// Partial NeoX RoPE in place on x[n_tokens, n_heads, head_dim] (row stride `token_stride`
// floats between tokens, heads contiguous). Only the first rot_dim dims rotate:
// for i < rot_dim/2: angle = pos * theta^(-2i/rot_dim),
// y[i] = x[i] cos - x[i + rot_dim/2] sin, y[i + rot_dim/2] = x[i + rot_dim/2] cos + x[i] sin.
void rope_neox(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t head_dim,
               int64_t rot_dim, const int32_t* pos, float theta);

// The inputs of gated attention out of the projection rows of n_tokens tokens (positions pos[t]):
//   q[t, h]    = rope(rms_norm(qg[t, h, 0:D]) * (1 + q_norm))   h < Hq  (qg: per head D query
//   gate[t, h] = qg[t, h, D:2D]                                          values, then D gate values)
//   k[t, h]    = rope(rms_norm(k_in[t, h, :]) * (1 + k_norm))   h < Hkv
//   v[t, h]    = v_in[t, h, :]
// rms_norm with eps, rope = rope_neox(rot_dim, theta). Input rows are *_stride floats apart (heads
// contiguous), outputs dense [n_tokens, heads, D]. Same bits as those copies, rms_norm and rope_neox
// in that order. k and v may be updated in place (k == k_in with k_stride == Hkv * D; same for v);
// q and gate must not alias qg.
// Ungated attention (the DFlash draft's Qwen3 layers): gated = false, qg holds D query values per
// head (head h at qg + h * D) and gate is not written; norm_offset = false applies the head norms
// as w instead of 1 + w. Hq = 0: keys and values only (context rows that ask no query).
struct AttnInputArgs {
  const float* qg; int64_t qg_stride;
  const float* k_in; int64_t k_stride;
  const float* v_in; int64_t v_stride;
  const float* q_norm; const float* k_norm;
  const int32_t* pos;
  int64_t n_tokens, Hq, Hkv, D, rot_dim;
  float eps, theta;
  float* q; float* gate; float* k; float* v;
  bool gated = true;
  bool norm_offset = true;
};
void attention_inputs(const AttnInputArgs& a);

// Paged KV cache of one attention layer: page p holds page_size tokens, each
// [n_kv_heads, head_dim] for K and for V, stored as `dtype` (F32, F16, BF16, FP8_E4M3, I8 with a
// scale per token per head, NVFP4 with a scale per 16 values: kernels/cpu/kv_codec.h).
// Token t of a sequence lives in page page_table[t / page_size], row t % page_size.
struct PagedKV {
  DType dtype = DType::F32;
  void* k = nullptr;  // [n_pages, page_size, n_kv_heads] rows of head_dim values
  void* v = nullptr;
  float* k_scale = nullptr;  // I8 / NVFP4: fp32 scales of each row (kv_row_format().scales)
  float* v_scale = nullptr;
  int64_t page_size = 0, n_kv_heads = 0, head_dim = 0;
};

// Writes k, v [n, n_kv_heads, head_dim] for token positions start_pos .. start_pos + n - 1.
void kv_write(const PagedKV& kv, const int32_t* page_table, int64_t start_pos, int64_t n,
              const float* k, const float* v);

// Causal GQA attention of n_q new queries q[n_q, n_heads, head_dim] at positions
// q_start_pos .. q_start_pos + n_q - 1 over the sequence's cached keys 0 .. q_start_pos + n_q - 1
// (already written with kv_write). Query head h uses KV head h / (n_heads / n_kv_heads).
// softmax(scale * q.k) in fp32. If gate is not null ([n_q, n_heads, head_dim], same layout as
// out) the output is multiplied by sigmoid(gate). out [n_q, n_heads, head_dim].
void attention_paged(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                     const PagedKV& kv, const int32_t* page_table, float scale, const float* gate,
                     float* out);

// Causal depthwise conv1d + SiLU over n rows of C channels with a kernel of width K, u's rows at
// absolute positions pos0 .. pos0 + n - 1 (pos0 >= 0). u [n, C] (row stride u_stride), w [C, K].
// state [K, C] is a ring of raw inputs: row p % K holds the input of position p. With
// x(p) = u[p - pos0] for p >= pos0, else state[p mod K] (a new sequence's ring is zeros, so
// positions < 0 read zeros): out[t, c] = silu(sum_j w[c, j] * x(pos0 + t - (K-1) + j)[c]), taps
// j = 0 .. K-1 in order. Afterwards row p % K holds input p for every p in [pos0, pos0 + n) (for
// n >= K: the last K); other rows keep theirs. out [n, C] dense. Works for n == 1 (decode step)
// and n > 1 (prefill); pieces of one sequence at consecutive positions give the same bits.
void conv1d_causal(const float* u, int64_t n, int64_t u_stride, int64_t C, const float* w, int64_t K,
                   int64_t pos0, float* state, float* out);

// In place: x[n_rows, dim] -> x / sqrt(sum(x^2) + eps) * scale.
void l2_norm(float* x, int64_t n_rows, int64_t dim, float eps, float scale);

// GDN gates per token t and value head h: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias).
// a, b [n, n_heads] (row stride ab_stride); outputs g, beta [n, n_heads] dense.
void gdn_gates(const float* a, const float* b, int64_t ab_stride, int64_t n, int64_t n_heads,
               const float* A_log, const float* dt_bias, float* g, float* beta);

// Gated delta rule over n tokens of one sequence, state S [Hv, dk, dv] fp32 in/out.
// q, k [n, Hk, dk] (row stride qk_stride floats; q already l2-normed and scaled, k l2-normed),
// v [n, Hv, dv] (row stride v_stride), g, beta [n, Hv]; value head h uses key head h / (Hv / Hk).
// Per token: S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q. out [n, Hv, dv] dense.
struct GdnArgs {
  const float* q; const float* k; int64_t qk_stride;
  const float* v; int64_t v_stride;
  const float* g; const float* beta;
  int64_t n, Hk, Hv, dk, dv;
  float* state;
  float* out;
};
// Token by token (decode, and the reference).
void gdn_recurrent(const GdnArgs& a);
// Chunked form (chunk tokens per block, 64 by default; equal to gdn_recurrent in exact arithmetic).
void gdn_chunked(const GdnArgs& a, int64_t chunk = 64);

// SwiGLU: gate_up [n, 2I] (gate in the first I columns, up in the next I) -> out [n, I] =
// silu(gate) * up.
void swiglu(const float* gate_up, int64_t n, int64_t I, float* out);

// out[i] = a[i] + b[i] (residual add); out may alias a.
void add(const float* a, const float* b, int64_t n, float* out);

}  // namespace cpu
}  // namespace pe

// ---- GDN decode step batched over sequences (kernels/cpu/gdn_decode.cpp) ----
namespace pe {
namespace cpu {

// One new token for each of n_seqs sequences, each with its own state slot: per sequence exactly
// what the model does for a 1-token chunk, i.e. conv1d_causal (state updated) + SiLU, q
// l2-normed and scaled by 1/sqrt(dk), k l2-normed (eps 1e-6), gdn_gates, gdn_recurrent.
// conv_dim C = 2*Hk*dk + Hv*dv; qkv [n_seqs, C] holds the raw in_proj_qkv rows (q | k | v);
// a, b [n_seqs, Hv] the raw in_proj_a / in_proj_b rows; conv_w [C, K] (K <= 16); A_log, dt_bias [Hv].
// Sequence i's token is at position pos[i] >= 0 and uses slot s = slots[i]: conv ring [K, C]
// (row p % K holds the raw input of position p, conv1d_causal) at conv_state + s*conv_slot_stride,
// of which the step reads the rows of positions pos[i] - K + 1 .. pos[i] - 1 and writes row
// pos[i] % K, recurrent state [Hv, dk, dv] at rec_state + s*rec_slot_stride
// (the strides are free: a pool that keeps all layers of a slot together passes pointers offset to
// the layer and the whole slot size as stride). Slots must be distinct within a call.
// out [n_seqs, Hv, dv] dense (the recurrent output o, before the gated output norm).
struct GdnDecodeArgs {
  int64_t n_seqs;
  const float* qkv;
  const float* a;
  const float* b;
  const float* conv_w;
  const float* A_log;
  const float* dt_bias;
  const int32_t* slots;
  const int32_t* pos;
  float* conv_state;
  int64_t conv_slot_stride;
  float* rec_state;
  int64_t rec_slot_stride;
  int64_t Hk, Hv, dk, dv, K;
  float* out;
  // Optional: the gated RMSNorm that follows the GDN core, fused (norm_w != nullptr): out row
  // (i, h) = rms_norm_gated(o, z + i * z_stride + h * dv, norm_w, norm_eps).
  const float* z = nullptr;
  int64_t z_stride = 0;
  const float* norm_w = nullptr;
  float norm_eps = 0.0f;
  // Optional, for a chunk's tokens one call each (a speculative verify, whose every position's
  // state goes to a slot of its own): item i reads token row rows[i] (default i) of qkv, a, b, z
  // and writes out row rows[i]; qkv_stride / ab_stride are the row strides of qkv / a and b (0:
  // dense, C / Hv); out_slots[i] (default slots[i], in place) is the slot that receives item i's
  // updated conv ring (all K rows) and recurrent state, slots[i] then left as it was. Out slots
  // must be distinct within a call and differ from every other item's slot.
  const int32_t* rows = nullptr;
  int64_t qkv_stride = 0, ab_stride = 0;
  const int32_t* out_slots = nullptr;
  // The call reads states the call before it wrote (CUDA: no programmatic early start).
  bool chained = false;
};
// Same bits as the per-sequence ops (it calls conv1d_causal, l2_norm and gdn_gates, and repeats
// gdn_recurrent's loops, then rms_norm_gated when fused); the recurrent step runs in parallel
// over (sequence, value head). Uses the thread-local scratch slots 0 and 7 (kernels/cpu/cpu_util.h).
void gdn_decode(const GdnDecodeArgs& a);

// A verify step's chained sequences in one op: sequence i's n_tok[i] >= 1 tokens at token rows
// row0[i] + t of qkv / a / b (row strides qkv_stride, ab_stride: 0 dense), positions pos0[i] + t,
// run as gdn_decode's chained calls (rows / out_slots, no gated norm): token t reads the states
// token t - 1 left (slots[i]'s at t = 0) and its updated conv ring (all K rows) and recurrent
// state go to out_slots[out_off[i] + t]; out row row0[i] + t gets its o. Out slots distinct, and
// distinct from every slots[j] but at a sequence's own last token (the live slot, in place).
// conv_out: scratch [rows, C] at the tokens' rows (the CUDA op's conv + SiLU outputs; may be null
// on the CPU). The CPU op is the chained calls themselves.
struct GdnChainArgs {
  int64_t n_seqs;
  const float* qkv;
  int64_t qkv_stride;
  const float* a;
  const float* b;
  int64_t ab_stride;
  const float* conv_w;
  const float* A_log;
  const float* dt_bias;
  const int32_t* row0;
  const int32_t* n_tok;
  const int32_t* pos0;
  const int32_t* slots;
  const int32_t* out_off;
  const int32_t* out_slots;
  float* conv_state;
  int64_t conv_slot_stride;
  float* rec_state;
  int64_t rec_slot_stride;
  int64_t Hk, Hv, dk, dv, K;
  float* out;
  float* conv_out;
};
void gdn_chain(const GdnChainArgs& a);

}  // namespace cpu
}  // namespace pe
