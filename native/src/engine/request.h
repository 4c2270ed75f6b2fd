// One generation request as the engine thread sees it.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/sampling.h"

namespace pe {

struct Request {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t n_prompt = 0;
  int64_t n_computed = 0;       // leading tokens whose KV / GDN state is in place
  int64_t n_cached = 0;         // prompt tokens served from the prefix cache
  SamplingConfig sampling;
  int32_t max_tokens = 16;
  bool ignore_eos = false;
  std::vector<int32_t> stop_ids;
  int32_t logprobs = -1;
  bool token_mask = false;      // each token waits for its grammar mask (engine/token_masks.h)
  bool mask_timed_out = false;  // a mask did not come: the request ends with an error

  int32_t gdn_slot = -1;        // running slot, -1 while waiting
  std::vector<int32_t> pages;   // KV pages covering the first n_computed (+ scheduled) tokens
  int64_t admitted_order = 0;   // admission counter: the newest is preempted first
  bool cancel_requested = false;
  std::vector<uint64_t> block_hashes;  // prefix-cache hash chain of its full blocks, as far as known
  int64_t n_blocks_offered = 0;       // full blocks already offered to the prefix cache

  int64_t n_generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
  int64_t n_remaining() const { return static_cast<int64_t>(tokens.size()) - n_computed; }
  bool is_running() const { return gdn_slot >= 0; }
};

}  // namespace pe
