#include "engine/spec_verify.h"

#include <cstring>

#include "core/error.h"
#include "engine/proposer.h"
#include "kernels/sampling.h"

namespace pe {

int64_t SpecVerifier::verify(const Request& r, const float* logits, int64_t n, int64_t V,
                             std::vector<SampleOut>& emit) {
  if (n < 1 || static_cast<int64_t>(r.drafts.size()) < n)
    fail(PE_ERR_INTERNAL, "verify of ", n, " drafts; request ", r.id, " has ", r.drafts.size());
  const bool one_hot = r.draft_probs.empty();
  if (!one_hot && static_cast<int64_t>(r.draft_probs.size()) < n * V)
    fail(PE_ERR_INTERNAL, "verify: request ", r.id, " has draft probabilities for fewer than ", n, " drafts");
  p_.resize(static_cast<size_t>((n + 1) * V));
  work_.resize(static_cast<size_t>(V));
  residual_.resize(static_cast<size_t>(V));
  idx_.resize(static_cast<size_t>(V));
  // The penalties' output history at row i: the generated tokens, then drafts 0 .. i - 1.
  history_.assign(r.tokens.begin() + r.n_prompt, r.tokens.end());
  for (int64_t i = 0; i <= n; ++i) {
    std::memcpy(work_.data(), logits + i * V, sizeof(float) * V);
    cpu::apply_penalties(work_.data(), V, r.sampling, r.tokens.data(), r.n_prompt, history_.data(),
                         static_cast<int64_t>(history_.size()));
    cpu::sample_probs(work_.data(), V, r.sampling, p_.data() + i * V, idx_.data());
    if (i < n) history_.push_back(r.drafts[static_cast<size_t>(i)]);
  }
  // Draft i is generated token g + i (the request's pending token is g - 1).
  const uint64_t g = static_cast<uint64_t>(r.n_generated());
  u_accept_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) u_accept_[i] = uniform_at(accept_seed(r.sampling.seed), g + i);
  // The token after the accepted ones: one draw of the request's own stream per verify, at the
  // index of its first draft (indices grow with every verify, so no draw is used twice).
  const cpu::SpecVerifyResult res =
      cpu::spec_verify(p_.data(), one_hot ? nullptr : r.draft_probs.data(), r.drafts.data(), n, V, u_accept_.data(),
                       uniform_at(r.sampling.seed, g), residual_.data());
  const int64_t a = res.n_accepted;
  for (int64_t i = 0; i <= a; ++i) {
    SampleOut o;
    o.token = i < a ? r.drafts[static_cast<size_t>(i)] : res.next;
    if (r.logprobs >= 0) cpu::logprobs(logits + i * V, V, o.token, r.logprobs, &o.logprob, o.top_ids, o.top_logprobs);
    emit.push_back(o);
  }
  return a;
}

}  // namespace pe
