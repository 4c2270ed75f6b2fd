// One SampleJob on the host from its fp32 logits row: penalties, the grammar mask, the sampling
// transform, the draw with j.u, and logprobs of the raw row. The CPU backend's sampling, and the
// engine's for steps whose logits come to the host on any device (speculative verify steps).
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace pe {

struct HostSampler {
  std::vector<float> work;    // 2 * vocab
  std::vector<int32_t> idx;   // vocab

  void sample(const float* logits, const SampleJob& j, int64_t V, SampleOut& out);
  // Every job of a forward whose logits are on the host (res.logits).
  void sample_all(const ForwardResult& res, const std::vector<SampleJob>& jobs, int64_t V,
                  std::vector<SampleOut>& outs);
};

}  // namespace pe
