// Speculative decoding in the engine (engine.h): the option checks, the verify of a step's verify
// chunks with its rollback, the adaptive draft length, and the proposer's turn after each step.
//
// Design decision (adaptive draft length): each request keeps a running acceptance rate per draft
// position (exponential, weight 1/5 on the newest verify that drafted it) and drafts the leading
// positions whose rate is at least kMinAcceptRate next time, at least one, at most
// speculative_num_draft_tokens. A draft costs a head step and a verify row whether it is accepted
// or not, about a quarter of a decode step on the CPU, so a position accepted less than ~30 % of
// the time costs more than it brings (measured: the default model on code accepts position 3 at
// 0.2, and drafting it made the whole run 20 % slower than stopping at 2). A position past the
// drafted ones moves up when a verify accepts every draft, so the length grows back.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "engine/engine.h"

namespace pe {

static constexpr float kMinAcceptRate = 0.3f;
static constexpr float kRateWeight = 0.2f;

void Engine::check_speculative() const {
  const int32_t algo = params_.speculative_algorithm;
  if (algo == PE_SPEC_NONE) return;
  if (algo == PE_SPEC_DFLASH) {
    if (tp_) fail(PE_ERR_UNSUPPORTED, "speculative_algorithm dflash runs at tensor_parallel_size 1 only (use mtp)");
    if (!draft_)
      fail(PE_ERR_INVALID_ARGUMENT, "speculative_algorithm dflash needs a DFlash draft model "
                                    "(speculative_draft_model_path)");
    if (draft_->device() != model_.device())
      fail(PE_ERR_INVALID_ARGUMENT, "the DFlash draft runs on another device than the model");
    return;
  }
  if (!model_.has_mtp())
    fail(PE_ERR_INVALID_ARGUMENT, "speculative_algorithm mtp needs a checkpoint with an MTP head (mtp.* tensors); "
                                  "this one has none");
}

int32_t Engine::drafts_wanted(Request& r) {
  int64_t n = r.draft_len;
  n = std::min<int64_t>(n, r.max_tokens - r.n_generated() - 1);
  n = std::min<int64_t>(n, params_.max_model_len - r.n_computed - 2);
  n = std::min<int64_t>(n, proposer_->max_drafts());
  // The proposer's rows past the computed tokens stay inside the context and its pages.
  while (n > 0 && (r.n_computed + proposer_->rows_ahead(n) > params_.max_model_len ||
                   !sched_->reserve_pages(r, proposer_->rows_ahead(n))))
    --n;
  return static_cast<int32_t>(std::max<int64_t>(n, 0));
}

bool Engine::greedy_verify(const Request& r) {
  return r.sampling.temperature == 0.0f && !r.sampling.any_penalty() && r.logprobs < 0;
}

std::vector<std::vector<SampleOut>> Engine::verify_chunks(LaunchedStep& s) {
  const int64_t V = model_.config().vocab;
  std::vector<std::vector<SampleOut>> emit(s.chunks.size());
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    ScheduledChunk& c = s.chunks[i];
    if (c.n_drafts == 0) continue;
    Request& r = *c.req;
    int64_t a = 0;
    if (s.job_of[i] >= 0) {
      // Greedy: the drafts equal to their row's argmax are accepted, then the argmax after them
      // (what plain decoding gives, token for token).
      const size_t job = static_cast<size_t>(s.job_of[i]);
      if (job + c.n_drafts >= samples_.size())
        fail(PE_ERR_INTERNAL, "verify: request ", r.id, " has no samples for its ", c.n_drafts, " drafts");
      while (a < c.n_drafts && r.drafts[static_cast<size_t>(a)] == samples_[job + a].token) ++a;
      for (int64_t j = 0; j <= a; ++j) emit[i].push_back(samples_[job + j]);
    } else {
      const int64_t row = result_.logit_row_begin.at(i);
      if ((row + 1 + c.n_drafts) * V > static_cast<int64_t>(result_.logits.size()))
        fail(PE_ERR_INTERNAL, "verify: request ", r.id, " has no logits for its ", c.n_drafts, " drafts");
      a = verifier_.verify(r, result_.logits.data() + row * V, c.n_drafts, V, emit[i]);
    }
    ++spec_verifies_;
    spec_emitted_ += a + 1;
    for (int64_t j = 0; j < c.n_drafts; ++j) {
      ++spec_drafted_[j];
      ++r.spec_drafted[j];
      if (j < a) {
        ++spec_accepted_[j];
        ++r.spec_accepted[j];
      }
    }
    const int64_t k_max = params_.speculative_num_draft_tokens;
    for (int64_t j = 0; j < c.n_drafts; ++j)
      r.accept_rate[j] += kRateWeight * ((j < a ? 1.0f : 0.0f) - r.accept_rate[j]);
    if (a == c.n_drafts && a < k_max) r.accept_rate[a] += kRateWeight * (1.0f - r.accept_rate[a]);
    int32_t len = 1;
    while (len < k_max && r.accept_rate[len] >= kMinAcceptRate) ++len;
    r.draft_len = len;
  }
  return emit;
}

void Engine::propose_after(const LaunchedStep& s, const std::vector<int64_t>& starts,
                           const std::vector<Request*>& finished) {
  std::vector<ProposeInput> in;
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    Request* r = s.chunks[i].req;
    // A finished request's rows are brought up too (no drafts): its pages may serve a later
    // request from the prefix cache, whose drafter reads them.
    const bool done = std::find(finished.begin(), finished.end(), r) != finished.end();
    ProposeInput p;
    p.req = r;
    p.pos0 = starts[i];
    p.n_rows = s.chunks[i].n_tokens;
    p.hidden_row0 = s.first_row[i];
    sched_->trim_pages(*r);  // pages wholly past its next token: rejected drafts
    // A request whose prompt is done has its next token pending: drafts follow it.
    if (!done && r->speculative && r->n_remaining() == 1) p.n_drafts = drafts_wanted(*r);
    in.push_back(p);
  }
  if (in.empty()) return;
  const double t0 = now_seconds();
  try {
    proposer_->propose(in);
  } catch (const std::exception& e) {
    for (const ProposeInput& p : in)  // the finished ones end in collect, as they were to
      if (std::find(finished.begin(), finished.end(), p.req) == finished.end()) finish(p.req, PE_FINISH_ERROR, e.what());
  }
  spec_propose_seconds_ += now_seconds() - t0;
}

}  // namespace pe
