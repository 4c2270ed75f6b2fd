// The CPU backend: the reference ops of kernels/ops.h on host memory, weights as views on the
// WeightStore (each checkpoint matrix its own run: a joined copy would compute the same rows and
// cost memory), sampling on the host at launch.
#include <cstring>
#include <deque>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/backend.h"
#include "model/host_sampling.h"

namespace pe {
namespace {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  bool joins_runs() const override { return false; }
  Matrix place(const WeightStore& w, const std::vector<RunPart>& parts, bool) override {
    if (parts.size() != 1 || parts[0].pad_rows != 0) fail(PE_ERR_INTERNAL, "the CPU backend places single matrices");
    return place_matrix(w.matrix(parts[0].name), false);
  }
  Matrix place_matrix(const WeightView& host, bool) override {
    Matrix m;
    m.view = host;
    return m;
  }
  const float* place_vector(const WeightStore& w, const std::string& name) override { return w.vec(name); }

  int32_t* upload_ints(const std::vector<int32_t>& host) override {
    ints_ = host;
    return ints_.data();
  }
  void feed_tokens(int32_t* tokens, const int32_t* from, int64_t n) override {
    for (int64_t i = 0; i < n; ++i)
      if (from[i] >= 0) tokens[i] = last_tokens_[from[i]];
  }
  int64_t last_sample_jobs() const override { return static_cast<int64_t>(last_tokens_.size()); }
  float* logits_buffer(int64_t rows, int64_t vocab, bool, ForwardResult& res) override {
    res.logits.resize(static_cast<size_t>(rows * vocab));
    return res.logits.data();
  }
  void finish_step(const float*, int64_t, int64_t, const float* hidden, int64_t tokens, int64_t dim, bool,
                   ForwardResult& res) override {
    res.hidden.assign(hidden, hidden + tokens * dim);
  }

  void sample_launch(const ForwardResult& res, const std::vector<SampleJob>& jobs, int64_t V) override;
  void sample_collect(std::vector<SampleOut>& outs) override {
    if (pending_.empty()) fail(PE_ERR_INTERNAL, "sample_collect: nothing was launched");
    outs = std::move(pending_.front());
    pending_.pop_front();
  }

  void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out) override {
    cpu::embedding(table, ids, n, out);
  }
  void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
                float* out) override {
    cpu::rms_norm(x, w, n_rows, dim, eps, offset, out);
  }
  void add_rms_norm(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
                    float* out) override {
    cpu::add_rms_norm(x, r, w, n_rows, dim, eps, offset, out);
  }
  void rms_norm_gated(const float* x, const float* z, const float* w, int64_t n_rows, int64_t dim, float eps,
                      float* out, int64_t z_heads, int64_t z_stride) override {
    cpu::rms_norm_gated(x, z, w, n_rows, dim, eps, out, z_heads, z_stride);
  }
  void l2_norm_heads(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t dim, float eps,
                     float scale) override {
    for (int64_t t = 0; t < n_tokens; ++t) cpu::l2_norm(x + t * token_stride, n_heads, dim, eps, scale);
  }
  void linear(const float* x, int64_t n, const WeightView& w, float* out, NormState norm) override {
    if (norm.pending) fail(PE_ERR_INTERNAL, "the CPU backend has no pending norms");
    cpu::linear(x, n, w, out);
  }
  void swiglu(const float* gate_up, int64_t n, int64_t I, float* out) override { cpu::swiglu(gate_up, n, I, out); }
  void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width,
                 int64_t n) override {
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * dst_stride, src + i * src_stride, sizeof(float) * width);
  }
  void attention_inputs(const cpu::AttnInputArgs& a, const cpu::PagedKV& kv, const int32_t* cache_rows) override {
    cpu::attention_inputs(a);
    // Cache rows as a page table of one-token pages: token t goes to row cache_rows[t].
    cpu::PagedKV rows = kv;
    rows.page_size = 1;
    cpu::kv_write(rows, cache_rows, 0, a.n_tokens, a.k, a.v);
  }
  void attention_paged(const float* q, int64_t n_q, int64_t start, int64_t n_heads, const cpu::PagedKV& kv,
                       const int32_t* page_table, float scale, const float* gate, float* out) override {
    cpu::attention_paged(q, n_q, start, n_heads, kv, page_table, scale, gate, out);
  }
  void conv1d_causal(const float* u, int64_t n, int64_t u_stride, int64_t C, const float* w, int64_t K, int64_t pos0,
                     float* state, float* out) override {
    cpu::conv1d_causal(u, n, u_stride, C, w, K, pos0, state, out);
  }
  void gdn_gates(const float* a, const float* b, int64_t ab_stride, int64_t n, int64_t n_heads, const float* A_log,
                 const float* dt_bias, float* g, float* beta) override {
    cpu::gdn_gates(a, b, ab_stride, n, n_heads, A_log, dt_bias, g, beta);
  }
  void gdn_recurrent(const cpu::GdnArgs& a) override { cpu::gdn_recurrent(a); }
  void gdn_chunked(const cpu::GdnArgs& a) override { cpu::gdn_chunked(a); }
  void gdn_decode(const cpu::GdnDecodeArgs& a) override { cpu::gdn_decode(a); }
  void gdn_chain(const cpu::GdnChainArgs& a) override { cpu::gdn_chain(a); }

 private:
  std::vector<int32_t> ints_;
  HostSampler sampler_;
  std::deque<std::vector<SampleOut>> pending_;  // launches not yet collected
  std::vector<int32_t> last_tokens_;            // the latest launch's tokens
};

void CpuBackend::sample_launch(const ForwardResult& res, const std::vector<SampleJob>& jobs, int64_t V) {
  if (static_cast<int>(pending_.size()) >= Model::kMaxPendingSamples)
    fail(PE_ERR_INTERNAL, "sample_launch: ", Model::kMaxPendingSamples, " launches are already waiting to be collected");
  std::vector<SampleOut> outs;
  sampler_.sample_all(res, jobs, V, outs);
  last_tokens_.resize(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) last_tokens_[i] = outs[i].token;
  pending_.push_back(std::move(outs));
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace pe
