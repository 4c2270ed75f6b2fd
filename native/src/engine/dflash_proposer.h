// A DFlash draft model as a proposer (MODEL_SPEC §6, model/dflash.h): after each step it appends
// the context rows of every token the step committed (the target's hidden states after the draft's
// target_layer_ids, kept by the step's forward) to its own KV cache, then drafts one block
// [pending token, MASK x (block_size - 1)] per drafting sequence in the same forward; block row j
// proposes draft j + 1, picked by pick_draft (proposer.h).
//
// Design decision (the draft's cache on the target's pages): the draft's KV pool has as many pages
// as the engine's, of the same size, and a request's page table indexes both. Its cache is then
// paged, shared by prefix-cache hits, trimmed and freed with the target's pages at no cost of its
// own: a page's draft rows hold the context of the same tokens as its target rows, a function of
// the prefix alone (the target's hidden states and the draft's weights). Its shape (layers, KV
// heads, head_dim) is the draft's, so it cannot be more attention layers of the engine's pool.
// The memory planner counts its bytes per page with the target's (PlanRequest::draft_page_bytes).
// A block's rows after the context are scratch: the next step's context rows overwrite them.
//
// Design decision (greedy drafts on the device): where every drafting request samples at T = 0,
// the block's logits stay on the draft's device and its argmax jobs (DFlashDraft::sample_launch)
// return only the drafted ids: no block_size - 1 vocabulary rows per request cross to the host.
#pragma once
#include <vector>

#include "cache/kv_pool.h"
#include "engine/proposer.h"
#include "model/dflash.h"
#include "model/model.h"

namespace pe {

class DFlashProposer : public Proposer {
 public:
  // kv: the draft's pool (draft.config().cache_shape(), the engine's pages and page size).
  DFlashProposer(Model& target, DFlashDraft& draft, KvPool& kv);
  std::vector<int32_t> hidden_layers() const override { return draft_.config().target_layers; }
  int64_t rows_ahead(int64_t) const override { return draft_.config().block_size; }
  int64_t max_drafts() const override { return draft_.config().block_size - 1; }
  void propose(const std::vector<ProposeInput>& in) override;

 private:
  Model& target_;
  DFlashDraft& draft_;
  KvPool& kv_;
  ForwardResult res_;
  std::vector<DraftSeq> seqs_;
  std::vector<int32_t> idx_;
  std::vector<SampleJob> jobs_;
  std::vector<SampleOut> outs_;
};

}  // namespace pe
