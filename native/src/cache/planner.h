// Memory planner: splits one byte budget between GDN state slots (one per running sequence, plus
// speculative decoding's per-position states and prefix-cache snapshots) and KV pages (of every
// attention layer of the shape: a drafter's own KV layer included), and says what that buys. It never lowers max_batch: when
// the asked configuration cannot fit, plan_memory throws with the numbers.
#pragma once
#include <cstdint>
#include <string>

#include "cache/cache_shape.h"
#include "core/dtype.h"
#include "pyengine.h"

namespace pe {

struct PlanRequest {
  int64_t budget_bytes = 0;   // bytes for KV pages + GDN slots
  int64_t max_batch = 1;
  int64_t max_model_len = 0;
  int64_t page_size = 16;
  bool prefix_cache = true;
  DType kv_dtype = DType::F32;
  // Speculative decoding: GDN slots per running sequence for the states after each draft
  // position of a verify (the rollback states).
  int64_t spec_slots_per_seq = 0;
  // Bytes per page of a drafter's cache on the same pages (a DFlash draft's KV): counted with
  // every KV page.
  int64_t draft_page_bytes = 0;
};

pe_memory_plan plan_memory(const CacheShape& shape, const PlanRequest& req);

// The budget used when the caller gives none on the CPU: room for max_batch full contexts and
// their snapshots, but at most a quarter of physical memory.
int64_t default_cpu_budget(const CacheShape& shape, const PlanRequest& req);

std::string describe_plan(const pe_memory_plan& p);

}  // namespace pe
