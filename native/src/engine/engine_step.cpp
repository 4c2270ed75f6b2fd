// Engine steps: schedule -> forward -> sample -> commit -> events, with the overlapped steps of
// engine.h (the next decode step queued before the current one's tokens are read).
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "engine/engine.h"
#include "kernels/sampling.h"

namespace pe {

bool Engine::launch(std::vector<ScheduledChunk> chunks, const std::vector<int64_t>& in_flight,
                    const std::vector<int32_t>& from, LaunchedStep& out, std::string& error) {
  const bool fed = !in_flight.empty();
  Batch batch;
  // A verify step's logits come to the host when some verify needs distributions (host_verify);
  // greedy verifies need only each row's argmax, sampled where the logits are (greedy_verify).
  bool host_verify = false;
  for (const ScheduledChunk& c : chunks) host_verify = host_verify || (c.n_drafts > 0 && !greedy_verify(*c.req));
  batch.host_outputs = model_.device() == Device::CPU || host_verify;
  batch.cuda_graph = params_.cuda_graphs != 0;
  if (proposer_) batch.keep_hidden = proposer_->hidden_layers();
  out.chunks = std::move(chunks);
  out.job_of.assign(out.chunks.size(), -1);
  out.first_row.clear();
  jobs_.clear();
  std::vector<std::pair<size_t, int64_t>> job_rows;  // per job: its chunk and row in the chunk's logits
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    const ScheduledChunk& c = out.chunks[i];
    Request& r = *c.req;
    const int64_t ahead = fed ? in_flight[i] : 0;  // tokens of r queued in the step before
    SeqChunk s;
    s.n_past = r.n_computed + ahead;
    s.n_new = c.n_tokens;
    out.shape.add(s.n_past, c.n_tokens, c.is_decode);
    s.gdn_slot = r.gdn_slot;
    s.page_table = r.pages.data();
    out.first_row.push_back(static_cast<int32_t>(batch.tokens.size()));
    if (c.n_drafts > 0) {
      // Verify: the next token and the drafts, logits for all; the GDN state after each of the
      // first n_drafts tokens to its position slot, in offset order with the chunk's snapshots.
      batch.tokens.push_back(r.tokens[static_cast<size_t>(r.n_computed)]);
      batch.tokens.insert(batch.tokens.end(), r.drafts.begin(), r.drafts.begin() + c.n_drafts);
      s.logits = LogitsMode::All;
      if (greedy_verify(r)) {  // one argmax job per row: the next token after each draft
        out.job_of[i] = static_cast<int32_t>(jobs_.size());
        for (int64_t j = 0; j <= c.n_drafts; ++j) {
          SampleJob jb;
          jb.cfg = r.sampling;
          jobs_.push_back(jb);
          job_rows.emplace_back(i, j);
        }
      }
      for (const SnapshotPoint& p : c.snapshots) s.snapshots.emplace_back(p.offset, p.slot);
      for (size_t d = 0; d < c.position_slots.size(); ++d)
        s.snapshots.emplace_back(static_cast<int64_t>(d) + 1, c.position_slots[d]);
      std::stable_sort(s.snapshots.begin(), s.snapshots.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      batch.seqs.push_back(std::move(s));
      continue;
    }
    const bool last = fed || r.n_computed + c.n_tokens == static_cast<int64_t>(r.tokens.size());
    s.logits = last ? LogitsMode::Last : LogitsMode::None;
    for (const SnapshotPoint& p : c.snapshots) s.snapshots.emplace_back(p.offset, p.slot);
    if (fed) {
      batch.tokens.push_back(0);  // written on the device from the previous step's sample
      batch.token_from_sample.push_back(from[i]);
    } else {
      batch.tokens.insert(batch.tokens.end(), r.tokens.begin() + r.n_computed,
                          r.tokens.begin() + r.n_computed + c.n_tokens);
    }
    batch.seqs.push_back(std::move(s));
    if (!last) continue;
    SampleJob j;
    j.cfg = r.sampling;
    // The token index counts the token the step before samples, which r.tokens does not hold yet.
    j.u = uniform_at(r.sampling.seed, static_cast<uint64_t>(r.n_generated() + (fed ? 1 : 0)));
    j.n_logprobs = r.logprobs;
    j.prompt = r.tokens.data();
    j.n_prompt = r.n_prompt;
    j.out = r.tokens.data() + r.n_prompt;
    j.n_out = r.n_generated();
    out.job_of[i] = static_cast<int32_t>(jobs_.size());
    jobs_.push_back(j);
    job_rows.emplace_back(i, 0);
  }
  try {
    if (tp_)
      tp_->forward(model_, batch, *kv_, *gdn_, result_);
    else
      model_.forward(batch, *kv_, *gdn_, result_);
    for (size_t k = 0; k < jobs_.size(); ++k) jobs_[k].row = result_.logit_row_begin[job_rows[k].first] + job_rows[k].second;
    wait_token_masks(out);
    // A device's logits that came to the host for a verify: every job is sampled there.
    out.host_sampled = host_verify && model_.device() != Device::CPU;
    if (out.host_sampled)
      host_sampler_.sample_all(result_, jobs_, model_.config().vocab, samples_);
    else
      model_.sample_launch(result_, jobs_);
  } catch (const std::exception& e) {
    sched_->abandon(out.chunks);
    error = e.what();
    return false;
  }
  return true;
}

bool Engine::launch_follow(const LaunchedStep& prev, LaunchedStep& out, std::string& error) {
  out.begin_time = now_seconds();
  out.overlapped = true;
  {
    std::lock_guard<std::mutex> g(in_mu_);
    if (!inbox_.empty() || !cancels_.empty()) return false;  // admissions and cancels first
  }
  if (sched_->n_waiting() > 0) return false;
  // Every running request samples in prev (none is prefilling) and none needs its history on the
  // host for penalties.
  for (const auto& r : sched_->running()) {
    // A grammar mask needs the token before it on the host first.
    if (r->sampling.any_penalty() || r->token_mask) return false;
    bool samples = false;
    for (size_t i = 0; i < prev.chunks.size() && !samples; ++i)
      samples = prev.chunks[i].req == r.get() && prev.job_of[i] >= 0;
    if (!samples) return false;
  }
  std::vector<ScheduledChunk> chunks;
  std::vector<int64_t> in_flight;
  std::vector<int32_t> from;
  for (size_t i = 0; i < prev.chunks.size(); ++i) {
    Request& r = *prev.chunks[i].req;
    // Requests that end by length with prev's token are left out (known now).
    if (r.n_generated() + 1 >= r.max_tokens || static_cast<int64_t>(r.tokens.size()) + 1 >= params_.max_model_len)
      continue;
    ScheduledChunk c;
    if (!sched_->schedule_follow(r, prev.chunks[i].n_tokens, c)) {
      sched_->abandon(chunks);
      return false;
    }
    chunks.push_back(std::move(c));
    in_flight.push_back(prev.chunks[i].n_tokens);
    from.push_back(prev.job_of[i]);
  }
  if (chunks.empty()) return false;
  if (!launch(std::move(chunks), in_flight, from, out, error)) return false;
  out.plan.shape = out.shape;
  if (cost_.ready()) out.plan.predicted_s = cost_.predict_seconds(out.shape);
  return true;
}

void Engine::wait_token_masks(const LaunchedStep& s) {
  constexpr double kMaskTimeoutS = 60.0;
  job_masks_.resize(jobs_.size());
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    const int32_t k = s.job_of[i];
    Request& r = *s.chunks[i].req;
    if (k < 0 || !r.token_mask) continue;
    bool has_mask = false;
    std::vector<uint32_t>& words = job_masks_[static_cast<size_t>(k)];
    const TokenMasks::Wait w = masks_->wait(r.id, r.n_generated(), kMaskTimeoutS, words, &has_mask);
    if (w == TokenMasks::Wait::TimedOut) r.mask_timed_out = true;
    jobs_[static_cast<size_t>(k)].allowed = w == TokenMasks::Wait::Ready && has_mask ? words.data() : nullptr;
  }
}

void Engine::emit_progress(const Request& r, int64_t step) {
  pe_event ev{};
  ev.request_id = r.id;
  ev.kind = PE_EVENT_PROGRESS;
  ev.step = step;
  ev.time = now_seconds();
  ev.prompt_tokens = r.n_prompt;
  ev.cached_tokens = r.n_cached;
  ev.prompt_computed = std::min(r.n_computed, r.n_prompt);
  push_event(ev);
}

void Engine::leave_launched(Request* r) {
  if (!launched_) return;
  LaunchedStep& s = *launched_;
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    if (s.chunks[i].req != r) continue;
    sched_->abandon({s.chunks[i]});  // its snapshot copies still run; the slots are free again
    if (s.job_of[i] >= 0) ++overlap_dropped_tokens_;
    s.chunks.erase(s.chunks.begin() + static_cast<std::ptrdiff_t>(i));
    s.job_of.erase(s.job_of.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
}

void Engine::collect(LaunchedStep& s) {
  std::vector<std::vector<SampleOut>> verified;  // per chunk: a verify's tokens to emit
  try {
    if (!s.host_sampled) model_.sample_collect(samples_);
    if (proposer_) verified = verify_chunks(s);
  } catch (const std::exception& e) {
    sched_->abandon(s.chunks);
    for (const ScheduledChunk& c : s.chunks) finish(c.req, PE_FINISH_ERROR, e.what());
    return;
  }
  // A speculating engine's step includes its proposer's turn (the drafts the next verify reads):
  // it is timed after it, so the step-cost model and the pacer see what a token costs.
  if (!proposer_) record_step(s, now_seconds());
  std::vector<const Request*> prefilled;  // chunks with prompt tokens: one progress event each
  for (const ScheduledChunk& c : s.chunks) {
    const int64_t n = std::min(c.req->n_prompt, c.req->n_computed + c.n_tokens) - c.req->n_computed;
    prompt_tokens_ += std::max<int64_t>(0, n);
    if (n > 0 && c.req->n_generated() == 0) prefilled.push_back(c.req);
  }
  std::vector<int64_t> starts;  // per chunk: where it began (the proposer's rows)
  for (const ScheduledChunk& c : s.chunks) starts.push_back(c.req->n_computed);
  const int64_t step = steps_++;
  std::vector<std::pair<Request*, int32_t>> finished;
  // Verify chunks first: their accepted drafts join r.tokens before the commit hashes the blocks
  // they complete; the chunk keeps the tokens up to the last one emitted (a stop ends it early).
  for (size_t i = 0; i < verified.size(); ++i) {
    if (verified[i].empty()) continue;
    ScheduledChunk& c = s.chunks[i];
    Request& r = *c.req;
    int64_t emitted = 0;
    for (const SampleOut& o : verified[i]) {
      const int32_t reason = emit_token(r, o, step);
      ++emitted;
      if (reason == PE_FINISH_NONE) continue;
      finished.emplace_back(&r, reason);
      break;  // tokens after a stop are dropped
    }
    sched_->accept(c, std::min<int64_t>(emitted, static_cast<int64_t>(verified[i].size())));
    r.drafts.clear();
    r.draft_probs.clear();
  }
  sched_->commit(s.chunks);
  for (const Request* r : prefilled) emit_progress(*r, step);
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    if (i < verified.size() && !verified[i].empty()) continue;
    if (s.job_of[i] < 0) continue;
    Request& r = *s.chunks[i].req;
    int32_t reason = emit_token(r, samples_.at(static_cast<size_t>(s.job_of[i])), step);
    if (r.mask_timed_out) reason = PE_FINISH_ERROR;
    if (reason != PE_FINISH_NONE) finished.emplace_back(&r, reason);
  }
  if (proposer_) {
    std::vector<Request*> done;
    for (auto& f : finished) done.push_back(f.first);
    propose_after(s, starts, done);
    record_step(s, now_seconds());
  }
  for (auto& [r, reason] : finished)
    finish(r, reason, r->mask_timed_out ? "no grammar token mask arrived within 60 s" : nullptr);
}

void Engine::record_step(const LaunchedStep& s, double end_time) {
  // A step queued before the previous one was read starts on the device when that one ends.
  const double seconds = end_time - std::max(s.begin_time, last_collect_time_);
  last_collect_time_ = end_time;
  // The engine's first step pays one-time costs (first touches of the pools and workspace): it
  // says nothing about the device's speed.
  if (steps_ > 0) cost_.observe(s.shape, seconds, s.overlapped);
  step_seconds_.observe(seconds);
  prefill_tokens_per_step_.observe(static_cast<double>(s.shape.prefill_tokens));
  last_plan_ = s.plan;
  last_step_s_ = seconds;
  if (s.plan.paced) ++paced_steps_;
  if (s.plan.paced && pacer_ && steps_ > 0) pacer_->observe(s.plan.predicted_s, seconds);
}

void Engine::run_step() {
  if (!launched_) {
    const double begin_time = now_seconds();
    std::vector<ScheduledChunk> chunks = sched_->schedule();
    if (chunks.empty()) {
      // Nothing can run and nothing running will free memory: the head request can never fit.
      const auto& w = sched_->waiting();
      const auto& run = sched_->running();
      Request* r = !run.empty() ? run.front().get() : !w.empty() ? w.front().get() : nullptr;
      if (r) finish(r, PE_FINISH_ERROR, "request cannot be scheduled: not enough KV pages or GDN slots");
      return;
    }
    LaunchedStep s;
    s.plan = sched_->last_plan();
    s.begin_time = begin_time;
    std::string error;
    if (!launch(std::move(chunks), {}, {}, s, error)) {
      for (const ScheduledChunk& c : s.chunks) finish(c.req, PE_FINISH_ERROR, error.c_str());
      return;
    }
    launched_ = std::move(s);
  }
  // launched_ is queued: queue the step after it first when it can be, then read its tokens.
  LaunchedStep next;
  std::string next_error;
  const bool follows = overlap_ && launch_follow(*launched_, next, next_error);
  // A follow-up step that failed to launch may have changed its requests' state part-way: they
  // end with its error once the current step's tokens are out (by id: some may finish there).
  std::vector<uint64_t> failed;
  if (!follows)
    for (const ScheduledChunk& c : next.chunks) failed.push_back(c.req->id);
  LaunchedStep current = std::move(*launched_);
  launched_.reset();
  if (follows) {
    launched_ = std::move(next);
    ++overlapped_steps_;
  }
  collect(current);
  for (uint64_t id : failed)
    if (Request* r = sched_->find(id)) finish(r, PE_FINISH_ERROR, next_error.c_str());
}

int32_t Engine::emit_token(Request& r, const SampleOut& so, int64_t step) {
  const int32_t tok = so.token;
  pe_event ev{};
  ev.request_id = r.id;
  ev.kind = PE_EVENT_TOKEN;
  ev.token = tok;
  ev.step = step;
  ev.time = now_seconds();
  if (r.last_token_time > 0.0) decode_itl_seconds_.observe(ev.time - r.last_token_time);
  r.last_token_time = ev.time;
  if (r.logprobs >= 0) {
    // Logprobs of the model's own distribution (raw logits: before penalties and temperature).
    ev.n_top = r.logprobs;
    ev.logprob = so.logprob;
    std::memcpy(ev.top_ids, so.top_ids, sizeof(int32_t) * r.logprobs);
    std::memcpy(ev.top_logprobs, so.top_logprobs, sizeof(float) * r.logprobs);
  }
  push_event(ev);
  r.tokens.push_back(tok);
  ++generated_tokens_;

  const bool is_eos = std::find(eos_.begin(), eos_.end(), tok) != eos_.end();
  const bool is_stop = std::find(r.stop_ids.begin(), r.stop_ids.end(), tok) != r.stop_ids.end();
  if ((is_eos && !r.ignore_eos) || is_stop) return PE_FINISH_STOP;
  if (r.n_generated() >= r.max_tokens || static_cast<int64_t>(r.tokens.size()) >= params_.max_model_len)
    return PE_FINISH_LENGTH;
  return PE_FINISH_NONE;
}

}  // namespace pe
