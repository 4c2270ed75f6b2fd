// The scheduler and memory planner on the CPU with fake model outputs: no forward runs; each
// step "computes" the scheduled tokens and appends a fake sampled token to finished prompts.
#include <algorithm>
#include <memory>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "cache/planner.h"
#include "cache/prefix_cache.h"
#include "check.h"
#include "core/error.h"
#include "engine/scheduler.h"
#include "tiny_config.h"

using namespace pe;

namespace {

struct Fixture {
  ModelConfig cfg = pe_test::tiny_config();
  KvPool kv;
  GdnPool gdn;
  std::unique_ptr<PrefixCache> cache;
  Scheduler sched;
  uint64_t next_id = 1;
  int64_t most_running = 0;  // the most requests running right after any schedule()
  // gdn_slots: running GDN slots (default max_batch). More than max_batch leaves the limit to
  // the scheduler alone: the engine's planner sizes the pool to max_batch, which would hide a
  // scheduler that admits past it.
  Fixture(SchedulerParams p, int64_t pages, int64_t page_size = 4, bool with_cache = false, int64_t gdn_slots = 0,
          const StepPacer* pacer = nullptr)
      : kv(cfg, pages, page_size),
        gdn(cfg, gdn_slots > 0 ? gdn_slots : p.max_batch, with_cache ? 4 : 0),
        cache(with_cache ? std::make_unique<PrefixCache>(kv, gdn, 1) : nullptr),
        sched(p, kv, gdn, cache.get(), pacer) {}

  Request* add(int64_t prompt_len, int32_t max_tokens = 4, int64_t seed = -1) {
    auto r = std::make_unique<Request>();
    r->id = next_id++;
    const int64_t s = seed < 0 ? static_cast<int64_t>(r->id) : seed;
    for (int64_t i = 0; i < prompt_len; ++i) r->tokens.push_back(static_cast<int32_t>((i * 7 + s) % 100));
    r->n_prompt = prompt_len;
    r->max_tokens = max_tokens;
    Request* raw = r.get();
    sched.add(std::move(r));
    return raw;
  }

  // One fake step: commit, append a token to every request whose tokens are all computed,
  // remove those that reached max_tokens. Returns the chunks.
  std::vector<ScheduledChunk> step() {
    auto chunks = sched.schedule();
    most_running = std::max(most_running, sched.n_running());
    sched.commit(chunks);
    std::vector<Request*> done;
    for (auto& c : chunks) {
      Request* r = c.req;
      if (r->n_computed == static_cast<int64_t>(r->tokens.size())) {
        r->tokens.push_back(1);
        if (r->n_generated() >= r->max_tokens) done.push_back(r);
      }
    }
    for (Request* r : done) sched.remove(r);
    return chunks;
  }

  int64_t tokens_of(const std::vector<ScheduledChunk>& cs, const Request* r) {
    for (auto& c : cs)
      if (c.req == r) return c.n_tokens;
    return 0;
  }
};

SchedulerParams params(int64_t max_batch, int64_t chunk, bool cooperative = true) {
  SchedulerParams p;
  p.max_batch = max_batch;
  p.chunked_prefill_size = chunk;
  p.max_num_batched_tokens = chunk + max_batch;
  p.cooperative_prefill = cooperative;
  return p;
}

}  // namespace

TEST(decode_tokens_come_first_and_the_budget_holds) {
  Fixture f(params(4, 8), 200);
  Request* a = f.add(3, 100);
  f.step();  // a prefilled and sampled
  Request* b = f.add(40);
  auto cs = f.step();
  CHECK_EQ(f.tokens_of(cs, a), 1);
  CHECK_EQ(f.tokens_of(cs, b), 8);
  int64_t total = 0;
  for (auto& c : cs) total += c.n_tokens;
  CHECK(total <= 12);
}

TEST(cooperative_admits_a_short_request_at_the_next_chunk_boundary) {
  Fixture f(params(4, 8), 200);
  Request* long_req = f.add(160);
  f.step();
  f.step();
  Request* short_req = f.add(5);
  auto cs = f.step();
  CHECK_EQ(f.tokens_of(cs, short_req), 5);   // its whole prompt, shortest first
  CHECK_EQ(f.tokens_of(cs, long_req), 7);    // the long one keeps the rest of the budget
  cs = f.step();
  CHECK_EQ(f.tokens_of(cs, short_req), 1);   // decoding while the long prompt prefills
}

TEST(blocking_mode_runs_the_long_prefill_to_the_end) {
  Fixture f(params(4, 8, false), 200);
  Request* long_req = f.add(160);
  f.step();
  Request* short_req = f.add(5);
  int64_t steps = 0;
  while (long_req->n_computed < 160) {
    auto cs = f.step();
    CHECK_EQ(f.tokens_of(cs, short_req), 0);
    ++steps;
  }
  CHECK_EQ(steps, 19);
  auto cs = f.step();
  CHECK(f.tokens_of(cs, short_req) == 5);
}

TEST(max_batch_is_honoured_exactly) {
  Fixture f(params(3, 64), 200, 4, false, 5);
  for (int i = 0; i < 5; ++i) f.add(4, 50);
  f.step();
  CHECK_EQ(f.sched.n_running(), 3);
  CHECK_EQ(f.sched.n_waiting(), 2);
}

TEST(running_never_exceeds_max_batch_with_a_larger_slot_pool) {
  // Arrivals at random steps, prompts longer than a chunk, and few enough pages that requests
  // get preempted and come back: at no step do more than max_batch requests hold a slot or get
  // a chunk, and the limit is reached (the test would pass vacuously otherwise).
  for (bool cooperative : {true, false}) {
    Fixture f(params(2, 8, cooperative), 12, 4, false, 5);
    pe_test::Rng rng(11);
    int64_t added = 0, most_chunks = 0, steps = 0;
    while ((added < 12 || f.sched.n_running() + f.sched.n_waiting() > 0) && steps < 2000) {
      if (added < 12 && rng.below(3) == 0) {
        f.add(1 + rng.below(20), static_cast<int32_t>(1 + rng.below(12)));
        ++added;
      }
      most_chunks = std::max(most_chunks, static_cast<int64_t>(f.step().size()));
      ++steps;
    }
    CHECK_EQ(f.most_running, 2);
    CHECK_EQ(most_chunks, 2);
    CHECK_EQ(added, 12);
    CHECK_EQ(f.sched.n_running() + f.sched.n_waiting(), 0);
    CHECK(f.sched.preemptions() >= 1);
  }
}

TEST(requests_added_before_a_step_are_admitted_in_arrival_order) {
  // What a batch queued by pe_engine_add_requests meets: admission follows arrival, not length
  // (shortest-first orders only the prefill chunks), and every admitted short prompt runs whole.
  Fixture f(params(3, 64), 200);
  Request* rs[5];
  const int64_t lens[5] = {30, 4, 12, 2, 7};
  for (int i = 0; i < 5; ++i) rs[i] = f.add(lens[i], 50);
  auto cs = f.step();
  for (int i = 0; i < 3; ++i) {
    CHECK_EQ(rs[i]->admitted_order, i + 1);
    CHECK_EQ(f.tokens_of(cs, rs[i]), lens[i]);
  }
  CHECK_EQ(f.tokens_of(cs, rs[3]), 0);
  CHECK_EQ(f.sched.n_waiting(), 2);
  CHECK(f.sched.waiting().front().get() == rs[3]);
}

TEST(out_of_pages_preempts_the_newest_and_everything_returns) {
  // 10 pages of 4 tokens: two requests growing to 24 tokens each cannot both fit.
  Fixture f(params(2, 64), 10);
  Request* a = f.add(8, 16);
  Request* b = f.add(8, 16);
  for (int i = 0; i < 200 && (f.sched.n_running() + f.sched.n_waiting()) > 0; ++i) f.step();
  CHECK(f.sched.preemptions() >= 1);
  CHECK_EQ(f.sched.n_running() + f.sched.n_waiting(), 0);
  CHECK_EQ(f.kv.n_free(), 10);
  CHECK_EQ(f.gdn.n_running_free(), 2);
  (void)a;
  (void)b;
}

TEST(prefix_cache_shares_blocks_and_counts_references) {
  Fixture f(params(2, 64), 50, 4, true);
  f.add(13, 1, 42);
  f.step();  // prompt of 13: blocks [0,4) [4,8) [8,12) full, a snapshot after each
  CHECK_EQ(f.sched.n_running(), 0);
  CHECK_EQ(f.cache->n_blocks(), 3);
  CHECK_EQ(f.cache->n_pages_held(), 3);
  CHECK_EQ(f.kv.n_free(), 47);
  Request* b = f.add(13, 1, 42);  // the same prompt
  Request* c = f.add(13, 1, 43);  // another prompt: no hit
  auto cs = f.sched.schedule();
  CHECK_EQ(b->n_cached, 12);
  CHECK_EQ(f.tokens_of(cs, b), 1);
  CHECK_EQ(c->n_cached, 0);
  CHECK_EQ(f.tokens_of(cs, c), 13);
  CHECK_EQ(f.kv.refcount(b->pages[0]), 2);  // the cache and b
  CHECK_EQ(f.cache->hit_tokens(), 12);
  f.sched.commit(cs);
  f.sched.remove(b);
  f.sched.remove(c);
  CHECK_EQ(f.kv.n_free() + f.cache->n_pages_held(), 50);
  CHECK_EQ(f.cache->evict_pages(100), 6);  // b and c offered their blocks too: 3 + 3
  CHECK_EQ(f.kv.n_free(), 50);
}

TEST(schedule_follow_plans_past_the_tokens_in_flight) {
  // Overlapped steps (engine.h): a's decode chunk after a step of it that is queued but not
  // committed, whose token is not in a.tokens yet. Pages of 4 (5 in all), a snapshot at every
  // generated block boundary (interval 1).
  Fixture f(params(2, 64), 5, 4, true);
  Request* a = f.add(7, 100, 7);
  auto cs = f.sched.schedule();  // the whole prompt in flight
  CHECK_EQ(f.tokens_of(cs, a), 7);
  CHECK_EQ(static_cast<int64_t>(a->pages.size()), 2);
  ScheduledChunk next;
  CHECK(f.sched.schedule_follow(*a, 7, next));  // position 7: its end (8) is a block boundary
  CHECK(next.req == a && next.n_tokens == 1);
  CHECK_EQ(static_cast<int64_t>(next.snapshots.size()), 1);
  if (!next.snapshots.empty()) CHECK_EQ(next.snapshots[0].offset, 1);
  CHECK_EQ(static_cast<int64_t>(a->pages.size()), 2);
  f.sched.commit(cs);
  a->tokens.push_back(1);  // the first step's token, read back
  f.sched.commit({next});
  a->tokens.push_back(2);
  CHECK_EQ(f.cache->n_blocks(), 2);
  // Position 8 in flight: the chunk after it (9) needs a third page, and no snapshot.
  CHECK(f.sched.schedule_follow(*a, 1, next));
  CHECK(next.snapshots.empty());
  CHECK_EQ(static_cast<int64_t>(a->pages.size()), 3);
  // b takes the last two pages; a follow-up that needs a fourth page gets false, preempting no one
  // (the cache's blocks are a's pages too: nothing to evict).
  Request* b = f.add(7, 100, 9);
  auto cs2 = f.sched.schedule();
  CHECK_EQ(f.tokens_of(cs2, b), 7);
  CHECK_EQ(f.kv.n_free(), 0);
  CHECK(!f.sched.schedule_follow(*a, 4, next));  // position 12
  CHECK_EQ(f.sched.preemptions(), 0);
  CHECK_EQ(f.sched.n_running(), 2);
}

namespace {
// A device of known costs for the pacer: 1 ms a step, 0.5 ms a decode row, 0.25 ms a prefill
// token (no depth term).
struct FakeCost : StepCost {
  bool is_ready = true;
  double predict_seconds(const StepShape& s) const override {
    return 1e-3 * (1.0 + 0.5 * static_cast<double>(s.decode_rows) + 0.25 * static_cast<double>(s.prefill_tokens));
  }
  bool ready() const override { return is_ready; }
};
}  // namespace

TEST(paced_steps_cut_the_long_prefill_to_the_limit_while_requests_decode) {
  FakeCost cost;
  StepPacer pacer(cost, 8.0, 64, 4);  // 8 ms: 1 + 0.5 ms fixed leaves 26 tokens, cut to 24
  Fixture f(params(4, 64), 400, 4, false, 0, &pacer);
  Request* a = f.add(3, 1000);
  f.step();
  Request* b = f.add(600, 2);  // stays after its prompt (one token of two)
  int64_t prefilled = 0, steps = 0;
  while (b->n_computed < 600) {
    auto cs = f.step();
    CHECK_EQ(f.tokens_of(cs, a), 1);  // a token every step
    const StepPlan& plan = f.sched.last_plan();
    CHECK(plan.paced);
    CHECK(plan.predicted_s <= 8e-3 + 1e-12);
    CHECK_EQ(plan.shape.decode_rows, 1);
    CHECK_EQ(f.tokens_of(cs, b), 24);
    prefilled += f.tokens_of(cs, b);
    ++steps;
  }
  CHECK_EQ(prefilled, 600);
  CHECK_EQ(steps, 25);
}

TEST(without_a_request_waiting_for_a_token_prefill_runs_in_full_chunks) {
  FakeCost cost;
  StepPacer pacer(cost, 8.0, 64, 4);
  Fixture f(params(4, 64), 400, 4, false, 0, &pacer);
  Request* b = f.add(600, 2);  // stays after its prompt (one token of two)
  auto cs = f.step();
  CHECK_EQ(f.tokens_of(cs, b), 64);
  CHECK(!f.sched.last_plan().paced);
  // A cost model that is not ready paces nothing, decodes or not.
  cost.is_ready = false;
  Request* a = f.add(3, 1000);
  f.step();
  cs = f.step();
  CHECK_EQ(f.tokens_of(cs, a), 1);
  CHECK_EQ(f.tokens_of(cs, b), 64);  // a full chunk beside a's decode row
  CHECK(!f.sched.last_plan().paced);
}

TEST(a_prompt_that_ends_in_the_step_is_kept_whole_and_paces_the_long_one) {
  FakeCost cost;
  StepPacer pacer(cost, 8.0, 64, 4);
  Fixture f(params(4, 64), 400, 4, false, 0, &pacer);
  Request* b = f.add(600, 2);  // stays after its prompt (one token of two)
  f.step();
  Request* c = f.add(9, 5);  // 1 + 2.25 ms: the long prefill gets 4.75 ms, 19 tokens, cut to 16
  auto cs = f.step();
  CHECK_EQ(f.tokens_of(cs, c), 9);
  CHECK_EQ(f.tokens_of(cs, b), 16);
  CHECK(f.sched.last_plan().paced);
  CHECK_EQ((b->n_computed) % 4, 0);
  // A prompt longer than the limit allows is still not cut when no request decodes: cutting it
  // would only delay its own first token.
  Fixture g(params(4, 64), 400, 4, false, 0, &pacer);
  Request* d = g.add(600, 1);
  g.step();
  Request* e = g.add(40, 5);  // 11 ms alone
  cs = g.step();
  CHECK_EQ(g.tokens_of(cs, e), 40);
  CHECK_EQ(g.tokens_of(cs, d), 4);  // over the limit already: one block, so it keeps going
}

TEST(a_limit_the_decode_rows_alone_exceed_still_advances_the_prefill_a_block_a_step) {
  FakeCost cost;
  StepPacer pacer(cost, 1.0, 64, 4);  // 1 ms: less than a step with one decode row
  Fixture f(params(4, 64), 400, 4, false, 0, &pacer);
  Request* a = f.add(3, 1000);
  Request* a2 = f.add(3, 1000);
  f.step();
  Request* b = f.add(100, 1);
  Request* b2 = f.add(200, 1);
  for (int i = 0; i < 10; ++i) {
    auto cs = f.step();
    CHECK_EQ(f.tokens_of(cs, a) + f.tokens_of(cs, a2), 2);
    CHECK_EQ(f.tokens_of(cs, b), 4);  // the shortest, one block
    CHECK_EQ(f.tokens_of(cs, b2), 0);
  }
  CHECK_EQ(b->n_computed, 40);
}

TEST(planner_reports_and_refuses_with_numbers) {
  ModelConfig c = pe_test::tiny_config();
  PlanRequest r;
  r.max_batch = 2;
  r.max_model_len = 64;
  r.page_size = 16;
  r.prefix_cache = true;
  const int64_t page = KvPool::page_bytes(c, 16), slot = GdnPool::slot_bytes(c);
  r.budget_bytes = 2 * slot + 100 * page;
  pe_memory_plan p = plan_memory(c, r);
  CHECK_EQ(p.gdn_slots, 2);
  CHECK_EQ(p.kv_page_bytes, page);
  CHECK(p.used_bytes <= r.budget_bytes);
  CHECK_EQ(p.kv_pages * page + p.snapshot_slots * slot + 2 * slot, p.used_bytes);
  CHECK_EQ(p.context_tokens_per_session, 64);
  CHECK_EQ(p.sessions_at_full_context, 2);
  r.budget_bytes = 2 * slot + 4 * page;  // 4 full-context pages + 1 for the other session needed
  bool threw = false;
  try {
    plan_memory(c, r);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("needs at least") != std::string::npos;
  }
  CHECK(threw);
}
