// Speculative decoding in the engine (engine.h): the option checks, the verify of a step's verify
// chunks with its rollback, the adaptive draft length, and the proposer's turn after each step.
//
// Design decision (adaptive draft length): each request keeps a running acceptance rate per draft
// position (exponential, weight 1/5 on the newest verify that drafted it: the share of verifies
// that accepted that position, so every earlier one too) and drafts the leading positions whose
// rate is at least the step's threshold next time, at least one, at most
// speculative_num_draft_tokens. A position past the drafted ones moves up when a verify accepts
// every draft, so the length grows back. The threshold is what a draft must bring to pay for
// itself: one more row of a step that takes T seconds and emits E tokens raises its tokens per
// second when its acceptance exceeds (row cost / T) x E. The step-cost model gives the row's
// share of T (step_cost.h: decode rows, the proposer's turn included), E is a running mean of the
// tokens verifying steps emit (this step's alone would raise the bar right after a long accept).
// On a GPU at small batches the rows of a verify cost almost nothing, so a DFlash block is
// verified whole. The threshold is at most kMinAcceptRate, the fixed rule measured on the CPU
// (the default model on code accepts MTP position 3 at 0.2, and drafting it made the whole run
// 20 % slower than stopping at 2): there the model's threshold is about that (0.3 - 0.5, moving
// with E) and measured no faster. Until the model rests on measurements the threshold is
// kMinAcceptRate, and it never falls below kMinAcceptFloor.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "engine/engine.h"

namespace pe {

static constexpr float kMinAcceptRate = 0.3f;
static constexpr float kMinAcceptFloor = 0.02f;
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

float Engine::draft_threshold(const LaunchedStep& s, int64_t emitted) {
  if (emitted <= 0) return last_draft_threshold_;
  emitted_per_step_ += emitted_per_step_ == 0.0 ? static_cast<double>(emitted)
                                                : kRateWeight * (static_cast<double>(emitted) - emitted_per_step_);
  if (!cost_.ready()) return kMinAcceptRate;
  const double t = cost_.row_share(s.shape) * emitted_per_step_;
  return static_cast<float>(std::clamp(t, static_cast<double>(kMinAcceptFloor), static_cast<double>(kMinAcceptRate)));
}

std::vector<std::vector<SampleOut>> Engine::verify_chunks(LaunchedStep& s) {
  const int64_t V = model_.config().vocab;
  std::vector<std::vector<SampleOut>> emit(s.chunks.size());
  std::vector<int64_t> accepted(s.chunks.size(), -1);  // per verify chunk: drafts accepted
  int64_t emitted = 0;                                   // the step's tokens, every chunk's
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    ScheduledChunk& c = s.chunks[i];
    if (c.n_drafts == 0) {
      emitted += s.job_of[i] >= 0 ? 1 : 0;
      continue;
    }
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
    accepted[i] = a;
    emitted += a + 1;
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
  }
  const float threshold = draft_threshold(s, emitted);
  last_draft_threshold_ = threshold;
  const int64_t k_max = params_.speculative_num_draft_tokens;
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    if (accepted[i] < 0) continue;
    Request& r = *s.chunks[i].req;
    const int64_t a = accepted[i], n = s.chunks[i].n_drafts;
    for (int64_t j = 0; j < n; ++j) r.accept_rate[j] += kRateWeight * ((j < a ? 1.0f : 0.0f) - r.accept_rate[j]);
    if (a == n && a < k_max) r.accept_rate[a] += kRateWeight * (1.0f - r.accept_rate[a]);
    int32_t len = 1;
    while (len < k_max && r.accept_rate[len] >= threshold) ++len;
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
