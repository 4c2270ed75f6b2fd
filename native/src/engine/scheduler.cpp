#include "engine/scheduler.h"

#include <algorithm>

#include "cache/prefix_cache.h"
#include "core/error.h"

namespace pe {

Scheduler::Scheduler(const SchedulerParams& p, KvPool& kv, GdnPool& gdn, PrefixCache* cache,
                     const StepPacer* pacer)
    : p_(p), kv_(kv), gdn_(gdn), cache_(cache), pacer_(pacer) {}

void Scheduler::add(std::unique_ptr<Request> r) { waiting_.push_back(std::move(r)); }

Request* Scheduler::find(uint64_t id) {
  for (auto& r : running_)
    if (r->id == id) return r.get();
  for (auto& r : waiting_)
    if (r->id == id) return r.get();
  return nullptr;
}

void Scheduler::release(Request& r) {
  for (int32_t page : r.pages) kv_.unref(page);
  r.pages.clear();
  if (r.gdn_slot >= 0) gdn_.release(r.gdn_slot);
  r.gdn_slot = -1;
}

std::unique_ptr<Request> Scheduler::remove(Request* r) {
  std::unique_ptr<Request> out;
  auto it = std::find_if(running_.begin(), running_.end(), [&](auto& p) { return p.get() == r; });
  if (it != running_.end()) {
    out = std::move(*it);
    running_.erase(it);
  } else {
    auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](auto& p) { return p.get() == r; });
    if (w == waiting_.end()) fail(PE_ERR_INTERNAL, "request ", r->id, " not in the scheduler");
    out = std::move(*w);
    waiting_.erase(w);
  }
  if (cache_) cache_->on_finished(*out);
  release(*out);
  return out;
}

bool Scheduler::ensure_pages(Request& r, int64_t n_tokens) {
  const int64_t need = (r.n_computed + n_tokens + kv_.page_size() - 1) / kv_.page_size();
  while (static_cast<int64_t>(r.pages.size()) < need) {
    int32_t page = kv_.alloc();
    if (page < 0 && cache_) {
      cache_->evict_pages(need - static_cast<int64_t>(r.pages.size()));
      page = kv_.alloc();
    }
    if (page < 0) return false;
    r.pages.push_back(page);
  }
  return true;
}

void Scheduler::preempt(Request* victim) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](auto& p) { return p.get() == victim; });
  std::unique_ptr<Request> r = std::move(*it);
  running_.erase(it);
  release(*r);
  r->n_blocks_offered = 0;
  r->n_computed = 0;  // recomputed from its tokens (prompt + generated) when admitted again
  r->drafts.clear();  // proposed from state it no longer has
  r->draft_probs.clear();
  waiting_.push_front(std::move(r));
  ++preemptions_;
}

Request* Scheduler::newest_after(const Request* r) {
  Request* victim = nullptr;
  for (auto& q : running_)
    if (q->admitted_order > r->admitted_order && (!victim || q->admitted_order > victim->admitted_order))
      victim = q.get();
  return victim;
}

bool Scheduler::admit_front() {
  if (waiting_.empty() || static_cast<int64_t>(running_.size()) >= p_.max_batch) return false;
  Request& r = *waiting_.front();
  int32_t slot = gdn_.alloc_running();
  if (slot < 0) return false;
  r.gdn_slot = slot;
  if (cache_) cache_->attach(r);
  r.admitted_order = ++admitted_;
  running_.push_back(std::move(waiting_.front()));
  waiting_.pop_front();
  return true;
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  std::vector<ScheduledChunk> out;
  int64_t budget = p_.max_num_batched_tokens;
  plan_ = StepPlan{};

  // Blocking mode: a prefill in progress owns the step.
  if (!p_.cooperative_prefill) {
    for (auto& r : running_)
      if (r->n_remaining() > 1 && r->n_computed > 0) {
        int64_t n = std::min({r->n_remaining(), p_.chunked_prefill_size, budget});
        if (ensure_pages(*r, n)) out.push_back({r.get(), n, {}, false, 0, {}});
        if (cache_ && !out.empty()) out[0].snapshots = cache_->plan_snapshots(*r, r->n_computed, n);
        if (!out.empty()) plan_.shape.add(r->n_computed, n, false);
        return out;
      }
  }

  // 1. Decode tokens of running requests whose prompt is done (oldest first).
  std::sort(running_.begin(), running_.end(),
            [](auto& a, auto& b) { return a->admitted_order < b->admitted_order; });
  // Pages for a decode token come from newer requests first (preempted), never from older ones.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i].get();
    if (r->n_remaining() != 1 || r->n_computed == 0) {
      ++i;
      continue;
    }
    bool ok = ensure_pages(*r, 1);
    while (!ok) {
      Request* victim = newest_after(r);
      if (!victim) break;
      preempt(victim);
      ok = ensure_pages(*r, 1);
    }
    if (!ok) {
      if (running_.size() > 1) preempt(r);  // running_[i] is now the next request
      else ++i;
      continue;
    }
    out.push_back({r, 1, {}, true, 0, {}});
    --budget;
    add_drafts(out.back(), budget);
    ++i;
  }

  // 2. Admit waiting requests in arrival order while a slot is free. Blocking mode admits only
  // while no prefill is in progress (an admitted long prompt then owns the following steps).
  auto prefill_in_progress = [&] {
    for (auto& r : running_)
      if (r->n_remaining() > 1) return true;
    return false;
  };
  while (budget > 0 && (p_.cooperative_prefill || !prefill_in_progress()) && admit_front()) {
  }

  // 3. Prefill chunks.
  add_prefill_chunks(budget, out);
  if (cache_)
    for (ScheduledChunk& c : out) c.snapshots = cache_->plan_snapshots(*c.req, c.req->n_computed, c.n_tokens);
  return out;
}

// Shortest remaining first; in a paced step cut to the step's time limit (scheduler.h).
void Scheduler::add_prefill_chunks(int64_t budget, std::vector<ScheduledChunk>& out) {
  std::vector<Request*> prefills;
  for (auto& r : running_) {
    const bool decoding = std::any_of(out.begin(), out.end(), [&](auto& c) { return c.req == r.get(); });
    if (r->n_remaining() >= 1 && !decoding) prefills.push_back(r.get());
  }
  std::stable_sort(prefills.begin(), prefills.end(),
                   [](Request* a, Request* b) { return a->n_remaining() < b->n_remaining(); });
  StepShape& shape = plan_.shape;
  for (const ScheduledChunk& c : out) shape.add(c.req->n_computed, c.n_tokens, c.is_decode);
  const bool has_decode = !out.empty();
  const bool ends_a_prompt = std::any_of(prefills.begin(), prefills.end(), [&](Request* r) {
    return r->n_remaining() <= std::min(p_.chunked_prefill_size, budget);
  });
  const bool paced = pacer_ && pacer_->active() && (has_decode || ends_a_prompt);
  for (Request* r : prefills) {
    if (budget <= 0) break;
    int64_t n = std::min({r->n_remaining(), p_.chunked_prefill_size, budget});
    if (paced && (has_decode || n < r->n_remaining())) {
      if (!plan_.paced) plan_.limit_s = pacer_->limit_seconds(shape, r->n_computed);
      // The first cut chunk progresses; one that ends its prompt is not cut for whole row tiles.
      n = pacer_->fit(shape, r->n_computed, n, plan_.limit_s, !plan_.paced, n == r->n_remaining());
      plan_.paced = true;
      if (n <= 0) continue;
    }
    if (!ensure_pages(*r, n)) {
      // Keep what fits; a chunk of zero pages waits for pages to free up.
      int64_t fits = static_cast<int64_t>(r->pages.size()) * kv_.page_size() - r->n_computed;
      n = std::min(n, fits);
      if (n <= 0) continue;
    }
    out.push_back({r, n, {}, false, 0, {}});
    shape.add(r->n_computed, n, false);
    budget -= n;
  }
  if (pacer_ && pacer_->active()) plan_.predicted_s = pacer_->cost().predict_seconds(shape);
}

bool Scheduler::schedule_follow(Request& r, int64_t in_flight, ScheduledChunk& out) {
  if (!ensure_pages(r, in_flight + 1)) return false;
  out.req = &r;
  out.n_tokens = 1;
  out.is_decode = true;
  out.snapshots.clear();
  if (cache_) out.snapshots = cache_->plan_snapshots(r, r.n_computed + in_flight, 1);
  return true;
}

void Scheduler::abandon(const std::vector<ScheduledChunk>& chunks) {
  for (const ScheduledChunk& c : chunks) {
    for (const SnapshotPoint& s : c.snapshots) cache_->release_snapshot(s.slot);
    for (int32_t slot : c.position_slots) gdn_.release(slot);
  }
}

// A decode chunk of a request with drafts becomes a verify chunk of as many as the token budget,
// its pages and free running slots (one per draft: the state after it) allow.
void Scheduler::add_drafts(ScheduledChunk& c, int64_t& budget) {
  Request& r = *c.req;
  int64_t n = std::min<int64_t>(static_cast<int64_t>(r.drafts.size()), budget);
  while (n > 0 && !ensure_pages(r, 1 + n)) --n;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t slot = gdn_.alloc_running(false);
    if (slot < 0) break;
    c.position_slots.push_back(slot);
  }
  c.n_drafts = static_cast<int64_t>(c.position_slots.size());
  c.n_tokens = 1 + c.n_drafts;
  budget -= c.n_drafts;
}

void Scheduler::accept(ScheduledChunk& c, int64_t n_keep) {
  Request& r = *c.req;
  if (n_keep < 1 || n_keep > c.n_tokens) fail(PE_ERR_INTERNAL, "accept: ", n_keep, " of ", c.n_tokens, " tokens");
  if (n_keep < c.n_tokens) {
    gdn_.release(r.gdn_slot);
    r.gdn_slot = c.position_slots[static_cast<size_t>(n_keep - 1)];
  }
  for (int32_t slot : c.position_slots)
    if (slot != r.gdn_slot) gdn_.release(slot);
  c.position_slots.clear();
  std::vector<SnapshotPoint> kept;
  for (const SnapshotPoint& s : c.snapshots) {
    if (s.offset <= n_keep)
      kept.push_back(s);
    else
      gdn_.release(s.slot);  // of a state with rejected tokens in it
  }
  c.snapshots = std::move(kept);
  c.n_tokens = n_keep;
  c.n_drafts = n_keep - 1;
}

void Scheduler::trim_pages(Request& r) {
  const size_t keep = static_cast<size_t>((r.n_computed + 1 + kv_.page_size() - 1) / kv_.page_size());
  while (r.pages.size() > keep) {
    kv_.unref(r.pages.back());
    r.pages.pop_back();
  }
}

void Scheduler::commit(const std::vector<ScheduledChunk>& chunks) {
  for (const ScheduledChunk& c : chunks) {
    const int64_t start = c.req->n_computed;
    c.req->n_computed += c.n_tokens;
    if (cache_) cache_->on_computed(*c.req, c.snapshots, start);
  }
}

}  // namespace pe
