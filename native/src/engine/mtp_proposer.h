// The MTP head as a proposer (MODEL_SPEC §3): its KV is one more attention layer of the engine's
// pages, at the target's positions. Row p of the head reads the target's final-normed hidden
// state at p and the token at p + 1, so after each step it runs over every token the step
// committed (prompt chunks included), which fills its KV exactly as LLM.mtp_logits computes it
// over the same tokens; the last row of a drafting sequence (its pending token) gives draft 1.
// Draft j > 1 then comes from one more head step at the next position, reading the head's own
// output for draft j - 1 and that draft (a chain of single-row steps, all sequences batched).
// Those chain rows sit in KV rows the next step's catch-up overwrites with the target's states.
//
// Drafts are picked from the head's logits by pick_draft (proposer.h). Design decision: where every
// drafting request samples at T = 0 (argmax drafts) and there is no tensor-parallel group, the
// chain stays on the device instead: each head step's drafts are argmax jobs sampled where its
// logits are (Model::sample_launch), the next head step reads them there (Batch::token_from_sample),
// and the host collects step j's drafts after queuing step j + 1. No logits cross to the host (a
// 27B row is 248K floats, 1 MB) and the device does not wait for the host between the chain's
// steps (the default model on an H100, MTP k = 3 against spec off: batch 8 x0.72 -> x0.90, batch 1
// on code x1.35 -> x1.45, in two calls).
#pragma once
#include <vector>

#include "cache/kv_pool.h"
#include "engine/proposer.h"
#include "engine/tp_group.h"
#include "model/model.h"

namespace pe {

class MtpProposer : public Proposer {
 public:
  // kv: the engine's pool, with one attention layer after the model's for the head. tp: the
  // tensor-parallel leader (every rank runs the head's steps), null at TP 1.
  MtpProposer(Model& model, KvPool& kv, TpLeader* tp = nullptr);
  std::vector<int32_t> hidden_layers() const override { return {-1}; }
  int64_t max_drafts() const override { return PE_SPEC_MAX_DRAFT; }
  void propose(const std::vector<ProposeInput>& in) override;

 private:
  void step(const Batch& b, const std::vector<int32_t>& rows);
  // Draft 1 from the catch-up step's logits, then the chain's further steps (header).
  void chain_steps(bool on_device, std::vector<Request*> chain, std::vector<int32_t> chain_row,
                   std::vector<int32_t> want);
  // The chain on the device: argmax jobs of these requests' rows of the last head step (one
  // launch pending at a time), and the pending launch's tokens appended to their drafts.
  void launch_argmax(const std::vector<Request*>& reqs);
  void collect_drafts();

  Model& model_;
  KvPool& kv_;
  TpLeader* tp_;
  int64_t kv_layer_;
  ForwardResult res_;
  std::vector<int32_t> idx_;
  std::vector<SampleJob> jobs_;
  std::vector<SampleOut> outs_;
  std::vector<Request*> launched_;  // the requests of the pending launch, in its jobs' order
  bool pending_ = false;
};

}  // namespace pe
