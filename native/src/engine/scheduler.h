// Token-budget scheduler: one mechanism, no phases.
//
// Each step takes one decode token of every running request whose prompt is done, then fills
// the rest of the token budget with prefill chunks (at most chunked_prefill_size tokens per
// request), shortest remaining prefill first, admitting waiting requests in arrival order while
// a GDN slot and KV pages are free. With cooperative_prefill off, a request in the middle of its
// prefill has the step to itself until its prompt is done (blocking prefill; tools/
// bench_cooperative.py measures both). When KV pages run out, the newest running request is preempted: its pages
// and slot are freed and it waits again to recompute (its generated tokens are kept).
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "cache/prefix_cache.h"
#include "engine/request.h"
#include "engine/step_cost.h"
#include "engine/step_pacer.h"

namespace pe {

struct SchedulerParams {
  int64_t max_batch = 8;
  int64_t chunked_prefill_size = 512;
  int64_t max_num_batched_tokens = 520;
  bool cooperative_prefill = true;
};

struct ScheduledChunk {
  Request* req;
  int64_t n_tokens;  // tokens[n_computed, n_computed + n_tokens) run this step
  std::vector<SnapshotPoint> snapshots;  // GDN state copies to take inside the chunk
  // The request's next token (its prompt is done), not prefill: decode rows to the pacer. A
  // speculative verify chunk (1 + k tokens) is one too.
  bool is_decode = false;
  // A verify chunk: the request's next token and its first n_drafts drafts (n_tokens = 1 +
  // n_drafts); position_slots[i] receives the GDN state after token i + 1 of the chunk (running
  // slots, the rollback states).
  int64_t n_drafts = 0;
  std::vector<int32_t> position_slots;
};

// What schedule() planned for its step.
struct StepPlan {
  StepShape shape;            // what the step computes
  bool paced = false;         // its prefill chunks were sized to limit_s
  double limit_s = 0.0;       // the time limit (paced steps)
  double predicted_s = 0.0;   // the cost model's prediction for the step (0 while not ready)
};

class Scheduler {
 public:
  // pacer: null for full prefill chunks always.
  Scheduler(const SchedulerParams& p, KvPool& kv, GdnPool& gdn, PrefixCache* cache,
            const StepPacer* pacer = nullptr);

  void add(std::unique_ptr<Request> r);
  // Plans one step: allocates slots and pages for the chunks it returns.
  std::vector<ScheduledChunk> schedule();
  // After the forward: the chunks' tokens are now computed (and offered to the prefix cache).
  void commit(const std::vector<ScheduledChunk>& chunks);
  // Overlapped steps (engine.h): r's decode chunk after `in_flight` tokens of it that are queued
  // but not committed yet (their step runs). Allocates its pages and plans its snapshots; false
  // when a page is not free (nothing is preempted for it).
  bool schedule_follow(Request& r, int64_t in_flight, ScheduledChunk& out);
  // Returns the snapshot and position slots of chunks that will not run (the step failed).
  void abandon(const std::vector<ScheduledChunk>& chunks);
  // Speculative decoding: pages for r's next n_tokens (evicting cached pages, never preempting);
  // false when they are not all there.
  bool reserve_pages(Request& r, int64_t n_tokens) { return ensure_pages(r, n_tokens); }
  // After a verify that kept n_keep of its chunk's tokens: its GDN state becomes the one after
  // them (a position slot or the live one), the other slots and the snapshots taken after them
  // are released, and the chunk shrinks to n_keep tokens (commit follows).
  void accept(ScheduledChunk& c, int64_t n_keep);
  // Pages past the one holding position n_computed go back (wholly rejected drafts).
  void trim_pages(Request& r);
  // Removes a request (finished or cancelled), releases its slot and pages.
  std::unique_ptr<Request> remove(Request* r);
  Request* find(uint64_t id);

  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  const std::vector<std::unique_ptr<Request>>& running() const { return running_; }
  const std::deque<std::unique_ptr<Request>>& waiting() const { return waiting_; }
  int64_t preemptions() const { return preemptions_; }
  // The plan of the last schedule() call.
  const StepPlan& last_plan() const { return plan_; }

 private:
  bool admit_front();
  bool ensure_pages(Request& r, int64_t n_tokens);
  void preempt(Request* victim);
  Request* newest_after(const Request* r);
  void release(Request& r);
  void add_prefill_chunks(int64_t budget, std::vector<ScheduledChunk>& out);
  void add_drafts(ScheduledChunk& c, int64_t& budget);

  SchedulerParams p_;
  KvPool& kv_;
  GdnPool& gdn_;
  PrefixCache* cache_;
  const StepPacer* pacer_;
  StepPlan plan_;
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;
  int64_t admitted_ = 0;
  int64_t preemptions_ = 0;
};

}  // namespace pe
