// The Qwen3.5 hybrid model (Gated DeltaNet + gated full attention, MODEL_SPEC), on any backend.
//
// One forward runs a batch of sequence chunks side by side: prefill chunks, single decode tokens
// and 1 + k speculative tokens are all "n_new tokens after n_past cached ones". Token rows of all
// chunks are stacked so every projection runs once per batch; only the mixers (attention over the
// paged KV, GDN over the slot state) loop over sequences. The forward is written once against the
// backend op interface (backend.h): the CPU backend is the reference, the CUDA backend runs the
// same op sequence with its fused kernels. The MTP head runs through the same decoder layer.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/model.h"

namespace pe {

class Qwen35Model : public Model {
 public:
  // device CUDA: fails in a build without the CUDA backend.
  explicit Qwen35Model(const ModelConfig& cfg, Device device = Device::CPU);
  ~Qwen35Model() override;
  Device device() const override { return be_->device(); }
  void finalize() override;
  void load_dummy(DType matrix_dtype, uint64_t seed) override;
  void forward(const Batch& batch, KvPool& kv, GdnPool& gdn, ForwardResult& out) override;
  void sample_launch(const ForwardResult& res, const std::vector<SampleJob>& jobs) override;
  void sample_collect(std::vector<SampleOut>& outs) override;
  void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) override;
  void reserve_kept(int64_t n_layers, int64_t max_tokens) override;
  bool has_mtp() const override { return mtp_ != nullptr; }
  void mtp_forward(const int32_t* tokens, int64_t n, const float* hidden, KvPool& mtp_kv,
                   std::vector<float>& logits) override;
  void mtp_step(const Batch& b, const std::vector<int32_t>& hidden_rows, KvPool& kv, int64_t kv_layer,
                ForwardResult& res) override;
  const float* kept_hidden(int32_t layer, int64_t* n_rows) const override;
  int64_t weight_bytes() const override { return be_->weight_bytes(weights_); }
  int64_t prefill_copy_bytes() const override { return be_->prefill_copy_bytes(); }
  std::pair<int64_t, int64_t> slow_rows() const override { return be_->slow_rows(); }
  int64_t row_tile() const override { return be_->row_tile(); }
  // The token embedding and the lm_head as placed on the model's device (a DFlash draft uses
  // them: it has neither). Valid while the model lives.
  const WeightView& embedding_table() const { return embed_.view; }
  const WeightView& lm_head() const { return cfg_.tied_embeddings ? embed_.view : lm_head_.view; }

 private:
  struct Layer {
    bool full = false;
    const float* input_norm = nullptr;
    const float* post_norm = nullptr;
    Projection in;  // attention: q | k | v; GDN: qkv | z | a | b
    Projection gate_up, down, out;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    const float* conv = nullptr;  // [conv_dim, K]
    const float* dt_bias = nullptr;
    const float* A_log = nullptr;
    const float* norm = nullptr;
  };
  struct Mtp {
    Layer layer;
    Projection fc;
    const float* norm_embedding = nullptr;
    const float* norm_hidden = nullptr;
    const float* norm = nullptr;
  };
  // The step's indices on the device (prepare_step).
  struct Step {
    int64_t T = 0;
    int32_t* tokens = nullptr;
    const int32_t* pos = nullptr;
    const int32_t* pages = nullptr;       // every sequence's page table, at page_off[i]
    const int32_t* slots = nullptr;       // GDN slot per sequence
    const int32_t* cache_rows = nullptr;  // per token: its KV cache row (page * page_size + offset)
    std::vector<int64_t> page_off;
    // Verify chunks (and the decode rows beside them): their GDN tokens in one Backend::gdn_chain
    // (chain_seq[i]: sequence i runs so; chain_all: every sequence does), chain_n sequences; its
    // device arrays at chain (plan_chain): first rows | tokens | first positions | live slots |
    // out slot offsets, chain_n entries each, then the out slots.
    std::vector<char> chain_seq;
    bool chain_all = false;
    const int32_t* chain = nullptr;
    int64_t chain_n = 0;
    // A chained chunk's further snapshots at an inside offset (a prefix-cache block boundary where
    // a position slot is too): (slot, slot the chain wrote), whole-slot copies after the layers.
    std::vector<std::pair<int32_t, int32_t>> chain_copies;
  };
  using RunSource = std::function<Matrix(const std::vector<RunPart>&)>;
  using VectorSource = std::function<const float*(const std::string&)>;

  // Weight placement (qwen35.cpp).
  void place_weights(const RunSource& run, const VectorSource& vec);
  void plan_prefill_copies();
  Projection projection(const std::vector<std::string>& names, const RunSource& run) const;
  Layer layer(const std::string& prefix, bool full, const RunSource& run, const VectorSource& vec) const;
  int64_t act_floats(int64_t T) const;
  void ensure_workspace(int64_t tokens, int64_t rows, int64_t ints, size_t attn_scratch);

  // The forward (qwen35_forward.cpp).
  void check_pools(const KvPool& kv, const GdnPool* gdn) const;
  void prepare_step(const Batch& b, int64_t page_size, int64_t logit_rows);
  void step_launches(const Batch& b, KvPool& kv, GdnPool& gdn, int64_t n_rows, float* logits);
  Residual residual() const;
  float* scratch() const;  // the mixer / MLP workspace after x, h and mix
  NormState decoder_layer(const Layer& L, int64_t index, const Batch& b, KvPool& kv, GdnPool* gdn, NormState s,
                          const float* next_norm, const Projection* next_in);
  NormState residual_add(const float* in, const Projection& producer, const float* norm, const Projection* consumer);
  const float* mixer_gdn(const Layer& L, int64_t gi, const Batch& b, GdnPool& gdn, NormState s);
  void plan_chain(const Batch& b);
  void gdn_chain(const Layer& L, int64_t gi, GdnPool& gdn, const Projection::Part& u, const float* a,
                 const float* bb, int64_t ab_stride, float* y, float* o);
  void gdn_pieces(const Layer& L, int64_t gi, const Batch& b, GdnPool& gdn, const Projection::Part& u,
                  const float* a, const float* bb, int64_t ab_stride, float* y, float* g, float* beta, float* o);
  const float* mixer_attention(const Layer& L, int64_t ai, const Batch& b, KvPool& kv, NormState s);
  void project_logits(const float* rows, int64_t n, float* logits);
  const float* logit_rows(const Batch& b, const float* h, float* gather) const;
  // Speculative decoding (qwen35_mtp.cpp): the hidden rows a forward keeps for a drafter.
  void ensure_kept(int64_t n_layers, int64_t rows);
  void keep_rows(const std::vector<int32_t>& layers, int32_t layer, const float* rows);
  void mtp_head(int64_t T, float* out_logits, int64_t n_rows, const Batch& b, KvPool& kv, int64_t kv_layer);
  void ensure_tp_logits(int64_t n);

  std::unique_ptr<Backend> be_;
  std::vector<Layer> layers_;
  std::unique_ptr<Mtp> mtp_;
  Matrix embed_, lm_head_;
  const float* final_norm_ = nullptr;
  bool ready_ = false;
  Buffer tp_logits_;  // tensor parallel: the lm_head parts and their gather
  Buffer act_;  // activations: x, h, mix [cap_tokens_, H] each, then the mixer / MLP workspace
  int64_t cap_tokens_ = 0;
  std::vector<int32_t> host_ints_;
  Step step_;
  Buffer kept_;                      // kept hidden rows: [kept_layers_.size(), kept_rows_, hidden]
  float* keep_into_ = nullptr;       // where this forward keeps them (kept_, or a keep_for_host capture)
  std::vector<int32_t> kept_layers_;
  int64_t kept_rows_ = 0;
  std::mutex mu_;  // one workspace: forwards (an engine thread, prompt_logits on another) in turn
};

}  // namespace pe
