// The engine: a thread that loops schedule -> forward -> sample -> events over a model, with a
// thread-safe inbox (add, cancel) and outbox (events) for the C API.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "cache/planner.h"
#include "cache/prefix_cache.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "pyengine.h"

namespace pe {

class Engine {
 public:
  Engine(Model& model, const pe_engine_params& params);
  ~Engine();

  uint64_t add_request(const int32_t* tokens, int64_t n, const pe_sampling_params& sp);
  // Validates all n requests, then queues them in one inbox push (all or none; see
  // pe_engine_add_requests) and writes their ids to out_ids.
  void add_requests(int32_t n, const int32_t* const* tokens, const int64_t* n_tokens,
                    const pe_sampling_params* sp, uint64_t* out_ids);
  void cancel(uint64_t id);
  int32_t poll(pe_event* out, int32_t max_events, int32_t timeout_ms);
  pe_engine_stats stats();
  const pe_memory_plan& plan() const { return plan_; }

 private:
  // Checks one prompt and its sampling values (throws INVALID_ARGUMENT naming the problem) and
  // builds its Request, without an id.
  std::unique_ptr<Request> make_request(const int32_t* tokens, int64_t n, const pe_sampling_params& sp) const;
  // Gives the requests ids and appends them to the inbox under one lock: the engine thread
  // drains the inbox whole, so they are admitted at the same step boundary.
  void enqueue(std::vector<std::unique_ptr<Request>>& requests, uint64_t* out_ids);
  void loop();
  void drain_inbox();
  void run_step();
  // Emits r's sampled token; returns the finish reason it causes (PE_FINISH_NONE: none).
  int32_t emit_token(Request& r, const SampleOut& s, int64_t step);
  int64_t memory_budget(const PlanRequest& pr);
  void finish(Request* r, int32_t reason, const char* message = nullptr);
  void push_event(const pe_event& ev);
  void flush_events();
  void publish_stats();

  Model& model_;
  pe_engine_params params_;
  pe_memory_plan plan_{};
  std::unique_ptr<KvPool> kv_;
  std::unique_ptr<GdnPool> gdn_;
  std::unique_ptr<PrefixCache> cache_;
  std::unique_ptr<Scheduler> sched_;
  std::vector<int32_t> eos_;

  std::mutex in_mu_;
  std::condition_variable in_cv_;
  // A vector, so enqueue can reserve first and then push a batch without throwing half-way.
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;  // under in_mu_: ids follow inbox order
  bool stop_ = false;

  std::mutex out_mu_;
  std::condition_variable out_cv_;
  std::deque<pe_event> events_;
  std::vector<pe_event> pending_;  // engine thread only

  std::mutex stats_mu_;
  pe_engine_stats stats_{};

  int64_t steps_ = 0;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  ForwardResult result_;
  std::vector<SampleJob> jobs_;
  std::vector<SampleOut> samples_;
  int64_t device_bytes_baseline_ = 0;
  std::thread thread_;
};

}  // namespace pe
