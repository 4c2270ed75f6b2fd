#include "engine/dflash_proposer.h"

#include <algorithm>

#include "core/error.h"

namespace pe {

DFlashProposer::DFlashProposer(Model& target, DFlashDraft& draft, KvPool& kv) : target_(target), draft_(draft), kv_(kv) {
  const DFlashConfig& c = draft.config();
  if (c.hidden != target.config().hidden || c.vocab != target.config().vocab)
    fail(PE_ERR_INVALID_ARGUMENT, "the DFlash draft was made for another target (hidden ", c.hidden, ", vocabulary ",
         c.vocab, "; the model has ", target.config().hidden, ", ", target.config().vocab, ")");
  const cpu::PagedKV probe = kv.layer(0);
  if (kv.n_layers() != c.n_layers || probe.n_kv_heads != c.n_kv_heads || probe.head_dim != c.head_dim)
    fail(PE_ERR_INTERNAL, "the DFlash proposer's KV pool has ", kv.n_layers(), " layers x ", probe.n_kv_heads,
         " heads of ", probe.head_dim, ", the draft needs ", c.n_layers, " x ", c.n_kv_heads, " of ", c.head_dim);
}

void DFlashProposer::propose(const std::vector<ProposeInput>& in) {
  const DFlashConfig& c = draft_.config();
  const int64_t H = c.hidden, V = c.vocab;
  // The step's kept rows, layer-major in target_layers order: feature j of row t at
  // first + j * rows * H + t * H.
  int64_t rows = 0;
  const float* first = target_.kept_hidden(c.target_layers.front(), &rows);
  for (size_t j = 0; j < c.target_layers.size(); ++j) {
    int64_t n = 0;
    const float* f = target_.kept_hidden(c.target_layers[j], &n);
    if (!f || n != rows || f != first + static_cast<int64_t>(j) * rows * H)
      fail(PE_ERR_INTERNAL, "DFlash proposer: target layer ", c.target_layers[j], " was not kept by the step");
  }
  seqs_.clear();
  std::vector<const ProposeInput*> drafting;
  for (const ProposeInput& p : in) {
    Request& r = *p.req;
    r.drafts.clear();
    r.draft_probs.clear();
    if (p.n_rows <= 0) continue;
    if (p.hidden_row0 < 0 || p.hidden_row0 + p.n_rows > rows)
      fail(PE_ERR_INTERNAL, "DFlash proposer: rows ", p.hidden_row0, " + ", p.n_rows, " of request ", r.id,
           " outside the step's ", rows);
    DraftSeq s;
    s.n_context = p.pos0;
    s.n_new = p.n_rows;
    s.features = first + static_cast<int64_t>(p.hidden_row0) * H;
    s.layer_stride = rows * H;
    s.row_stride = H;
    s.draft = p.n_drafts > 0;
    s.n_logits = std::min<int64_t>(p.n_drafts, c.block_size - 1);  // the lm_head for the drafts taken only
    if (s.draft) {
      const int64_t pending = p.pos0 + p.n_rows;
      if (pending >= static_cast<int64_t>(r.tokens.size()))
        fail(PE_ERR_INTERNAL, "DFlash proposer: request ", r.id, " has no token at position ", pending);
      s.last_token = r.tokens[static_cast<size_t>(pending)];
      drafting.push_back(&p);
    }
    s.page_table = r.pages.data();
    seqs_.push_back(s);
  }
  if (seqs_.empty()) return;
  // Greedy drafts on the draft's device (header) where every drafting request samples at T = 0.
  auto greedy = [](const ProposeInput* p) { return p->req->sampling.temperature == 0.0f; };
  const bool on_device = !drafting.empty() && std::all_of(drafting.begin(), drafting.end(), greedy);
  draft_.forward(seqs_, kv_, !on_device, res_);
  if (on_device) {
    int64_t rows_total = 0;
    for (const ProposeInput* p : drafting) rows_total += std::min<int64_t>(p->n_drafts, c.block_size - 1);
    argmax_jobs(rows_total, jobs_);
    draft_.sample_launch(res_, jobs_);
    draft_.sample_collect(outs_);
    if (static_cast<int64_t>(outs_.size()) != rows_total)
      fail(PE_ERR_INTERNAL, "DFlash proposer: ", outs_.size(), " drafts for ", rows_total, " block rows");
  }
  int64_t row = 0;  // drafting sequences' rows follow each other, n_logits each
  for (const ProposeInput* p : drafting) {
    const int64_t n = std::min<int64_t>(p->n_drafts, c.block_size - 1);
    for (int64_t j = 0; j < n; ++j) {
      if (on_device)
        p->req->drafts.push_back(outs_[static_cast<size_t>(row + j)].token);
      else
        pick_draft(*p->req, res_.logits.data() + (row + j) * V, V, j, idx_);
    }
    row += n;
  }
}

}  // namespace pe
