// What every proposer shares: picking a draft from its logits row, and the requests' draft and
// acceptance streams.
#include "engine/proposer.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/sampling.h"

namespace pe {

uint64_t draft_seed(uint64_t seed) { return seed ^ 0xd1b54a32d192ed03ull; }
uint64_t accept_seed(uint64_t seed) { return seed ^ 0x8cb92ba72f3d8dd7ull; }

void argmax_jobs(int64_t n, std::vector<SampleJob>& jobs) {
  jobs.assign(static_cast<size_t>(n), SampleJob{});
  for (int64_t i = 0; i < n; ++i) jobs[static_cast<size_t>(i)].row = i;
}

void pick_draft(Request& r, const float* logits, int64_t V, int64_t j, std::vector<int32_t>& idx) {
  int32_t token = 0;
  if (r.sampling.temperature == 0.0f) {
    token = static_cast<int32_t>(std::max_element(logits, logits + V) - logits);  // lowest id on ties
  } else {
    SamplingConfig cfg = r.sampling;  // the request's transform without its history's penalties
    cfg.presence_penalty = cfg.frequency_penalty = 0.0f;
    cfg.repetition_penalty = 1.0f;
    r.draft_probs.resize(static_cast<size_t>((j + 1) * V));
    float* q = r.draft_probs.data() + j * V;
    idx.resize(static_cast<size_t>(V));
    cpu::sample_probs(logits, V, cfg, q, idx.data());
    // Inverse CDF over q itself, so the draft always has q > 0.
    const float u = uniform_at(draft_seed(r.sampling.seed), static_cast<uint64_t>(r.n_generated() + j));
    double total = 0.0;
    for (int64_t t = 0; t < V; ++t) total += q[t];
    double acc = 0.0, target = u * total;
    token = -1;
    for (int64_t t = 0; t < V; ++t) {
      if (q[t] <= 0.0f) continue;
      token = static_cast<int32_t>(t);
      acc += q[t];
      if (acc > target) break;
    }
    if (token < 0) fail(PE_ERR_INTERNAL, "draft distribution of request ", r.id, " is empty");
  }
  r.drafts.push_back(token);
}

}  // namespace pe
