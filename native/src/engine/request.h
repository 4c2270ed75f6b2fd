// One generation request as the engine thread sees it: a sequence of the caches (cache/sequence.h:
// tokens, computed length, pages, GDN slot) and what the engine needs to run and finish it.
#pragma once
#include <cstdint>
#include <vector>

#include "cache/sequence.h"
#include "kernels/sampling.h"
#include "pyengine.h"

namespace pe {

struct Request : Sequence {
  SamplingConfig sampling;
  int32_t max_tokens = 16;
  bool ignore_eos = false;
  std::vector<int32_t> stop_ids;
  int32_t logprobs = -1;
  bool token_mask = false;      // each token waits for its grammar mask (engine/token_masks.h)
  bool mask_timed_out = false;  // a mask did not come: the request ends with an error

  int64_t admitted_order = 0;   // admission counter: the newest is preempted first
  bool cancel_requested = false;
  double last_token_time = 0.0;  // when its last token was emitted (0: none yet)

  // Speculative decoding (engine/speculative.h). drafts: tokens proposed after the last token,
  // verified by the next step; draft_probs [drafts, vocab]: the proposer's distribution of each
  // (empty: argmax drafts, a one-hot q).
  bool speculative = false;
  std::vector<int32_t> drafts;
  std::vector<float> draft_probs;
  int32_t draft_len = 0;               // drafts to propose next (adapted to its acceptance)
  float accept_rate[PE_SPEC_MAX_DRAFT] = {};  // running acceptance per draft position (engine_spec.cpp)
  int32_t spec_drafted[PE_SPEC_MAX_DRAFT] = {};   // per draft position
  int32_t spec_accepted[PE_SPEC_MAX_DRAFT] = {};
};

}  // namespace pe
