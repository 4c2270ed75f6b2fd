#include "engine/mtp_proposer.h"

#include <algorithm>

#include "core/error.h"

namespace pe {

MtpProposer::MtpProposer(Model& model, KvPool& kv, TpLeader* tp)
    : model_(model), kv_(kv), tp_(tp), kv_layer_(model.config().n_full_layers()) {
  if (!model.has_mtp()) fail(PE_ERR_INVALID_ARGUMENT, "speculative_algorithm mtp needs a checkpoint with an MTP head (mtp.* tensors)");
  if (kv.n_layers() != kv_layer_ + 1)
    fail(PE_ERR_INTERNAL, "the MTP proposer needs a KV pool of ", kv_layer_ + 1, " layers, got ", kv.n_layers());
}

void MtpProposer::step(const Batch& b, const std::vector<int32_t>& rows) {
  if (tp_)
    tp_->mtp_step(model_, b, rows, kv_, kv_layer_, res_);
  else
    model_.mtp_step(b, rows, kv_, kv_layer_, res_);
}

void MtpProposer::launch_argmax(const std::vector<Request*>& reqs) {
  argmax_jobs(static_cast<int64_t>(reqs.size()), jobs_);
  model_.sample_launch(res_, jobs_);
  launched_ = reqs;
  pending_ = true;
}

void MtpProposer::collect_drafts() {
  pending_ = false;
  model_.sample_collect(outs_);
  if (outs_.size() != launched_.size())
    fail(PE_ERR_INTERNAL, "MTP chain: ", outs_.size(), " drafts for ", launched_.size(), " requests");
  for (size_t i = 0; i < launched_.size(); ++i) launched_[i]->drafts.push_back(outs_[i].token);
}

void MtpProposer::chain_steps(bool on_device, std::vector<Request*> chain, std::vector<int32_t> chain_row,
                              std::vector<int32_t> want) {
  const int64_t V = model_.config().vocab;
  if (on_device)
    launch_argmax(chain);
  else
    for (size_t i = 0; i < chain.size(); ++i) pick_draft(*chain[i], res_.logits.data() + static_cast<int64_t>(i) * V, V, 0, idx_);
  // The chain: draft j from the head's output for draft j - 1, one row per sequence.
  for (int32_t j = 1;; ++j) {
    Batch cb;
    cb.host_outputs = !on_device;
    std::vector<int32_t> crows;
    std::vector<Request*> next;
    std::vector<int32_t> next_want;
    for (size_t i = 0; i < chain.size(); ++i) {
      if (want[i] <= j) continue;
      Request& r = *chain[i];
      SeqChunk s;
      s.n_past = r.n_computed + j - 1;  // the position of the token it reads (draft j - 1)
      s.n_new = 1;
      s.page_table = r.pages.data();
      s.logits = LogitsMode::Last;
      cb.seqs.push_back(s);
      cb.tokens.push_back(on_device ? 0 : r.drafts.back());
      if (on_device) cb.token_from_sample.push_back(static_cast<int32_t>(i));  // its job in the last launch
      crows.push_back(chain_row[i]);
      next.push_back(&r);
      next_want.push_back(want[i]);
    }
    if (next.empty()) break;
    step(cb, crows);
    if (on_device) {
      collect_drafts();  // draft j - 1, while the device runs step j
      launch_argmax(next);
    } else {
      for (size_t i = 0; i < next.size(); ++i) pick_draft(*next[i], res_.logits.data() + static_cast<int64_t>(i) * V, V, j, idx_);
    }
    chain = std::move(next);
    want = std::move(next_want);
    chain_row.resize(chain.size());
    for (size_t i = 0; i < chain.size(); ++i) chain_row[i] = static_cast<int32_t>(i);
  }
  if (on_device) collect_drafts();
}

void MtpProposer::propose(const std::vector<ProposeInput>& in) {
  // Catch-up: every committed token of every sequence, last rows of drafting ones with logits.
  Batch b;
  std::vector<int32_t> rows;
  std::vector<Request*> chain;      // drafting sequences, in batch order
  std::vector<int32_t> chain_row;   // each one's row of the last head step's output
  std::vector<int32_t> want;
  for (const ProposeInput& p : in) {
    Request& r = *p.req;
    r.drafts.clear();
    r.draft_probs.clear();
    if (p.n_rows <= 0) continue;
    if (p.pos0 + p.n_rows >= static_cast<int64_t>(r.tokens.size()))
      fail(PE_ERR_INTERNAL, "MTP catch-up of request ", r.id, " past its known tokens");
    SeqChunk s;
    s.n_past = p.pos0;
    s.n_new = p.n_rows;
    s.page_table = r.pages.data();
    s.logits = p.n_drafts > 0 ? LogitsMode::Last : LogitsMode::None;
    b.seqs.push_back(s);
    b.tokens.insert(b.tokens.end(), r.tokens.begin() + p.pos0 + 1, r.tokens.begin() + p.pos0 + 1 + p.n_rows);
    for (int64_t i = 0; i < p.n_rows; ++i) rows.push_back(p.hidden_row0 + static_cast<int32_t>(i));
    if (p.n_drafts > 0) {
      chain.push_back(&r);
      chain_row.push_back(static_cast<int32_t>(rows.size()) - 1);
      want.push_back(p.n_drafts);
    }
  }
  if (b.seqs.empty()) return;
  // The greedy chain on the device (header) where every drafting request samples at T = 0.
  auto greedy = [](const Request* r) { return r->sampling.temperature == 0.0f; };
  const bool on_device = !tp_ && !chain.empty() && std::all_of(chain.begin(), chain.end(), greedy);
  b.host_outputs = !on_device;
  step(b, rows);
  try {
    chain_steps(on_device, std::move(chain), std::move(chain_row), std::move(want));
  } catch (...) {
    // A launch left pending would be collected as the engine's next step's samples.
    if (pending_) {
      pending_ = false;
      try {
        model_.sample_collect(outs_);
      } catch (...) {
      }
    }
    throw;
  }
}

}  // namespace pe
