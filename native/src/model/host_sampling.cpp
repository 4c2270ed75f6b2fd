#include "model/host_sampling.h"

#include <cstring>

#include "core/error.h"

namespace pe {

void HostSampler::sample(const float* logits, const SampleJob& j, int64_t V, SampleOut& out) {
  work.resize(static_cast<size_t>(2 * V));
  idx.resize(static_cast<size_t>(V));
  float* w = work.data();
  std::memcpy(w, logits, sizeof(float) * V);
  cpu::apply_penalties(w, V, j.cfg, j.prompt, j.n_prompt, j.out, j.n_out);
  if (j.allowed) cpu::apply_token_mask(w, V, j.allowed);
  out.token = cpu::sample(w, V, j.cfg, j.u, w + V, idx.data());
  if (j.n_logprobs >= 0) cpu::logprobs(logits, V, out.token, j.n_logprobs, &out.logprob, out.top_ids, out.top_logprobs);
}

void HostSampler::sample_all(const ForwardResult& res, const std::vector<SampleJob>& jobs, int64_t V,
                             std::vector<SampleOut>& outs) {
  outs.assign(jobs.size(), SampleOut{});
  for (size_t i = 0; i < jobs.size(); ++i) {
    const SampleJob& j = jobs[i];
    if (j.row < 0 || (j.row + 1) * V > static_cast<int64_t>(res.logits.size()))
      fail(PE_ERR_INTERNAL, "sample: job ", i, " reads logits row ", j.row, " of ",
           static_cast<int64_t>(res.logits.size()) / V);
    sample(res.logits.data() + j.row * V, j, V, outs[i]);
  }
}

}  // namespace pe
