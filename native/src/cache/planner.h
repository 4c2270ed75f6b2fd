// Memory planner: splits one byte budget between GDN state slots (one per running sequence, plus
// prefix-cache snapshots) and KV pages, and says what that buys. It never lowers max_batch: when
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
};

pe_memory_plan plan_memory(const CacheShape& shape, const PlanRequest& req);

// The budget used when the caller gives none on the CPU: room for max_batch full contexts and
// their snapshots, but at most a quarter of physical memory.
int64_t default_cpu_budget(const CacheShape& shape, const PlanRequest& req);

std::string describe_plan(const pe_memory_plan& p);

}  // namespace pe
