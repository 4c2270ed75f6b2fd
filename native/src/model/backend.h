// The op interface the Qwen3.5 forward (qwen35_forward.cpp) is written against, once for every
// device. A backend places weights, runs ops on its device's memory, and keeps what is its own:
// scratch memory, the step's index upload, sampling and (CUDA) graph capture.
//
// Design decision (fused ops): every fused op the GPU uses is an op here, with a default that
// composes the plain ops (backend.cpp): the CPU backend runs those compositions, so the CPU model
// computes the same graph as the GPU, op for op, and each CUDA fusion is tested against its CPU
// composition (native/tests/test_backend_ops.cpp). Whether a fusion applies to a shape (split
// norm, swiglu epilogue, fused gated norm) is the backend's decision inside the op: the forward
// issues the same op sequence on every device.
//
// Design decision (split norm): the residual add and the RMSNorm after it couple two projections
// (cuda_ops.h SplitNorm: the producer adds into the residual, the consumer applies 1 / rms).
// project_add_norm returns a NormState the forward hands to the next projection: empty when h
// holds the normed rows (always on the CPU), else the backend's pending norm.
//
// Tensor parallel: the all-reduce of a sharded out / down projection goes between the producer's
// GEMV and the residual add, so a backend cannot fuse the add into that GEMV there
// (Qwen35Model::residual_add is the one place that calls project_add_norm).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace pe {

constexpr int64_t kAlignFloats = 64;  // 256-byte aligned sub-buffers of a workspace
inline int64_t aligned_floats(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// One weight matrix as a backend placed it: `view` points at the backend's copy (owned by the
// buffers) or, for the CPU, straight into the WeightStore (buffers empty).
struct Matrix {
  WeightView view;
  Buffer data, scales, group;
  Buffer rowmajor;  // CUDA: view.rowmajor's bytes (a tiled FP8 matrix's row-major copy) or empty
  int64_t bytes() const {
    return static_cast<int64_t>(data.size() + scales.size() + group.size() + rowmajor.size());
  }
};

// Checkpoint matrices that read the same input, one after another by rows in runs (a backend that
// fuses projections gets one run per compatible stretch). The output of run j is a dense
// [n, rows_j] block at out + n * run_offset[j]; part p is columns from part_col[p] of run
// part_run[p].
struct Projection {
  std::vector<Matrix> runs;
  std::vector<int64_t> run_offset;  // floats per token
  std::vector<int32_t> part_run;
  std::vector<int64_t> part_col;
  int64_t width = 0;  // floats per token over all runs

  struct Part {
    float* ptr;
    int64_t stride;  // floats between tokens
  };
  Part part(size_t p, float* out, int64_t n) const {
    return {out + n * run_offset[part_run[p]] + part_col[p], runs[part_run[p]].view.rows};
  }
  // gate | up as swiglu reads them: [n, 2I] rows, up right after gate.
  bool side_by_side(int64_t I) const {
    return runs.size() == 1 && part_col.size() == 2 && part_col[1] == I && width == 2 * I;
  }
};

// One checkpoint matrix of a run, after pad_rows zero rows (an FP8 part starts at a block row).
struct RunPart {
  std::string name;
  int64_t pad_rows = 0;
};

// The residual stream of a step: x [n, dim], its normed copy h, and mix, the sublayer output.
struct Residual {
  float* x = nullptr;
  float* h = nullptr;
  float* mix = nullptr;
  int64_t dim = 0;
  float eps = 1e-6f;
  bool offset = true;  // norm weights applied as 1 + w (Qwen3.5)
};

// null: h holds the normed rows; else the backend's norm the next projection must apply to h.
struct NormState {
  const void* pending = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // ---- Weights ----
  // Whether projections are joined into runs of several matrices (one GEMV streams them all).
  virtual bool joins_runs() const = 0;
  // Before the layer runs are placed: whether FP8 layer matrices keep a row-major copy beside their
  // GEMV layout for the prefill GEMM (model option prefill_weight_copy: -1 auto, 0 off, 1 on;
  // fp8_bytes: what the copies would take). A backend without such a GEMM ignores it.
  virtual void plan_prefill_copies(int mode, int64_t fp8_bytes) {}
  // A run from the WeightStore's matrices (final format: checkpoint or on-load quantized).
  // gemv_layout: the backend may lay it out for its GEMV (not for tables read by row: embeddings).
  virtual Matrix place(const WeightStore& w, const std::vector<RunPart>& parts, bool gemv_layout) = 0;
  // One host matrix (CPU: the view itself, which must outlive the Matrix).
  virtual Matrix place_matrix(const WeightView& host, bool gemv_layout) = 0;
  virtual const float* place_vector(const WeightStore& w, const std::string& name) = 0;
  // Random weights generated on the device (benchmarks); false: the model generates them on the
  // host and places them as checkpoint weights.
  virtual bool dummy_on_device() const { return false; }
  virtual Matrix place_dummy(const WeightStore& w, const std::vector<RunPart>& parts, DType dtype, uint64_t seed);
  virtual const float* place_dummy_vector(const WeightStore& w, const std::string& name, uint64_t seed);
  // Bytes of placed weights (CPU: the WeightStore's).
  virtual int64_t weight_bytes(const WeightStore& w) const { return w.bytes_total(); }
  // Of those, the row-major copies plan_prefill_copies kept.
  virtual int64_t prefill_copy_bytes() const { return 0; }
  // Step rows (tokens of one forward) strictly between lo and hi take a much slower matmul path
  // than hi rows do (CUDA with FP8 weights on sm_90: past the quantized GEMV's rows, below the W8A8
  // GEMM's); {0, 0}: no such gap.
  virtual std::pair<int64_t, int64_t> slow_rows() const { return {0, 0}; }
  // The prefill matmuls' token tile: a step's time steps up each time its rows pass a multiple of
  // it (CUDA: the GEMMs' 128-token tiles); 0: no such staircase (the step pacer's cut unit).
  virtual int64_t row_tile() const { return 0; }

  // ---- Step memory and inputs ----
  // Scratch of one attention_paged call, for sizing.
  virtual size_t attention_scratch_bytes(int64_t n_q, int64_t start, const ModelConfig& c) const { return 0; }
  // Every scratch a step of `tokens` tokens, `rows` logit rows, `ints` indices and attention
  // calls needing `attn_scratch` bytes uses exists after this (a captured step must not allocate).
  virtual void reserve(const ModelConfig& c, int64_t tokens, int64_t rows, int64_t ints, size_t attn_scratch) {}
  // The step's indices on the device, in one copy (valid until the next upload_ints).
  virtual int32_t* upload_ints(const std::vector<int32_t>& host) = 0;
  // tokens[i] = the token the latest sample_launch sampled for job from[i], where from[i] >= 0.
  virtual void feed_tokens(int32_t* tokens, const int32_t* from, int64_t n) = 0;
  virtual int64_t last_sample_jobs() const = 0;
  // Where lm_head writes `rows` logit rows; host_outputs: a forward whose logits go to the host
  // (they must not overwrite the engine step's logits between its forward and its sampling).
  virtual float* logits_buffer(int64_t rows, int64_t vocab, bool host_outputs, ForwardResult& res) = 0;
  // After the step's launches: res.logits [rows, vocab] and res.hidden [tokens, dim] on the host
  // where host_outputs asks (the CPU always fills them); the logits sample_launch reads.
  virtual void finish_step(const float* logits, int64_t rows, int64_t vocab, const float* hidden, int64_t tokens,
                           int64_t dim, bool host_outputs, ForwardResult& res) = 0;
  // Runs the step's launches; graph_key >= 0: a decode step the backend may replay as a graph.
  virtual void run_step(int64_t graph_key, const std::function<void()>& launches) { launches(); }
  // Waits for the device's queued work (its errors surface here).
  virtual void sync() {}

  // ---- Sampling (model.h Model::sample_launch / sample_collect) ----
  virtual void sample_launch(const ForwardResult& res, const std::vector<SampleJob>& jobs, int64_t vocab) = 0;
  virtual void sample_collect(std::vector<SampleOut>& outs) = 0;

  // ---- Ops: kernels/ops.h semantics on this device's memory, in stream order ----
  virtual void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out) = 0;
  virtual void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
                        float* out) = 0;
  virtual void add_rms_norm(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps,
                            bool offset, float* out) = 0;
  // z: groups of z_heads rows (a token's heads), z_stride floats apart (0: dense), as cpu::rms_norm_gated.
  virtual void rms_norm_gated(const float* x, const float* z, const float* w, int64_t n_rows, int64_t dim, float eps,
                              float* out, int64_t z_heads = 1, int64_t z_stride = 0) = 0;
  // In place: rows of n_heads x dim at x + t * token_stride for every token t, l2-normed, scaled.
  virtual void l2_norm_heads(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t dim,
                             float eps, float scale) = 0;
  virtual void linear(const float* x, int64_t n, const WeightView& w, float* out, NormState norm) = 0;
  virtual void swiglu(const float* gate_up, int64_t n, int64_t I, float* out) = 0;
  // n rows of `width` floats, src_stride apart, to rows dst_stride apart.
  virtual void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width,
                         int64_t n) = 0;
  // cpu::attention_inputs, with k and v written to the cache rows cache_rows[t] (page * page_size
  // + offset) instead of a.k / a.v, which are scratch the backend may use.
  virtual void attention_inputs(const cpu::AttnInputArgs& a, const cpu::PagedKV& kv, const int32_t* cache_rows) = 0;
  virtual void attention_paged(const float* q, int64_t n_q, int64_t start, int64_t n_heads, const cpu::PagedKV& kv,
                               const int32_t* page_table, float scale, const float* gate, float* out) = 0;
  virtual void conv1d_causal(const float* u, int64_t n, int64_t u_stride, int64_t C, const float* w, int64_t K,
                             int64_t pos0, float* state, float* out) = 0;
  virtual void gdn_gates(const float* a, const float* b, int64_t ab_stride, int64_t n, int64_t n_heads,
                         const float* A_log, const float* dt_bias, float* g, float* beta) = 0;
  virtual void gdn_recurrent(const cpu::GdnArgs& a) = 0;
  virtual void gdn_chunked(const cpu::GdnArgs& a) = 0;
  // The batched decode step with its gated output norm (a.norm_w set: the norm of a.z rows).
  virtual void gdn_decode(const cpu::GdnDecodeArgs& a) = 0;
  // A verify step's chained sequences (ops.h GdnChainArgs; conv_out: [rows, C] scratch).
  virtual void gdn_chain(const cpu::GdnChainArgs& a) = 0;

  // ---- Fused ops: defaults compose the ops above (backend.cpp) ----
  // Every run of p: out = x W^T (norm: x is h with that norm pending).
  void project(const float* x, int64_t n, const Projection& p, float* out, NormState norm);
  // act[n, I] = silu(gate) * up of a gate | up projection. scratch: project_swiglu_scratch floats.
  virtual void project_swiglu(const float* x, int64_t n, const Projection& gate_up, int64_t I, float* act,
                              NormState norm, float* scratch);
  static int64_t project_swiglu_scratch(int64_t n, const Projection& gate_up, int64_t I);
  // r.x += in W_producer^T; h = rms_norm(r.x; w), for `consumer`, the projection
  // that reads h next (null: none, h is materialized).
  virtual NormState project_add_norm(const float* in, int64_t n, const Projection& producer, const Residual& r,
                                     const float* w, const Projection* consumer);
  // r.x = table[ids]; h = rms_norm(r.x; w) for `consumer`.
  virtual NormState embed_norm(const WeightView& table, const int32_t* ids, int64_t n, const Residual& r,
                               const float* w, const Projection* consumer);
  // Non-causal attention of n_blocks blocks (the DFlash draft's): block b's n_q queries, rows
  // b * n_q .. of q [n_blocks * n_q, n_heads, D], at positions starts[b] .. starts[b] + n_q - 1 over
  // its cached keys 0 .. starts[b] + n_q - 1 (the block's own keys written there, page table
  // page_tables[b]), every query seeing every key. out like q. No gate. starts and page_tables
  // are host arrays (the tables on the device). perm: attention_blocks_perm(n_blocks, n_q,
  // n_kv_heads) on the device. Default: each block becomes one query of n_q * n_heads heads at its
  // last position (attention_paged, which then masks nothing), heads ordered (KV head, query,
  // head of its group) so that head / (n_q * group) is still the KV head: one gather (embedding of
  // the rows of group * D floats) orders every block's q so and one orders the outputs back. The
  // backend's attention scratch must hold attention_paged's for that shape. scratch:
  // attention_blocks_scratch floats.
  virtual void attention_blocks(const float* q, int64_t n_blocks, int64_t n_q, const int64_t* starts, int64_t n_heads,
                                const cpu::PagedKV& kv, const int32_t* const* page_tables, const int32_t* perm,
                                float scale, float* out, float* scratch);
  static int64_t attention_blocks_scratch(int64_t n_blocks, int64_t n_q, int64_t n_heads, int64_t D) {
    return 2 * aligned_floats(n_blocks * n_q * n_heads * D);
  }
  // Appends the gathers' row ids to `out`: n_blocks * n_q * n_kv_heads for q, then as many for the
  // outputs.
  static void attention_blocks_perm(int64_t n_blocks, int64_t n_q, int64_t n_kv_heads, std::vector<int32_t>& out);
  // The gated delta rule over a.n tokens, chunked for n > 1; states_out (optional, [n, Hv, dk, dv])
  // receives the state after each token (speculative verify rolls back to one of them).
  void gdn_rule(const cpu::GdnArgs& a, float* states_out = nullptr);
};

// A projection over the checkpoint matrices `names` (which read the same input) of w, in runs as
// the backend joins them; run places one run (the backend's place, or its dummy twin).
Projection make_projection(const Backend& be, const WeightStore& w, const std::vector<std::string>& names,
                           const std::function<Matrix(const std::vector<RunPart>&)>& run);

std::unique_ptr<Backend> make_cpu_backend();
// Fails (PE_ERR_UNSUPPORTED) in a build without the CUDA backend.
std::unique_ptr<Backend> make_cuda_backend();

}  // namespace pe
