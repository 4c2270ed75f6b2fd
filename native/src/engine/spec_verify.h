// The lossless verify of one sequence's drafts on the host (cpu::spec_verify): the target's
// sampling distribution p at each position of its verify chunk, with the request's penalties over
// its history and the drafts before that position, temperature, top-k, top-p and min-p; q from
// the drafter (draft_probs) or one-hot (argmax drafts). At temperature 0 the result is exactly
// what greedy decoding gives; above it the emitted tokens have the target's distribution.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/request.h"
#include "model/model.h"

namespace pe {

class SpecVerifier {
 public:
  // logits: the chunk's 1 + n_drafts rows [1 + n, V] (raw). Appends the tokens to emit (accepted
  // drafts, then the next token) to `emit`, with logprobs of the raw rows when r asks, and returns
  // the number of drafts accepted.
  int64_t verify(const Request& r, const float* logits, int64_t n_drafts, int64_t V, std::vector<SampleOut>& emit);

 private:
  std::vector<float> p_, work_, residual_, u_accept_;
  std::vector<int32_t> idx_, history_;
};

}  // namespace pe
