// extern "C" shims of the engine half of pyengine.h.
#include <memory>

#include "api/api_common.h"
#include "api/handles.h"
#include "engine/engine.h"
#include "model/dflash.h"
#include "pyengine.h"

using pe::fail;

extern "C" {

pe_engine_params pe_engine_default_params(void) {
  pe_engine_params p{};
  p.max_batch = 8;
  p.max_model_len = 8192;
  p.chunked_prefill_size = 512;
  p.max_num_batched_tokens = 0;
  p.cooperative_prefill = 1;
  p.prefix_cache = 1;
  p.kv_page_size = 16;
  p.snapshot_interval_pages = 16;
  p.kv_cache_bytes = 0;
  p.gpu_mem_ratio = 0.9f;
  p.num_threads = 0;
  p.kv_cache_dtype = PE_DTYPE_F32;
  for (int32_t& id : p.eos_token_ids) id = -1;
  p.overlap_schedule = -1;
  p.max_step_ms = 0.0f;
  p.speculative_algorithm = PE_SPEC_NONE;
  p.speculative_num_draft_tokens = 3;
  return p;
}

int32_t pe_engine_create(pe_model* model, const pe_engine_params* params, pe_engine** out_engine) {
  return pe::api::guarded([&] {
    if (!model || !params || !out_engine) fail(PE_ERR_INVALID_ARGUMENT, "pe_engine_create: null argument");
    if (!model->finalized) fail(PE_ERR_STATE, "pe_engine_create: the model is not finalized");
    auto e = std::make_unique<pe_engine>();
    pe::DFlashDraft* draft = nullptr;
    if (params->speculative_algorithm == PE_SPEC_DFLASH && params->speculative_draft) {
      const pe_draft* d = params->speculative_draft;
      if (d->target != model) fail(PE_ERR_INVALID_ARGUMENT, "pe_engine_create: the draft was made for another model");
      if (!d->finalized) fail(PE_ERR_STATE, "pe_engine_create: the draft is not finalized");
      draft = d->draft.get();
    }
    e->engine = std::make_unique<pe::Engine>(*model->model, *params, model->tp_leader.get(), draft);
    *out_engine = e.release();
  });
}

void pe_engine_free(pe_engine* engine) { delete engine; }

int32_t pe_engine_add_request(pe_engine* engine, const int32_t* tokens, int64_t n_tokens,
                              const pe_sampling_params* sampling, uint64_t* out_request_id) {
  return pe::api::guarded([&] {
    if (!engine || !sampling || !out_request_id) fail(PE_ERR_INVALID_ARGUMENT, "pe_engine_add_request: null argument");
    *out_request_id = engine->engine->add_request(tokens, n_tokens, *sampling);
  });
}

int32_t pe_engine_add_requests(pe_engine* engine, int32_t n_requests, const int32_t* const* tokens,
                               const int64_t* n_tokens, const pe_sampling_params* sampling,
                               uint64_t* out_request_ids) {
  return pe::api::guarded([&] {
    if (!engine || !tokens || !n_tokens || !sampling || !out_request_ids)
      fail(PE_ERR_INVALID_ARGUMENT, "pe_engine_add_requests: null argument");
    engine->engine->add_requests(n_requests, tokens, n_tokens, sampling, out_request_ids);
  });
}

int32_t pe_engine_cancel(pe_engine* engine, uint64_t request_id) {
  return pe::api::guarded([&] {
    if (!engine) fail(PE_ERR_INVALID_ARGUMENT, "pe_engine_cancel: null engine");
    engine->engine->cancel(request_id);
  });
}

int32_t pe_engine_set_token_mask(pe_engine* engine, uint64_t request_id, int64_t token_index,
                                 const uint32_t* mask, int32_t n_words) {
  return pe::api::guarded([&] {
    if (!engine) fail(PE_ERR_INVALID_ARGUMENT, "pe_engine_set_token_mask: null engine");
    engine->engine->set_token_mask(request_id, token_index, mask, n_words);
  });
}

int32_t pe_engine_poll(pe_engine* engine, pe_event* out, int32_t max_events, int32_t timeout_ms, int32_t* n_out) {
  return pe::api::guarded([&] {
    if (!engine || !out || !n_out || max_events < 1) fail(PE_ERR_INVALID_ARGUMENT, "pe_engine_poll: bad argument");
    *n_out = engine->engine->poll(out, max_events, timeout_ms);
  });
}

int32_t pe_engine_get_stats(pe_engine* engine, pe_engine_stats* out) {
  return pe::api::guarded([&] {
    if (!engine || !out) fail(PE_ERR_INVALID_ARGUMENT, "pe_engine_get_stats: null argument");
    *out = engine->engine->stats();
  });
}

int32_t pe_engine_get_plan(pe_engine* engine, pe_memory_plan* out) {
  return pe::api::guarded([&] {
    if (!engine || !out) fail(PE_ERR_INVALID_ARGUMENT, "pe_engine_get_plan: null argument");
    *out = engine->engine->plan();
  });
}

}
