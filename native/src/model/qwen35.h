// The Qwen3.5 hybrid model (Gated DeltaNet + gated full attention) on the CPU backend.
//
// One forward runs a batch of sequence chunks side by side: prefill chunks, single decode tokens
// and 1 + k speculative tokens are all "n_new tokens after n_past cached ones". Token rows of all
// chunks are stacked so every linear layer runs once per batch; only the mixers (attention over
// the paged KV, GDN over the slot state) loop over sequences. The final normed hidden states of
// every row are kept for an MTP head or a draft model.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"

namespace pe {

class Qwen35Model : public Model {
 public:
  explicit Qwen35Model(const ModelConfig& cfg);
  ~Qwen35Model() override;
  Device device() const override { return Device::CPU; }
  void finalize() override;  // after all tensors are set: validates, quantizes, prepares layer views

  bool has_mtp() const override { return mtp_layer_ != nullptr; }
  // The MTP head over one sequence (MODEL_SPEC §3): row p (0 .. n-2) drafts the token at p + 2
  // from the final-normed hidden state hidden[p] and the token tokens[p + 1], with the MTP layer's
  // attention at positions 0 .. p (its own KV, `mtp_kv`: one attention layer). logits [n-1, V].
  void mtp_forward(const int32_t* tokens, int64_t n, const float* hidden, KvPool& mtp_kv, std::vector<float>& logits);

  // Runs one batch; updates the KV pages and GDN slots of every chunk. Calls are serialized
  // (one workspace): prompt_logits on a user thread may run beside an engine thread.
  void forward(const Batch& batch, KvPool& kv, GdnPool& gdn, ForwardResult& out) override;

 private:
  struct Workspace;
  struct LayerViews;
  void mixer_gdn(const LayerViews& L, int64_t gdn_index, const Batch& b, GdnPool& gdn, const float* x,
                 float* out, Workspace& ws);
  void mixer_attention(const LayerViews& L, int64_t attn_index, const Batch& b, KvPool& kv,
                       const float* x, float* out, Workspace& ws);
  void mlp(const LayerViews& L, int64_t n, const float* x, float* out, Workspace& ws);
  void decoder_layer(const LayerViews& L, int64_t index, const Batch& b, KvPool& kv, GdnPool* gdn, float* x,
                     Workspace& ws);
  void set_positions(const Batch& b, Workspace& ws);
  LayerViews layer_views(const std::string& prefix, bool full) const;
  void lm_head(const float* x, int64_t n, float* logits);
  void all_reduce(float* x, int64_t n);  // the TP sum of the ranks' partial outputs (TP = 1: nothing)
  bool supports_tp() const override { return true; }

  std::vector<LayerViews> layers_;
  std::unique_ptr<LayerViews> mtp_layer_;
  std::unique_ptr<Workspace> ws_;
  std::mutex forward_mu_;
};

}  // namespace pe
