#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/threadpool.h"
#include "engine/dflash_proposer.h"
#include "engine/mtp_proposer.h"

namespace pe {

static void check_params(const pe_engine_params& p) {
  if (p.max_batch < 1) fail(PE_ERR_INVALID_ARGUMENT, "max_batch must be >= 1, got ", p.max_batch);
  if (p.max_model_len < 2) fail(PE_ERR_INVALID_ARGUMENT, "max_model_len must be >= 2, got ", p.max_model_len);
  if (p.chunked_prefill_size < 1)
    fail(PE_ERR_INVALID_ARGUMENT, "chunked_prefill_size must be >= 1, got ", p.chunked_prefill_size);
  if (p.max_num_batched_tokens < 0)
    fail(PE_ERR_INVALID_ARGUMENT, "max_num_batched_tokens must be >= 0, got ", p.max_num_batched_tokens);
  if (p.kv_page_size < 1 || p.kv_page_size > 4096)
    fail(PE_ERR_INVALID_ARGUMENT, "kv_page_size must be in [1, 4096], got ", p.kv_page_size);
  if (p.snapshot_interval_pages < 1)
    fail(PE_ERR_INVALID_ARGUMENT, "snapshot_interval_pages must be >= 1, got ", p.snapshot_interval_pages);
  if (p.kv_cache_bytes < 0) fail(PE_ERR_INVALID_ARGUMENT, "kv_cache_bytes must be >= 0, got ", p.kv_cache_bytes);
  if (!dtype_valid(p.kv_cache_dtype)) fail(PE_ERR_INVALID_ARGUMENT, "kv_cache_dtype: unknown code ", p.kv_cache_dtype);
  if (p.overlap_schedule < -1 || p.overlap_schedule > 1)
    fail(PE_ERR_INVALID_ARGUMENT, "overlap_schedule must be -1 (auto), 0 or 1, got ", p.overlap_schedule);
  if (!std::isfinite(p.max_step_ms))
    fail(PE_ERR_INVALID_ARGUMENT,
         "max_step_ms must be a finite number (> 0: a limit in ms, 0: derived, < 0: off), got ", p.max_step_ms);
  if (!(p.gpu_mem_ratio > 0.0f && p.gpu_mem_ratio <= 1.0f))
    fail(PE_ERR_INVALID_ARGUMENT, "gpu_mem_ratio must be in (0, 1], got ", p.gpu_mem_ratio);
  if (p.speculative_algorithm < PE_SPEC_NONE || p.speculative_algorithm > PE_SPEC_DFLASH)
    fail(PE_ERR_INVALID_ARGUMENT, "speculative_algorithm must be 0 (none), 1 (mtp) or 2 (dflash), got ",
         p.speculative_algorithm);
  if (p.speculative_algorithm != PE_SPEC_NONE &&
      (p.speculative_num_draft_tokens < 1 || p.speculative_num_draft_tokens > PE_SPEC_MAX_DRAFT))
    fail(PE_ERR_INVALID_ARGUMENT, "speculative_num_draft_tokens must be in [1, ", PE_SPEC_MAX_DRAFT, "], got ",
         p.speculative_num_draft_tokens);
}

Engine::Engine(Model& model, const pe_engine_params& params, TpLeader* tp, DFlashDraft* draft)
    : model_(model), params_(params), tp_(tp), draft_(draft) {
  check_params(params_);
  if (params_.cuda_graphs && model_.device() != Device::CUDA)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda_graphs needs device 'cuda' (it replays CUDA decode steps); this model runs on "
                                  "the CPU");
  if (params_.num_threads > 0) set_num_threads(params_.num_threads);
  const ModelConfig& cfg = model_.config();
  if (params_.max_model_len > cfg.max_positions && cfg.max_positions > 0)
    fail(PE_ERR_INVALID_ARGUMENT, "max_model_len ", params_.max_model_len, " exceeds the model's max_position_embeddings ",
         cfg.max_positions);
  check_speculative();
  const int32_t algo = params_.speculative_algorithm;
  const bool spec = algo != PE_SPEC_NONE;
  if (algo == PE_SPEC_DFLASH)  // a block proposes block_size - 1 drafts at most
    params_.speculative_num_draft_tokens =
        std::min<int32_t>(params_.speculative_num_draft_tokens, static_cast<int32_t>(draft_->config().block_size - 1));
  const int64_t k = spec ? params_.speculative_num_draft_tokens : 0;
  // The MTP head's KV is one more attention layer of the pages; a DFlash draft's is a pool of its
  // own on the same pages (dflash_proposer.h).
  const int64_t head_kv_layers = algo == PE_SPEC_MTP ? 1 : 0;
  CacheShape shape = cfg;
  shape.n_attn_layers += head_kv_layers;
  PlanRequest pr;
  pr.spec_slots_per_seq = k;
  pr.max_batch = params_.max_batch;
  pr.max_model_len = params_.max_model_len;
  pr.page_size = params_.kv_page_size;
  pr.prefix_cache = params_.prefix_cache != 0;
  pr.kv_dtype = static_cast<DType>(params_.kv_cache_dtype);
  if (algo == PE_SPEC_DFLASH)
    pr.draft_page_bytes = KvPool::page_bytes(draft_->config().cache_shape(), pr.page_size, pr.kv_dtype);
  SchedulerParams sp;
  sp.max_batch = params_.max_batch;
  sp.chunked_prefill_size = params_.chunked_prefill_size;
  sp.max_num_batched_tokens = params_.max_num_batched_tokens
                                  ? params_.max_num_batched_tokens
                                  : params_.chunked_prefill_size + params_.max_batch * (1 + k);
  sp.cooperative_prefill = params_.cooperative_prefill != 0;
  // Workspace first, so the memory measured for the pools is what the steps leave free.
  model_.reserve(sp.max_num_batched_tokens, params_.max_batch * (1 + k), params_.max_model_len);
  if (spec) {
    const int64_t kept = algo == PE_SPEC_MTP ? 1 : static_cast<int64_t>(draft_->config().target_layers.size());
    model_.reserve_kept(kept, sp.max_num_batched_tokens);
  }
  if (algo == PE_SPEC_DFLASH) draft_->reserve(sp.max_num_batched_tokens, params_.max_batch, params_.max_model_len,
                                               params_.kv_page_size);
  pr.budget_bytes = memory_budget(pr);
  plan_ = plan_memory(shape, pr);
  std::fprintf(stderr, "pyengine: %s\n", describe_plan(plan_).c_str());

  const Device dev = model_.device();
  kv_ = std::make_unique<KvPool>(shape, plan_.kv_pages, plan_.kv_page_size, pr.kv_dtype, dev);
  gdn_ = std::make_unique<GdnPool>(shape, plan_.gdn_slots + plan_.spec_state_slots, plan_.snapshot_slots, dev);
  if (algo == PE_SPEC_MTP) proposer_ = std::make_unique<MtpProposer>(model_, *kv_, tp_);
  if (algo == PE_SPEC_DFLASH) {
    draft_kv_ = std::make_unique<KvPool>(draft_->config().cache_shape(), plan_.kv_pages, plan_.kv_page_size, pr.kv_dtype, dev);
    proposer_ = std::make_unique<DFlashProposer>(model_, *draft_, *draft_kv_);
  }
  if (params_.prefix_cache && plan_.snapshot_slots > 0)
    cache_ = std::make_unique<PrefixCache>(*kv_, *gdn_, params_.snapshot_interval_pages);
  if (params_.max_step_ms >= 0.0f)
    pacer_ = std::make_unique<StepPacer>(cost_, params_.max_step_ms, sp.chunked_prefill_size, plan_.kv_page_size,
                                         model_.slow_rows(), model_.row_tile(), cache_ != nullptr);
  sched_ = std::make_unique<Scheduler>(sp, *kv_, *gdn_, cache_.get(), pacer_.get());
  masks_ = std::make_unique<TokenMasks>((cfg.vocab + 31) / 32);
  if (tp_) {
    if (params_.overlap_schedule == 1)
      fail(PE_ERR_INVALID_ARGUMENT, "overlap_schedule on needs tensor_parallel_size 1 (at TP > 1 the workers' inputs "
                                    "come from the leader's sampled tokens, one step behind)");
    TpPoolShape shape;
    shape.kv_pages = plan_.kv_pages;
    shape.kv_page_size = plan_.kv_page_size;
    shape.kv_dtype = params_.kv_cache_dtype;
    shape.kv_extra_layers = head_kv_layers;
    shape.gdn_running = plan_.gdn_slots + plan_.spec_state_slots;
    shape.reserve_kept_layers = spec ? 1 : 0;
    shape.gdn_snapshot = plan_.snapshot_slots;
    shape.reserve_tokens = sp.max_num_batched_tokens;
    shape.reserve_seqs = params_.max_batch;
    shape.reserve_context = params_.max_model_len;
    tp_->setup(shape, *gdn_);
  }
  if (spec && params_.overlap_schedule == 1)
    fail(PE_ERR_INVALID_ARGUMENT, "overlap_schedule on and speculative decoding exclude each other (a verify step's "
                                  "tokens are read before the next step is planned)");
  overlap_ = !tp_ && !spec && (params_.overlap_schedule == 1 || (params_.overlap_schedule < 0 && dev == Device::CUDA));
  for (int32_t id : params_.eos_token_ids)
    if (id >= 0) eos_.push_back(id);
  device_bytes_baseline_ = device_bytes_in_use(dev);
  publish_stats();
  thread_ = std::thread([this] { loop(); });
}

// Bytes for KV pages + GDN slots: kv_cache_bytes when given; on the CPU a default sized for the
// asked batch and context; on a GPU gpu_mem_ratio of the device memory minus what is already in
// use (weights, workspace) and a margin for the CUDA context's own needs.
int64_t Engine::memory_budget(const PlanRequest& pr) {
  if (params_.kv_cache_bytes) return params_.kv_cache_bytes;
  if (model_.device() == Device::CPU) return default_cpu_budget(model_.config(), pr);
  int64_t free_b = 0, total_b = 0;
  device_memory_info(model_.device(), &free_b, &total_b);
  const int64_t keep = static_cast<int64_t>((1.0 - params_.gpu_mem_ratio) * static_cast<double>(total_b));
  const int64_t margin = int64_t(512) << 20;
  const int64_t budget = free_b - keep - margin;
  if (budget <= 0)
    fail(PE_ERR_OUT_OF_MEMORY, "no device memory left for the KV cache: ", free_b, " bytes free of ", total_b,
         ", gpu_mem_ratio ", params_.gpu_mem_ratio, " keeps ", keep, " bytes unused");
  return budget;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> g(in_mu_);
    stop_ = true;
  }
  in_cv_.notify_all();
  masks_->shutdown();  // a step waiting for a mask goes on without it
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<Request> Engine::make_request(const int32_t* tokens, int64_t n, const pe_sampling_params& sp) const {
  const ModelConfig& cfg = model_.config();
  if (n < 1 || !tokens) fail(PE_ERR_INVALID_ARGUMENT, "prompt is empty");
  if (n > params_.max_model_len - 1)
    fail(PE_ERR_INVALID_ARGUMENT, "prompt has ", n, " tokens; max_model_len ", params_.max_model_len,
         " leaves room for at most ", params_.max_model_len - 1);
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg.vocab)
      fail(PE_ERR_INVALID_ARGUMENT, "prompt token ", i, " has id ", tokens[i], " outside the vocabulary [0, ", cfg.vocab, ")");
  if (!(sp.temperature >= 0.0f) || !std::isfinite(sp.temperature))
    fail(PE_ERR_INVALID_ARGUMENT, "temperature must be a finite number >= 0, got ", sp.temperature);
  if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f)) fail(PE_ERR_INVALID_ARGUMENT, "top_p must be in (0, 1], got ", sp.top_p);
  if (!(sp.min_p >= 0.0f && sp.min_p <= 1.0f)) fail(PE_ERR_INVALID_ARGUMENT, "min_p must be in [0, 1], got ", sp.min_p);
  if (sp.top_k < 0) fail(PE_ERR_INVALID_ARGUMENT, "top_k must be >= 0, got ", sp.top_k);
  if (sp.max_tokens < 1) fail(PE_ERR_INVALID_ARGUMENT, "max_tokens must be >= 1, got ", sp.max_tokens);
  if (!(sp.repetition_penalty > 0.0f) || !std::isfinite(sp.repetition_penalty))
    fail(PE_ERR_INVALID_ARGUMENT, "repetition_penalty must be > 0, got ", sp.repetition_penalty);
  if (!std::isfinite(sp.presence_penalty) || !std::isfinite(sp.frequency_penalty))
    fail(PE_ERR_INVALID_ARGUMENT, "presence_penalty and frequency_penalty must be finite");
  if (sp.logprobs < -1 || sp.logprobs > PE_MAX_TOP_LOGPROBS)
    fail(PE_ERR_INVALID_ARGUMENT, "logprobs must be in [-1, ", PE_MAX_TOP_LOGPROBS, "], got ", sp.logprobs);
  if (sp.n_stop_token_ids < 0 || (sp.n_stop_token_ids > 0 && !sp.stop_token_ids))
    fail(PE_ERR_INVALID_ARGUMENT, "stop_token_ids: bad count ", sp.n_stop_token_ids);
  if (sp.token_mask != 0 && sp.token_mask != 1)
    fail(PE_ERR_INVALID_ARGUMENT, "token_mask must be 0 or 1, got ", sp.token_mask);

  auto r = std::make_unique<Request>();
  r->tokens.assign(tokens, tokens + n);
  r->n_prompt = n;
  r->sampling.temperature = sp.temperature;
  r->sampling.top_p = sp.top_p;
  r->sampling.top_k = sp.top_k;
  r->sampling.min_p = sp.min_p;
  r->sampling.seed = sp.seed;
  r->sampling.presence_penalty = sp.presence_penalty;
  r->sampling.frequency_penalty = sp.frequency_penalty;
  r->sampling.repetition_penalty = sp.repetition_penalty;
  r->max_tokens = sp.max_tokens;
  r->ignore_eos = sp.ignore_eos != 0;
  r->stop_ids.assign(sp.stop_token_ids, sp.stop_token_ids + sp.n_stop_token_ids);
  r->logprobs = sp.logprobs;
  r->token_mask = sp.token_mask != 0;
  if (sp.speculative != 0 && sp.speculative != 1)
    fail(PE_ERR_INVALID_ARGUMENT, "speculative must be 0 or 1, got ", sp.speculative);
  // Grammar masks come one token at a time, after the token before: such requests decode plainly.
  r->speculative = proposer_ && sp.speculative && !r->token_mask;
  r->draft_len = params_.speculative_num_draft_tokens;
  for (float& rate : r->accept_rate) rate = 1.0f;  // optimistic: start at the most drafts
  return r;
}

void Engine::enqueue(std::vector<std::unique_ptr<Request>>& requests, uint64_t* out_ids) {
  {
    std::lock_guard<std::mutex> g(in_mu_);
    // The reserve is the only step that can throw; it leaves the inbox as it was.
    inbox_.reserve(inbox_.size() + requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i]->id = next_id_++;
      out_ids[i] = requests[i]->id;
      if (requests[i]->token_mask) masks_->expect(requests[i]->id);
      inbox_.push_back(std::move(requests[i]));
    }
  }
  in_cv_.notify_all();
}

uint64_t Engine::add_request(const int32_t* tokens, int64_t n, const pe_sampling_params& sp) {
  std::vector<std::unique_ptr<Request>> one;
  one.push_back(make_request(tokens, n, sp));
  uint64_t id = 0;
  enqueue(one, &id);
  return id;
}

void Engine::add_requests(int32_t n, const int32_t* const* tokens, const int64_t* n_tokens,
                          const pe_sampling_params* sp, uint64_t* out_ids) {
  if (n < 1) fail(PE_ERR_INVALID_ARGUMENT, "n_requests must be >= 1, got ", n);
  // All are built before any is queued, so a bad one leaves the inbox untouched.
  std::vector<std::unique_ptr<Request>> requests;
  requests.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    try {
      requests.push_back(make_request(tokens[i], n_tokens[i], sp[i]));
    } catch (const Error& e) {
      fail(e.code, "request ", i, ": ", e.what());
    }
  }
  enqueue(requests, out_ids);
}

void Engine::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> g(in_mu_);
    cancels_.push_back(id);
  }
  in_cv_.notify_all();
  masks_->cancel(id);  // a step waiting for its mask samples without it; the request ends next
}

// Events of a step are held until the step's stats are published, so a caller that sees a
// request's FINISHED event also sees its pages and slot back in stats().
void Engine::push_event(const pe_event& ev) { pending_.push_back(ev); }

void Engine::flush_events() {
  if (pending_.empty()) return;
  {
    std::lock_guard<std::mutex> g(out_mu_);
    for (const pe_event& ev : pending_) events_.push_back(ev);
  }
  pending_.clear();
  out_cv_.notify_all();
}

int32_t Engine::poll(pe_event* out, int32_t max_events, int32_t timeout_ms) {
  std::unique_lock<std::mutex> lk(out_mu_);
  if (events_.empty() && timeout_ms > 0)
    out_cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); });
  int32_t n = 0;
  while (n < max_events && !events_.empty()) {
    out[n++] = events_.front();
    events_.pop_front();
  }
  return n;
}

void Engine::finish(Request* r, int32_t reason, const char* message) {
  pe_event ev{};
  ev.request_id = r->id;
  ev.kind = PE_EVENT_FINISHED;
  ev.finish_reason = reason;
  ev.step = steps_;
  ev.time = now_seconds();
  ev.prompt_tokens = r->n_prompt;
  ev.cached_tokens = r->n_cached;
  if (message) std::snprintf(ev.error_message, sizeof(ev.error_message), "%s", message);
  for (int i = 0; i < PE_SPEC_MAX_DRAFT; ++i) {
    ev.spec_drafted[i] = r->spec_drafted[i];
    ev.spec_accepted[i] = r->spec_accepted[i];
  }
  if (r->token_mask) masks_->forget(r->id);
  // A prompt cancelled mid-prefill: what it computed stays cached, so a resend resumes there.
  if (reason == PE_FINISH_CANCELLED && cache_ && r->is_running() && r->n_generated() == 0)
    cache_->keep_prefill_state(*r);
  leave_launched(r);
  sched_->remove(r);
  push_event(ev);
}

void Engine::drain_inbox() {
  std::vector<std::unique_ptr<Request>> adds;
  std::vector<uint64_t> cancels;
  {
    // The whole inbox at once: requests queued by one add_requests are admitted together.
    std::lock_guard<std::mutex> g(in_mu_);
    adds.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& r : adds) sched_->add(std::move(r));
  for (uint64_t id : cancels)
    if (Request* r = sched_->find(id)) finish(r, PE_FINISH_CANCELLED);
}

void Engine::publish_stats() {
  pe_engine_stats s{};
  s.running = static_cast<int32_t>(sched_->n_running());
  s.waiting = static_cast<int32_t>(sched_->n_waiting());
  s.steps = steps_;
  s.kv_pages_total = kv_->n_pages();
  s.kv_pages_cached = cache_ ? cache_->n_pages_held() : 0;
  s.kv_pages_free = kv_->n_free() + s.kv_pages_cached;
  // Per-position state slots are all free between steps: they count as neither.
  s.gdn_slots_total = plan_.gdn_slots;
  s.gdn_slots_free = gdn_->n_running_free() - plan_.spec_state_slots;
  s.snapshot_slots_total = gdn_->n_snapshot();
  s.snapshot_slots_used = gdn_->n_snapshot() - gdn_->n_snapshot_free();
  s.prefix_cache_hit_tokens = cache_ ? cache_->hit_tokens() : 0;
  s.prompt_tokens = prompt_tokens_;
  s.generated_tokens = generated_tokens_;
  s.device_bytes_baseline = device_bytes_baseline_;
  s.overlapped_steps = overlapped_steps_;
  s.overlap_dropped_tokens = overlap_dropped_tokens_;
  s.max_step_ms = params_.max_step_ms;
  s.step_decode_rows = last_plan_.shape.decode_rows;
  s.step_prefill_tokens = last_plan_.shape.prefill_tokens;
  s.step_paced = last_plan_.paced ? 1 : 0;
  s.step_limit_ms = last_plan_.paced ? last_plan_.limit_s * 1e3 : 0.0;
  s.step_predicted_ms = last_plan_.predicted_s * 1e3;
  s.step_headroom = pacer_ ? pacer_->headroom() : 1.0;
  s.step_ms = last_step_s_ * 1e3;
  s.paced_steps = paced_steps_;
  s.cost_model_ready = cost_.ready() ? 1 : 0;
  s.cost_model_steps = cost_.n_observed();
  const StepCostModel::Coefficients& k = cost_.coefficients();
  s.cost_base_ms = k[0] * 1e3;
  s.cost_decode_row_ms = k[1] * 1e3;
  s.cost_prefill_step_ms = k[2] * 1e3;
  s.cost_prefill_token_ms = k[3] * 1e3;
  s.cost_attention_ms = k[4] * 1e3;
  s.cost_scale_decode_only = cost_.class_scales()[0];
  s.cost_scale_prefill_only = cost_.class_scales()[1];
  s.cost_scale_mixed = cost_.class_scales()[2];
  s.step_seconds = step_seconds_.get();
  s.decode_itl_seconds = decode_itl_seconds_.get();
  s.prefill_tokens_per_step = prefill_tokens_per_step_.get();
  s.spec_verifies = spec_verifies_;
  s.spec_propose_seconds = spec_propose_seconds_;
  s.spec_emitted_tokens = spec_emitted_;
  for (int i = 0; i < PE_SPEC_MAX_DRAFT; ++i) {
    s.spec_drafted[i] = spec_drafted_[i];
    s.spec_accepted[i] = spec_accepted_[i];
  }
  std::lock_guard<std::mutex> g(stats_mu_);
  stats_ = s;
}

pe_engine_stats Engine::stats() {
  pe_engine_stats s;
  {
    std::lock_guard<std::mutex> g(stats_mu_);
    s = stats_;
  }
  // Asked of the driver when read, not at every step.
  s.device_bytes_in_use = device_bytes_in_use(model_.device());
  return s;
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(in_mu_);
      in_cv_.wait(lk, [&] {
        return stop_ || !inbox_.empty() || !cancels_.empty() || sched_->n_running() > 0 || sched_->n_waiting() > 0 ||
               launched_;
      });
      if (stop_) break;
    }
    drain_inbox();
    if (sched_->n_running() > 0 || sched_->n_waiting() > 0 || launched_) run_step();
    publish_stats();
    flush_events();
  }
  // Shutdown: the queued step is read (its tokens are emitted), then every request still known
  // ends as cancelled.
  if (launched_) {
    LaunchedStep s = std::move(*launched_);
    launched_.reset();
    collect(s);
  }
  drain_inbox();
  while (!sched_->running().empty()) finish(sched_->running().front().get(), PE_FINISH_CANCELLED);
  while (!sched_->waiting().empty()) finish(sched_->waiting().front().get(), PE_FINISH_CANCELLED);
  publish_stats();
  flush_events();
}

}  // namespace pe
