// The CUDA backend: weights, activations, logits and sampling on the GPU (kernels/cuda), every op
// queued on the engine's stream; only token ids and requested logprobs come back.
//
// Design decision (fused projections): matrices that read the same input are joined by rows at
// load time (the model's runs: MLP gate | up, GDN qkv | z | a | b, attention q | k | v): one GEMV
// streams all of them, which batch-1 decode needs (fewer launches, long rows of work). Quantized
// layer matrices are stored in the GEMV tile layout (cuda_ops.h tile_weight).
//
// Design decision (launches per decode step): glue is fused where it costs no accuracy. The
// residual add and the norm after it run as one launch (add_rms_norm), or, in decode steps with
// quantized weights, split over the GEMVs around them (split norm: no launch at all); the swiglu
// runs in the gate | up GEMV's epilogue; the GDN decode step applies its gated norm; the attention
// inputs (q/gate split, q/k norms, RoPE) and the KV write are one launch; the first layer's input
// norm is split over the embedding and the first projection; single-row steps skip dense-row
// copies; decode logits are read from the hidden rows in place.
//
// Design decision (the sm_90 FP8 GEMM's workspace): W8A8 FP8 GEMMs on wgmma (compute capability
// 9.0, built with CUTLASS) need a workspace per call: x quantized and, unless the matrix keeps a
// row-major copy (plan_prefill_copies: option prefill_weight_copy), the weight untiled to row-major
// (the GEMV tile layout stays, for decode). One buffer serves every call in stream order; reserve
// sizes it for the step's token capacity and the FP8 shapes placed (gemm_shapes_) before the
// engine measures the memory left for the pools, so the planner counts it. 27B, untiling: 181 MB
// at 512-token chunks (gate | up's 178 MB untiled weight binds), 236 MB at 8,192 tokens.
//
// Design decision (cuda_graphs, an engine option, off by default): a decode-only step may run as
// a CUDA graph. The host work and the upload come first; then the step's launches are
// stream-captured, applied to the cached executable graph of that shape with cudaGraphExecUpdate
// (re-instantiated when refused) and launched (kernels/cuda/step_graphs.cu). Kernels take
// positions and lengths as arguments, so every step is captured anew: the gain is only the
// GPU-side gap between kernels. The first step of a shape runs uncaptured. Nothing in a captured
// step allocates, synchronizes or copies from the host (reserve sizes everything first).
#include <memory>

#include "core/error.h"
#include "model/backend.h"

#ifndef PE_WITH_CUDA
namespace pe {
std::unique_ptr<Backend> make_cuda_backend() {
  fail(PE_ERR_UNSUPPORTED, "this build of pyengine has no CUDA backend (built without nvcc)");
}
}  // namespace pe
#else
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/model_glue.h"
#include "kernels/cuda/step_graphs.h"

namespace pe {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A host matrix (any supported format) in device memory.
Matrix to_device(const WeightView& v) {
  Matrix m;
  m.view = v;
  m.data = Buffer(Device::CUDA, dtype_bytes_for(v.dtype, v.rows * v.cols));
  mem_upload(Device::CUDA, m.data.data(), v.data, m.data.size());
  m.view.data = m.data.data();
  if (v.dtype == DType::FP8_E4M3) {
    m.scales = Buffer(Device::CUDA, static_cast<size_t>(ceil_div(v.rows, v.block) * ceil_div(v.cols, v.block)) * 4);
    mem_upload(Device::CUDA, m.scales.data(), v.block_scale, m.scales.size());
    m.view.block_scale = m.scales.as<float>();
  } else if (v.dtype == DType::I8) {
    m.scales = Buffer(Device::CUDA, static_cast<size_t>(v.rows) * sizeof(float));
    mem_upload(Device::CUDA, m.scales.data(), v.row_scale, m.scales.size());
    m.view.row_scale = m.scales.as<float>();
  } else if (v.dtype == DType::NVFP4) {
    m.group = Buffer(Device::CUDA, static_cast<size_t>(v.rows * (v.cols / 16)));
    mem_upload(Device::CUDA, m.group.data(), v.group_scale, m.group.size());
    m.view.group_scale = m.group.as<uint8_t>();
  }
  return m;
}

// A layer matrix in the GEMV tile layout where it tiles (cuda_ops.h gemv_tile_rows): every linear
// path reads the layout; the decode GEMVs then stream each step's 4 KB in one run. keep_rowmajor:
// an FP8 matrix keeps its row-major upload as view.rowmajor (the prefill copy), else it is freed.
void tile_for_gemv(Matrix& m, bool keep_rowmajor) {
  const int tile = cuda::gemv_tile_rows(m.view);
  if (tile == 0) return;
  Buffer tiled(Device::CUDA, cuda::tiled_weight_bytes(m.view, tile));  // zero-filled: the padding rows
  const void* rowmajor = m.view.data;
  m.view = cuda::tile_weight(m.view, tiled.data(), tile, cuda::stream());
  cuda::stream_sync();  // the row-major copy is read until here
  if (keep_rowmajor && m.view.dtype == DType::FP8_E4M3) {
    m.rowmajor = std::move(m.data);
    m.view.rowmajor = rowmajor;
  }
  m.data = std::move(tiled);
}

bool has_penalties(const SampleJob& j) { return j.cfg.repetition_applies() || (j.cfg.counts_apply() && j.n_out > 0); }

// Distinct ids of prompt + output (repetition penalty) and their output counts, as
// cpu::apply_penalties sees them. Ids outside the vocabulary are skipped like there.
void penalty_table(const SampleJob& j, int64_t V, std::vector<int32_t>& ids, std::vector<int32_t>& counts) {
  std::unordered_map<int32_t, int32_t> index;
  ids.clear();
  counts.clear();
  const bool rep = j.cfg.repetition_applies();
  auto add = [&](int32_t id, bool out) {
    if (id < 0 || id >= V) return;
    auto it = index.find(id);
    if (it == index.end()) {
      if (!rep && !out) return;
      it = index.emplace(id, static_cast<int32_t>(ids.size())).first;
      ids.push_back(id);
      counts.push_back(0);
    }
    if (out) ++counts[it->second];
  };
  for (int64_t i = 0; i < j.n_prompt; ++i) add(j.prompt[i], false);
  for (int64_t i = 0; i < j.n_out; ++i) add(j.out[i], true);
  if (!j.cfg.counts_apply()) std::fill(counts.begin(), counts.end(), 0);  // no presence / frequency
}

class CudaBackend final : public Backend {
 public:
  Device device() const override { return Device::CUDA; }
  bool joins_runs() const override { return true; }
  Matrix place(const WeightStore& w, const std::vector<RunPart>& parts, bool gemv_layout) override;
  Matrix place_matrix(const WeightView& host, bool gemv_layout) override;
  const float* place_vector(const WeightStore& w, const std::string& name) override {
    const Tensor& t = w.get(name);
    Buffer b(Device::CUDA, t.f32.size() * sizeof(float));
    mem_upload(Device::CUDA, b.data(), t.f32.data(), b.size());
    return keep(std::move(b));
  }
  bool dummy_on_device() const override { return true; }
  void plan_prefill_copies(int mode, int64_t fp8_bytes) override {
    size_t free_b = 0, total_b = 0;
    if (mode != 0 && fp8_bytes > 0 && cuda::linear_fp8_sm90_available()) cuda::mem_info(&free_b, &total_b);
    keep_rowmajor_ = total_b > 0 && (mode == 1 || static_cast<size_t>(fp8_bytes) <= total_b / 4);
  }
  Matrix place_dummy(const WeightStore& w, const std::vector<RunPart>& parts, DType dtype, uint64_t seed) override;
  const float* place_dummy_vector(const WeightStore& w, const std::string& name, uint64_t seed) override {
    const Tensor& t = w.tensors().at(name);
    Buffer b(Device::CUDA, static_cast<size_t>(t.numel()) * sizeof(float));
    cuda::fill_random(b.data(), DType::F32, t.numel(), seed * 7919u + (++dummy_vectors_), dummy_scale(name, t));
    return keep(std::move(b));
  }
  int64_t weight_bytes(const WeightStore&) const override { return weight_bytes_; }
  int64_t prefill_copy_bytes() const override { return copy_bytes_; }
  std::pair<int64_t, int64_t> slow_rows() const override {  // FP8 weights: the GEMV's rows .. the W8A8 GEMM's
    const int64_t hi = gemm_shapes_.empty() ? 0 : cuda::linear_fp8_sm90_min_tokens();
    return {hi > 0 ? cuda::linear_gemv_max_tokens() : 0, hi};
  }
  int64_t row_tile() const override { return 128; }  // the FP8 W8A8 GEMM's M tile, the mma.sync GEMM's big tile

  size_t attention_scratch_bytes(int64_t n_q, int64_t start, const ModelConfig& c) const override {
    return cuda::attention_paged_scratch_bytes(n_q, start, c.n_heads, c.n_kv_heads, c.head_dim);
  }
  void reserve(const ModelConfig& c, int64_t tokens, int64_t rows, int64_t ints, size_t attn_scratch) override;
  int32_t* upload_ints(const std::vector<int32_t>& host) override;
  void feed_tokens(int32_t* tokens, const int32_t* from, int64_t n) override {
    if (sample_out_moved_) fail(PE_ERR_INTERNAL, "token_from_sample: a step with more logit rows than the sampling's");
    cuda::feed_tokens(tokens, from, sample_out_.as<int32_t>(), n, cuda::stream());
  }
  int64_t last_sample_jobs() const override { return last_sample_jobs_; }
  float* logits_buffer(int64_t rows, int64_t vocab, bool host_outputs, ForwardResult&) override {
    if (!host_outputs) return logits_.as<float>();
    const size_t need = static_cast<size_t>(std::max<int64_t>(rows, 1) * vocab) * sizeof(float);
    if (logits_host_.size() < need) logits_host_ = Buffer(Device::CUDA, need);
    return logits_host_.as<float>();
  }
  void finish_step(const float* logits, int64_t rows, int64_t vocab, const float* hidden, int64_t tokens, int64_t dim,
                   bool host_outputs, ForwardResult& res) override {
    if (!host_outputs) {
      last_logits_ = logits;
      res.logits.clear();
      res.hidden.clear();
      return;
    }
    res.logits.resize(static_cast<size_t>(rows * vocab));
    res.hidden.resize(static_cast<size_t>(tokens * dim));
    mem_download(Device::CUDA, res.logits.data(), logits, res.logits.size() * sizeof(float));
    mem_download(Device::CUDA, res.hidden.data(), hidden, res.hidden.size() * sizeof(float));
  }
  void run_step(int64_t graph_key, const std::function<void()>& launches) override {
    auto step = [&] {
      n_split_ = 0;
      launches();
    };
    if (graph_key >= 0)
      graphs_.run(graph_key, step);
    else
      step();
  }

  void sync() override { cuda::stream_sync(); }

  void sample_launch(const ForwardResult& res, const std::vector<SampleJob>& jobs, int64_t V) override;
  void sample_collect(std::vector<SampleOut>& outs) override;

  void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out) override {
    cuda::embedding(table, ids, n, out, st());
  }
  void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
                float* out) override {
    cuda::rms_norm(x, w, n_rows, dim, eps, offset, out, st());
  }
  void add_rms_norm(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
                    float* out) override {
    cuda::add_rms_norm(x, r, w, n_rows, dim, eps, offset, out, st());
  }
  void rms_norm_gated(const float* x, const float* z, const float* w, int64_t n_rows, int64_t dim, float eps,
                      float* out, int64_t z_heads, int64_t z_stride) override {
    cuda::rms_norm_gated(x, z, w, n_rows, dim, eps, out, st(), z_heads, z_stride);
  }
  void l2_norm_heads(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t dim, float eps,
                     float scale) override {
    cuda::l2_norm_heads(x, n_tokens, token_stride, n_heads, dim, eps, scale, st());
  }
  void linear(const float* x, int64_t n, const WeightView& w, float* out, NormState norm) override {
    cuda::linear(x, n, w, out, st(), static_cast<const cuda::SplitNorm*>(norm.pending), &gemm_ws_);
  }
  void swiglu(const float* gate_up, int64_t n, int64_t I, float* out) override { cuda::swiglu(gate_up, n, I, out, st()); }
  void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width,
                 int64_t n) override {
    cuda::device_copy_2d(dst, dst_stride * sizeof(float), src, src_stride * sizeof(float), width * sizeof(float), n);
  }
  void attention_inputs(const cpu::AttnInputArgs& a, const cpu::PagedKV& kv, const int32_t* cache_rows) override {
    cuda::attention_inputs(a, st(), &kv, cache_rows);
  }
  void attention_paged(const float* q, int64_t n_q, int64_t start, int64_t n_heads, const cpu::PagedKV& kv,
                       const int32_t* page_table, float scale, const float* gate, float* out) override {
    cuda::attention_paged(q, n_q, start, n_heads, kv, page_table, scale, gate, out, attn_scratch_.data(),
                          attn_scratch_.size(), st());
  }
  void conv1d_causal(const float* u, int64_t n, int64_t u_stride, int64_t C, const float* w, int64_t K, int64_t pos0,
                     float* state, float* out) override {
    cuda::conv1d_causal(u, n, u_stride, C, w, K, pos0, state, out, st());
  }
  void gdn_gates(const float* a, const float* b, int64_t ab_stride, int64_t n, int64_t n_heads, const float* A_log,
                 const float* dt_bias, float* g, float* beta) override {
    cuda::gdn_gates(a, b, ab_stride, n, n_heads, A_log, dt_bias, g, beta, st());
  }
  void gdn_recurrent(const cpu::GdnArgs& a) override { cuda::gdn_recurrent(a, st()); }
  void gdn_chunked(const cpu::GdnArgs& a) override {
    cuda::gdn_chunked(a, gdn_scratch_.data(), gdn_scratch_.size(), st());
  }
  void gdn_decode(const cpu::GdnDecodeArgs& a) override;
  void gdn_chain(const cpu::GdnChainArgs& a) override { cuda::gdn_chain(a, st()); }

  void project_swiglu(const float* x, int64_t n, const Projection& gate_up, int64_t I, float* act, NormState norm,
                      float* scratch) override;
  NormState project_add_norm(const float* in, int64_t n, const Projection& producer, const Residual& r,
                             const float* w, const Projection* consumer) override;
  NormState embed_norm(const WeightView& table, const int32_t* ids, int64_t n, const Residual& r, const float* w,
                       const Projection* consumer) override;

 private:
  static cudaStream_t st() { return cuda::stream(); }
  const float* keep(Buffer&& b) {
    weight_bytes_ += static_cast<int64_t>(b.size());
    vectors_.push_back(std::move(b));
    return vectors_.back().as<float>();
  }
  static size_t split_partial_bytes(int64_t dim) {
    return static_cast<size_t>(2 * kSplitTokens * cuda::split_norm_partial_floats(dim)) * sizeof(float);
  }
  // A split norm of dim needs its partial sums reserved (reserve) and a consumer that takes it.
  bool split_supported(const float* x, int64_t n, const Projection* p, int64_t dim) const {
    if (!p || norm_partial_.size() < split_partial_bytes(dim)) return false;
    for (const Matrix& r : p->runs)
      if (!cuda::linear_split_norm_supported(x, n, r.view)) return false;
    return true;
  }
  // The next of the two split norms (one being consumed, one being produced) for r and w.
  cuda::SplitNorm* next_split(const Residual& r, const float* w) {
    const int i = n_split_++ % 2;
    cuda::SplitNorm& s = splits_[i];
    s = cuda::SplitNorm{};
    s.x = r.x;
    s.h = r.h;
    s.w = w;
    s.offset = r.offset;
    s.eps = r.eps;
    s.dim = r.dim;
    s.partial = norm_partial_.as<float>() + i * kSplitTokens * cuda::split_norm_partial_floats(r.dim);
    return &s;
  }

  // A placed matrix's bytes, and an FP8 one's shape for the GEMM workspace (reserve; distinct shapes).
  void note_placed(const Matrix& m) {
    weight_bytes_ += m.bytes();
    copy_bytes_ += static_cast<int64_t>(m.rowmajor.size());
    const WeightView& v = m.view;
    if (v.dtype != DType::FP8_E4M3) return;  // the one format with a workspace path
    for (const WeightView& o : gemm_shapes_)
      if (o.rows == v.rows && o.cols == v.cols && o.tile == v.tile && o.block == v.block &&
          !o.rowmajor == !v.rowmajor)
        return;
    gemm_shapes_.push_back(v);  // of its data, only the alignment is read
    gemm_shapes_added_ = true;  // sized again at the next reserve
  }

  static constexpr int64_t kSplitTokens = 8;  // the split norm's GEMVs take up to 8 tokens
  std::vector<Buffer> vectors_;
  int64_t weight_bytes_ = 0, dummy_vectors_ = 0, copy_bytes_ = 0;
  Buffer norm_partial_, logits_, logits_host_, ints_, attn_scratch_, gdn_scratch_, sample_scratch_, sample_out_,
      penalty_ids_, penalty_row_, token_mask_;
  int64_t cap_tokens_ = 0, cap_rows_ = 0, cap_ints_ = 0;
  bool keep_rowmajor_ = false;  // plan_prefill_copies
  std::vector<WeightView> gemm_shapes_;
  Buffer gemm_ws_buf_;
  cuda::GemmWorkspace gemm_ws_;  // views gemm_ws_buf_
  int64_t gemm_ws_tokens_ = 0;    // the most tokens a reserve asked for
  bool gemm_shapes_added_ = false;
  cuda::SplitNorm splits_[2];
  int n_split_ = 0;
  const float* last_logits_ = nullptr;
  // The step's ints go up from page-locked staging, two in turn: a step's upload is queued behind
  // the previous step's work without the host waiting for it (overlapped steps, engine.h).
  struct Staging {
    cuda::PinnedBuffer host;
    cuda::StreamEvent consumed;  // the upload that reads `host` is done
  };
  Staging upload_[2];
  int upload_turn_ = 0;
  // Launched samplings not yet collected (FIFO): their outputs come back into `host`.
  struct PendingSample {
    cuda::PinnedBuffer host;
    cuda::StreamEvent done;
    int64_t rows = 0;                 // the output layout's row capacity (sample_out_)
    std::vector<int32_t> n_logprobs;  // per job
  };
  PendingSample samples_[Model::kMaxPendingSamples];
  int64_t samples_launched_ = 0, samples_collected_ = 0;
  int64_t last_sample_jobs_ = 0;   // jobs of the latest launch (token_from_sample's range)
  bool sample_out_moved_ = false;  // sample_out_ was reallocated after the latest launch
  cuda::StepGraphs graphs_;
};

// Host concatenation of the run's matrices (pad rows zero: e4m3 0x00 is 0), then one upload. FP8
// runs concatenate their block-scale grids (parts start on block rows), I8 their row scales, NVFP4
// their group scales (the model joins only equal global scales).
Matrix CudaBackend::place(const WeightStore& w, const std::vector<RunPart>& parts, bool gemv_layout) {
  WeightView v = w.matrix(parts.front().name);
  std::vector<uint8_t> bytes, groups;
  std::vector<float> scales;
  if (parts.size() > 1) {
    v.rows = 0;
    for (const RunPart& p : parts) {
      const Tensor& t = w.get(p.name);
      bytes.insert(bytes.end(), static_cast<size_t>(p.pad_rows * v.cols), uint8_t(0));
      v.rows += p.pad_rows;
      bytes.insert(bytes.end(), t.bytes.begin(), t.bytes.end());
      scales.insert(scales.end(), t.f32.begin(), t.f32.end());
      groups.insert(groups.end(), t.group_scale.begin(), t.group_scale.end());
      v.rows += t.shape[0];
    }
    v.data = bytes.data();
    if (v.dtype == DType::FP8_E4M3) v.block_scale = scales.data();
    if (v.dtype == DType::I8) v.row_scale = scales.data();
    if (v.dtype == DType::NVFP4) v.group_scale = groups.data();
  }
  return place_matrix(v, gemv_layout);
}

Matrix CudaBackend::place_matrix(const WeightView& host, bool gemv_layout) {
  Matrix m = to_device(host);
  if (gemv_layout) tile_for_gemv(m, keep_rowmajor_);
  note_placed(m);
  return m;
}

Matrix CudaBackend::place_dummy(const WeightStore& w, const std::vector<RunPart>& parts, DType dtype, uint64_t seed) {
  const Tensor& first = w.tensors().at(parts.front().name);
  Matrix m;
  m.view.dtype = dtype;
  m.view.cols = first.shape[1];
  for (const RunPart& p : parts) m.view.rows += p.pad_rows + w.tensors().at(p.name).shape[0];
  const int64_t n = m.view.rows * m.view.cols;
  const float scale = dummy_scale(parts.front().name, first);
  m.data = Buffer(Device::CUDA, dtype_bytes_for(dtype, n));
  m.view.data = m.data.data();
  seed ^= std::hash<std::string>()(parts.front().name);
  if (dtype == DType::FP8_E4M3) {
    cuda::fill_random(m.data.data(), dtype, n, seed, 1.0f);  // values in [-1, 1), times the block scale
    const int64_t ns = ceil_div(m.view.rows, 128) * ceil_div(m.view.cols, 128);
    m.scales = Buffer(Device::CUDA, static_cast<size_t>(ns) * sizeof(float));
    cuda::fill_f32(m.scales.as<float>(), ns, scale);
    m.view.block_scale = m.scales.as<float>();
  } else {
    cuda::fill_random(m.data.data(), dtype, n, seed, scale);
  }
  tile_for_gemv(m, keep_rowmajor_);  // random bytes either way; tiled as real weights are, for the same kernels
  note_placed(m);
  return m;
}

void CudaBackend::reserve(const ModelConfig& c, int64_t tokens, int64_t rows, int64_t ints, size_t attn_scratch) {
  if (tokens > cap_tokens_) {
    gdn_scratch_ = Buffer(Device::CUDA, cuda::gdn_chunked_scratch_bytes(tokens, c.gdn_v_heads));
    cap_tokens_ = tokens;
  }
  if (rows > cap_rows_) {
    logits_ = Buffer(Device::CUDA, static_cast<size_t>(rows * c.vocab) * sizeof(float));
    cap_rows_ = rows;
    sample_out_ = Buffer(Device::CUDA, static_cast<size_t>(rows) * (2 + 2 * PE_MAX_TOP_LOGPROBS) * 4);
    sample_out_moved_ = true;
  }
  if (norm_partial_.size() < split_partial_bytes(c.hidden))  // two split norms of up to kSplitTokens tokens
    norm_partial_ = Buffer(Device::CUDA, split_partial_bytes(c.hidden));
  if (ints > cap_ints_) {
    ints_ = Buffer(Device::CUDA, static_cast<size_t>(ints) * sizeof(int32_t));
    cap_ints_ = ints;
  }
  if (attn_scratch > attn_scratch_.size()) attn_scratch_ = Buffer(Device::CUDA, attn_scratch);
  if (tokens > gemm_ws_tokens_ || gemm_shapes_added_) {  // the sm_90 FP8 GEMM's (0 bytes where it does not run)
    gemm_ws_tokens_ = std::max(tokens, gemm_ws_tokens_);
    gemm_shapes_added_ = false;
    size_t need = 0;
    for (const WeightView& v : gemm_shapes_) need = std::max(need, cuda::linear_workspace_bytes(gemm_ws_tokens_, v));
    if (need > gemm_ws_buf_.size()) {
      gemm_ws_buf_ = Buffer();  // freed before the larger one is taken
      gemm_ws_buf_ = Buffer(Device::CUDA, need);
    }
    gemm_ws_ = {gemm_ws_buf_.data(), gemm_ws_buf_.size()};
  }
  const size_t ss = cuda::sample_scratch_bytes(c.vocab);
  if (sample_scratch_.size() < ss) {
    sample_scratch_ = Buffer(Device::CUDA, ss);
    penalty_row_ = Buffer(Device::CUDA, static_cast<size_t>(c.vocab) * sizeof(float));
  }
}

int32_t* CudaBackend::upload_ints(const std::vector<int32_t>& host) {
  // ints_ itself is rewritten only in stream order; the host staging waits for its last upload.
  Staging& up = upload_[upload_turn_ ^= 1];
  const size_t bytes = host.size() * sizeof(int32_t);
  up.consumed.wait();
  if (up.host.size() < bytes) up.host = cuda::PinnedBuffer(std::max<size_t>(bytes, 4096));
  std::memcpy(up.host.data(), host.data(), bytes);
  cuda::upload_async(ints_.data(), up.host, bytes);
  up.consumed.record();
  return ints_.as<int32_t>();
}

// The gated norm in the decode launch up to kGdnDecodeFusedNormMaxDv, else a launch of its own;
// both read z in place (a sequence's heads contiguous, sequences z_stride apart).
void CudaBackend::gdn_decode(const cpu::GdnDecodeArgs& a) {
  if (!a.norm_w || a.dv <= cuda::kGdnDecodeFusedNormMaxDv) return cuda::gdn_decode(a, st());
  if (a.rows) fail(PE_ERR_UNSUPPORTED, "gdn_decode: the separate gated norm takes dense rows (no rows map)");
  cpu::GdnDecodeArgs core = a;
  core.z = core.norm_w = nullptr;
  core.z_stride = 0, core.norm_eps = 0.0f;
  cuda::gdn_decode(core, st());
  cuda::rms_norm_gated(a.out, a.z, a.norm_w, a.n_seqs * a.Hv, a.dv, a.norm_eps, a.out, st(), a.Hv, a.z_stride);
}

// The swiglu in the gate | up GEMV's epilogue where the gate and up rows are one run it takes.
void CudaBackend::project_swiglu(const float* x, int64_t n, const Projection& p, int64_t I, float* act, NormState norm,
                                 float* scratch) {
  if (p.runs.size() == 1 && p.part_col.size() == 2 && p.part_col[0] == 0 &&
      cuda::linear_swiglu_supported(x, n, p.runs[0].view, p.part_col[1], I))
    return cuda::linear_swiglu(x, n, p.runs[0].view, p.part_col[1], I, act, st(),
                               static_cast<const cuda::SplitNorm*>(norm.pending));
  Backend::project_swiglu(x, n, p, I, act, norm, scratch);
}

// The split norm where the producer (one run of dim rows) and every run of the consumer take it.
NormState CudaBackend::project_add_norm(const float* in, int64_t n, const Projection& producer, const Residual& r,
                                        const float* w, const Projection* consumer) {
  if (producer.runs.size() != 1 || producer.runs[0].view.rows != r.dim ||
      !cuda::linear_split_norm_supported(in, n, producer.runs[0].view) || !split_supported(r.h, n, consumer, r.dim))
    return Backend::project_add_norm(in, n, producer, r, w, consumer);
  cuda::SplitNorm* s = next_split(r, w);
  cuda::linear_add_norm(in, n, producer.runs[0].view, *s, st());
  return {s};
}

NormState CudaBackend::embed_norm(const WeightView& table, const int32_t* ids, int64_t n, const Residual& r,
                                  const float* w, const Projection* consumer) {
  if (!split_supported(r.x, n, consumer, r.dim)) return Backend::embed_norm(table, ids, n, r, w, consumer);
  cuda::SplitNorm* s = next_split(r, w);
  cuda::embedding_norm(table, ids, n, *s, st());
  return {s};
}

// Queues penalties, sampling and logprobs of every job, then one copy of the outputs into the
// launch's page-locked buffer; sample_collect waits for that copy alone. Logprobs read the sampled
// id on the device, so nothing waits for the host between the sampling and the next forward.
void CudaBackend::sample_launch(const ForwardResult&, const std::vector<SampleJob>& jobs, int64_t V) {
  const int64_t n = static_cast<int64_t>(jobs.size());
  if (samples_launched_ - samples_collected_ >= Model::kMaxPendingSamples)
    fail(PE_ERR_INTERNAL, "sample_launch: ", Model::kMaxPendingSamples, " launches are already waiting to be collected");
  if (n > 0 && !last_logits_) fail(PE_ERR_STATE, "sample before any forward");
  if (n > cap_rows_) fail(PE_ERR_INTERNAL, "sample: ", n, " jobs but the last forward had ", cap_rows_, " rows");
  // sample_out_: tokens [rows] | logprob [rows] | top ids [rows, 20] | top logprobs [rows, 20]
  int32_t* d_tok = sample_out_.as<int32_t>();
  float* d_lp = reinterpret_cast<float*>(d_tok + cap_rows_);
  int32_t* d_top = reinterpret_cast<int32_t*>(d_lp + cap_rows_);
  float* d_top_lp = reinterpret_cast<float*>(d_top + cap_rows_ * PE_MAX_TOP_LOGPROBS);
  std::vector<int32_t> ids, counts;
  bool any_lp = false;
  // Plain greedy jobs on consecutive rows (a batch's decode rows, a verify's rows) take one two-pass
  // argmax for the run instead of two launches a row; the rest one job at a time.
  const auto plain_greedy = [&](const SampleJob& j) {
    return cuda::greedy_two_pass(j.cfg, V) && !has_penalties(j) && !(j.allowed && token_mask_allows_any(j.allowed, V));
  };
  const int64_t run_max = cuda::greedy_rows_max(V, sample_scratch_.size());
  const auto logprobs = [&](int64_t i) {
    const SampleJob& j = jobs[i];
    if (j.n_logprobs < 0) return;
    any_lp = true;
    cuda::logprobs(last_logits_ + j.row * V, V, d_tok + i, j.n_logprobs, d_lp + i, d_top + i * PE_MAX_TOP_LOGPROBS,
                   d_top_lp + i * PE_MAX_TOP_LOGPROBS, st());
  };
  for (int64_t i = 0; i < n;) {
    int64_t len = 0;
    while (i + len < n && len < run_max && plain_greedy(jobs[i + len]) && jobs[i + len].row == jobs[i].row + len) ++len;
    if (len >= 2) {
      cuda::sample_greedy_rows(last_logits_ + jobs[i].row * V, V, len, d_tok + i, sample_scratch_.data(),
                               sample_scratch_.size(), st());
      for (int64_t r = i; r < i + len; ++r) logprobs(r);
      i += len;
      continue;
    }
    const SampleJob& j = jobs[i];
    const float* row = last_logits_ + j.row * V;
    const float* src = row;
    if (has_penalties(j)) {
      penalty_table(j, V, ids, counts);
      const size_t need = 2 * ids.size() * sizeof(int32_t);
      if (penalty_ids_.size() < need) penalty_ids_ = Buffer(Device::CUDA, std::max<size_t>(need, 1 << 16));
      ids.insert(ids.end(), counts.begin(), counts.end());
      mem_upload(Device::CUDA, penalty_ids_.data(), ids.data(), need);
      float* pen = penalty_row_.as<float>();
      mem_copy(Device::CUDA, pen, row, sizeof(float) * V);
      const int32_t m = static_cast<int32_t>(counts.size());
      cuda::apply_penalties(pen, penalty_ids_.as<int32_t>(), penalty_ids_.as<int32_t>() + m, m, j.cfg, st());
      src = pen;
    }
    if (j.allowed && token_mask_allows_any(j.allowed, V)) {
      // Grammar mask: on the penalized row, or on a copy of the raw one (logprobs stay raw).
      const size_t words = static_cast<size_t>((V + 31) / 32) * sizeof(uint32_t);
      if (token_mask_.size() < words) token_mask_ = Buffer(Device::CUDA, words);
      mem_upload(Device::CUDA, token_mask_.data(), j.allowed, words);  // stream-ordered, host reusable
      float* pen = penalty_row_.as<float>();
      if (src != pen) mem_copy(Device::CUDA, pen, row, sizeof(float) * V);
      cuda::apply_token_mask(pen, V, token_mask_.as<uint32_t>(), st());
      src = pen;
    }
    cuda::sample(src, V, j.cfg, j.u, d_tok + i, sample_scratch_.data(), sample_scratch_.size(), st());
    logprobs(i++);
  }
  PendingSample& p = samples_[samples_launched_ % Model::kMaxPendingSamples];
  // The slot's previous launch was collected (the count above), so its copy is done.
  const size_t bytes = any_lp ? sample_out_.size() : sizeof(int32_t) * std::max<int64_t>(n, 1);
  if (p.host.size() < sample_out_.size()) p.host = cuda::PinnedBuffer(sample_out_.size());
  if (n > 0) cuda::download_async(p.host, sample_out_.data(), bytes);
  p.done.record();
  p.rows = cap_rows_;
  p.n_logprobs.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p.n_logprobs[i] = jobs[i].n_logprobs;
  ++samples_launched_;
  last_sample_jobs_ = n;
  sample_out_moved_ = false;
}

void CudaBackend::sample_collect(std::vector<SampleOut>& outs) {
  if (samples_collected_ == samples_launched_) fail(PE_ERR_INTERNAL, "sample_collect: nothing was launched");
  PendingSample& p = samples_[samples_collected_++ % Model::kMaxPendingSamples];
  const int64_t n = static_cast<int64_t>(p.n_logprobs.size());
  outs.assign(static_cast<size_t>(n), SampleOut{});
  p.done.wait();
  const int32_t* tok = p.host.as<int32_t>();
  const float* lp = reinterpret_cast<const float*>(tok + p.rows);
  const int32_t* top = reinterpret_cast<const int32_t*>(lp + p.rows);
  const float* top_lp = reinterpret_cast<const float*>(top + p.rows * PE_MAX_TOP_LOGPROBS);
  for (int64_t i = 0; i < n; ++i) {
    outs[i].token = tok[i];
    const int32_t k = p.n_logprobs[i];
    if (k < 0) continue;
    outs[i].logprob = lp[i];
    std::copy_n(top + i * PE_MAX_TOP_LOGPROBS, k, outs[i].top_ids);
    std::copy_n(top_lp + i * PE_MAX_TOP_LOGPROBS, k, outs[i].top_logprobs);
  }
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace pe
#endif  // PE_WITH_CUDA
