#include "cache/planner.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "core/error.h"

namespace pe {

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Snapshot slots wanted per running sequence: one at the end of the current turn, more for
// shared prefixes (system prompts) and older turns.
static constexpr int64_t kSnapshotsPerSequence = 4;

pe_memory_plan plan_memory(const CacheShape& shape, const PlanRequest& r) {
  if (r.max_batch < 1) fail(PE_ERR_INVALID_ARGUMENT, "max_batch must be >= 1, got ", r.max_batch);
  if (r.page_size < 1) fail(PE_ERR_INVALID_ARGUMENT, "kv_page_size must be >= 1, got ", r.page_size);
  if (r.max_model_len < 2) fail(PE_ERR_INVALID_ARGUMENT, "max_model_len must be >= 2, got ", r.max_model_len);
  pe_memory_plan p{};
  p.kv_page_size = r.page_size;
  p.kv_page_bytes = std::max<int64_t>(1, KvPool::page_bytes(shape, r.page_size, r.kv_dtype) + r.draft_page_bytes);
  p.gdn_slot_bytes = GdnPool::slot_bytes(shape);
  p.gdn_slots = r.max_batch;
  p.spec_state_slots = r.max_batch * std::max<int64_t>(0, r.spec_slots_per_seq);
  p.kv_layers = shape.n_attn_layers;
  p.budget_bytes = r.budget_bytes;

  const int64_t pages_one_full = ceil_div(r.max_model_len, r.page_size);
  // Every running sequence holds at least one page; one of them may need a full context.
  const int64_t min_pages = pages_one_full + (r.max_batch - 1);
  const int64_t slots_bytes = (r.max_batch + p.spec_state_slots) * p.gdn_slot_bytes;
  const int64_t min_bytes = slots_bytes + min_pages * p.kv_page_bytes;
  if (r.budget_bytes < min_bytes)
    fail(PE_ERR_OUT_OF_MEMORY, "memory plan: max_batch ", r.max_batch, " with max_model_len ", r.max_model_len,
         " needs at least ", min_bytes, " bytes (", r.max_batch + p.spec_state_slots, " GDN slots x ", p.gdn_slot_bytes,
         " B + ",
         min_pages, " KV pages x ", p.kv_page_bytes, " B) but the budget is ", r.budget_bytes,
         " bytes; lower max_batch or max_model_len, or raise the memory budget");

  int64_t left = r.budget_bytes - slots_bytes;
  if (r.prefix_cache && p.gdn_slot_bytes > 0) {
    // Snapshots take at most a quarter of what the pages could use, never the minimum pages.
    int64_t spare = left - min_pages * p.kv_page_bytes;
    int64_t want = kSnapshotsPerSequence * r.max_batch;
    p.snapshot_slots = std::min(want, std::min(spare, left / 4) / p.gdn_slot_bytes);
    p.snapshot_slots = std::max<int64_t>(p.snapshot_slots, 0);
    left -= p.snapshot_slots * p.gdn_slot_bytes;
  }
  p.kv_pages = left / p.kv_page_bytes;
  const int64_t pool_tokens = p.kv_pages * r.page_size;
  p.context_tokens_per_session = std::min<int64_t>(r.max_model_len, pool_tokens / r.max_batch);
  p.sessions_at_full_context = std::min<int64_t>(r.max_batch, pool_tokens / r.max_model_len);
  p.used_bytes = slots_bytes + p.snapshot_slots * p.gdn_slot_bytes + p.kv_pages * p.kv_page_bytes;
  return p;
}

int64_t default_cpu_budget(const CacheShape& shape, const PlanRequest& r) {
  const int64_t page_bytes = KvPool::page_bytes(shape, r.page_size, r.kv_dtype) + r.draft_page_bytes;
  const int64_t slot = GdnPool::slot_bytes(shape);
  const int64_t want = r.max_batch * (1 + kSnapshotsPerSequence + std::max<int64_t>(0, r.spec_slots_per_seq)) * slot +
                       r.max_batch * ceil_div(r.max_model_len, r.page_size) * page_bytes;
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGE_SIZE);
  int64_t phys = pages > 0 && psize > 0 ? int64_t(pages) * psize : int64_t(8) << 30;
  return std::min(want, phys / 4);
}

std::string describe_plan(const pe_memory_plan& p) {
  std::ostringstream os;
  os << "memory plan: " << p.kv_pages << " KV pages of " << p.kv_page_size << " tokens (" << p.kv_page_bytes
     << " B each), " << p.gdn_slots << " GDN slots + " << p.snapshot_slots << " snapshot slots + " << p.spec_state_slots
     << " speculative state slots ("
     << p.gdn_slot_bytes << " B each); context per session at max_batch: " << p.context_tokens_per_session
     << " tokens; sessions at full context: " << p.sessions_at_full_context << "; using " << p.used_bytes
     << " of " << p.budget_bytes << " B";
  return os.str();
}

}  // namespace pe
