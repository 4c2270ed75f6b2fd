// The engine: a thread that loops schedule -> forward -> sample -> events over a model, with a
// thread-safe inbox (add, cancel) and outbox (events) for the C API.
//
// Overlapped steps (engine option overlap_schedule; on by default on CUDA): while every running
// request is decoding, the next step is queued on the model before the current step's tokens are
// read back, its input tokens taken from where the model sampled them (Batch::token_from_sample).
// The host's work between two steps (reading the tokens, events, scheduling, the next upload and
// launches) then runs while the device computes, instead of between the device's steps. The
// next step is known without the tokens except for requests that stop on a sampled token
// (eos, a stop id) or are cancelled: they have computed one token too many when they finish,
// which is dropped; their pages and slot go back at once, since any later use of them is queued
// behind that step. Steps that admit, prefill or preempt run one at a time as before
// (engine_step.cpp).
//
// Speculative decoding (engine option speculative_algorithm; engine_spec.cpp): after each step a
// proposer (engine/proposer.h) drafts up to k tokens per speculating request from the target's
// kept hidden states; the next step verifies them as one chunk of 1 + k tokens beside the other
// requests' prefill chunks and decodes, keeping each GDN layer's state after every draft position
// in spare running slots. After the verify the state after the last accepted token becomes the
// live slot, the KV rows of rejected drafts fall behind n_computed (pages wholly past it go back)
// and prefix-cache snapshots taken after a rejected token are released: no replay. Greedy verifies
// sample their rows' argmax where the logits are, others test on the host; verify steps run one
// at a time (no overlapped steps while the engine speculates). At tensor parallel every rank runs
// the MTP head's steps (TpLeader::mtp_step); a DFlash draft runs at TP 1 only.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "cache/planner.h"
#include "cache/prefix_cache.h"
#include "engine/histogram.h"
#include "engine/proposer.h"
#include "engine/scheduler.h"
#include "engine/spec_verify.h"
#include "engine/step_cost.h"
#include "engine/step_pacer.h"
#include "engine/tp_group.h"
#include "engine/token_masks.h"
#include "model/dflash.h"
#include "model/host_sampling.h"
#include "model/model.h"
#include "pyengine.h"

namespace pe {

// Event times: seconds on the steady clock.
inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

class Engine {
 public:
  // tp: the leader of a tensor-parallel group whose rank 0 this model is (null: TP = 1).
  // draft: the DFlash draft of speculative_algorithm dflash (not owned; outlives the engine).
  Engine(Model& model, const pe_engine_params& params, TpLeader* tp = nullptr, DFlashDraft* draft = nullptr);
  ~Engine();

  uint64_t add_request(const int32_t* tokens, int64_t n, const pe_sampling_params& sp);
  // Validates all n requests, then queues them in one inbox push (all or none; see
  // pe_engine_add_requests) and writes their ids to out_ids.
  void add_requests(int32_t n, const int32_t* const* tokens, const int64_t* n_tokens,
                    const pe_sampling_params* sp, uint64_t* out_ids);
  void cancel(uint64_t id);
  // pe_engine_set_token_mask.
  void set_token_mask(uint64_t id, int64_t index, const uint32_t* words, int64_t n_words) {
    masks_->set(id, index, words, n_words);
  }
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
  // Step execution (engine_step.cpp).
  struct LaunchedStep {
    std::vector<ScheduledChunk> chunks;
    std::vector<int32_t> job_of;  // per chunk: its sample job (a greedy verify's first of 1 + n_drafts),
                                  // -1 when it samples no token
    StepShape shape;              // what it computes, for the step-cost model
    StepPlan plan;                // as schedule() planned it (a follow-up step: its decode rows)
    double begin_time = 0.0;      // when its planning began
    bool overlapped = false;      // queued before the step before it was read
    std::vector<int32_t> first_row;  // per chunk: its first token row in the batch
    bool host_sampled = false;       // its jobs were sampled on the host at launch (verify steps)
  };
  void run_step();
  // Queues a step's forward and sampling. in_flight non-empty: an overlapped step, chunk i's
  // request has in_flight[i] tokens queued before it and its input token is job from[i] of the
  // previous launch. On failure returns false with the error in `error` (nothing to collect).
  bool launch(std::vector<ScheduledChunk> chunks, const std::vector<int64_t>& in_flight,
              const std::vector<int32_t>& from, LaunchedStep& out, std::string& error);
  // The overlapped step behind `prev`, when the step after it is known without its tokens.
  bool launch_follow(const LaunchedStep& prev, LaunchedStep& out, std::string& error);
  // Reads a launched step's tokens, commits its chunks and emits its events.
  void collect(LaunchedStep& s);
  // A request that finishes leaves the queued step (its output there is dropped).
  void leave_launched(Request* r);
  // A collected step's time: to the cost model and the step histograms.
  void record_step(const LaunchedStep& s, double end_time);
  // Waits for the grammar masks of the jobs whose request has token_mask and points the jobs
  // at them (after the forward is queued, before the sampling).
  void wait_token_masks(const LaunchedStep& s);
  // PE_EVENT_PROGRESS for r's prompt.
  void emit_progress(const Request& r, int64_t step);
  // Emits r's sampled token; returns the finish reason it causes (PE_FINISH_NONE: none).
  int32_t emit_token(Request& r, const SampleOut& s, int64_t step);
  int64_t memory_budget(const PlanRequest& pr);
  // Speculative decoding (engine_spec.cpp).
  void check_speculative() const;
  // Drafts r may take next: its adapted length, cut to its remaining tokens, context and pages.
  int32_t drafts_wanted(Request& r);
  // A request whose verify needs only each row's argmax (temperature 0, no penalties, no logprobs):
  // its rows are sampled as jobs where the logits are, and no logits come to the host for it.
  static bool greedy_verify(const Request& r);
  // Verifies s's verify chunks (greedy ones from their rows' argmax jobs, others from the host
  // logits): per chunk the tokens to emit (accepted drafts and the next token; empty for other
  // chunks). collect emits them, then rolls back (accept).
  std::vector<std::vector<SampleOut>> verify_chunks(LaunchedStep& s);
  // After a step: the proposer's state over every committed token, drafts for the next.
  void propose_after(const LaunchedStep& s, const std::vector<int64_t>& starts, const std::vector<Request*>& finished);
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
  StepCostModel cost_;
  std::unique_ptr<StepPacer> pacer_;  // null when max_step_ms < 0
  std::unique_ptr<Scheduler> sched_;
  TpLeader* tp_ = nullptr;  // rank 0 of a tensor-parallel group
  std::unique_ptr<TokenMasks> masks_;
  std::vector<std::vector<uint32_t>> job_masks_;  // per sample job of the launch: its mask words
  std::vector<int32_t> eos_;
  DFlashDraft* draft_ = nullptr;         // speculative_algorithm dflash
  std::unique_ptr<KvPool> draft_kv_;     // the DFlash draft's cache, on the engine's pages
  std::unique_ptr<Proposer> proposer_;  // null: no speculative decoding
  SpecVerifier verifier_;
  HostSampler host_sampler_;
  int64_t spec_verifies_ = 0, spec_emitted_ = 0;
  double spec_propose_seconds_ = 0.0;
  int64_t spec_drafted_[PE_SPEC_MAX_DRAFT] = {}, spec_accepted_[PE_SPEC_MAX_DRAFT] = {};

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
  int64_t overlapped_steps_ = 0, overlap_dropped_tokens_ = 0;
  // Step timing (engine_step.cpp): the last step collected and what it planned and took.
  double last_collect_time_ = 0.0;
  StepPlan last_plan_;
  double last_step_s_ = 0.0;
  int64_t paced_steps_ = 0;
  Histogram step_seconds_{0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5};
  Histogram decode_itl_seconds_{0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5,
                                1.0, 2.5};
  Histogram prefill_tokens_per_step_{0, 1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
  bool overlap_ = false;
  std::optional<LaunchedStep> launched_;  // queued on the model, tokens not yet read
  ForwardResult result_;
  std::vector<SampleJob> jobs_;
  std::vector<SampleOut> samples_;
  int64_t device_bytes_baseline_ = 0;
  std::thread thread_;
};

}  // namespace pe
