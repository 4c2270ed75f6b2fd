// A token sequence as the caches see it: its tokens, how far its state is computed, where that
// state lives (KV pages, GDN slot) and its prefix-cache hash chain. The engine's Request is one
// (engine/request.h), so the caches take sequences and never see the engine's bookkeeping.
#pragma once
#include <cstdint>
#include <vector>

namespace pe {

struct Sequence {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t n_prompt = 0;
  int64_t n_computed = 0;       // leading tokens whose KV / GDN state is in place
  int64_t n_cached = 0;         // prompt tokens served from the prefix cache

  int32_t gdn_slot = -1;        // running slot, -1 while waiting
  std::vector<int32_t> pages;   // KV pages covering the first n_computed (+ scheduled) tokens
  std::vector<uint64_t> block_hashes;  // prefix-cache hash chain of its full blocks, as far as known
  int64_t n_blocks_offered = 0;       // full blocks already offered to the prefix cache

  int64_t n_generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
  int64_t n_remaining() const { return static_cast<int64_t>(tokens.size()) - n_computed; }
  bool is_running() const { return gdn_slot >= 0; }
};

}  // namespace pe
