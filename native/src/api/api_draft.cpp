// extern "C" shims of the DFlash draft (pyengine.h): create, tensors, quantization, and the
// one-sequence entry points the tests and tools use (target layer features, block logits).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/api_common.h"
#include "api/handles.h"
#include "model/dflash.h"
#include "model/qwen35.h"
#include "pyengine.h"

using pe::fail;

namespace {

const pe::Qwen35Model& qwen35(pe_model* model, const char* what) {
  if (!model) fail(PE_ERR_INVALID_ARGUMENT, what, ": null model");
  if (!model->finalized) fail(PE_ERR_STATE, what, ": the model is not finalized");
  if (model->shard && model->shard->size > 1)
    fail(PE_ERR_UNSUPPORTED, what, ": not at tensor_parallel_size > 1 yet");
  const auto* m = dynamic_cast<const pe::Qwen35Model*>(model->model.get());
  if (!m) fail(PE_ERR_UNSUPPORTED, what, ": the model is not a Qwen3.5 model");
  return *m;
}

// The target's layer outputs for tokens[0..n) as one fresh sequence, on the host.
std::vector<float> target_features(pe_model* model, const int32_t* tokens, int64_t n, const std::vector<int32_t>& layers) {
  const pe::ModelConfig& cfg = model->model->config();
  const int64_t page = 64, n_pages = (n + page - 1) / page;
  const pe::Device dev = model->model->device();
  pe::KvPool kv(cfg, n_pages, page, pe::DType::F32, dev);
  pe::GdnPool gdn(cfg, 1, 0, dev);
  std::vector<int32_t> table;
  for (int64_t i = 0; i < n_pages; ++i) table.push_back(kv.alloc());
  pe::Batch b;
  b.tokens.assign(tokens, tokens + n);
  b.keep_hidden = layers;
  b.keep_for_host = true;
  pe::SeqChunk s;
  s.n_new = n;
  s.gdn_slot = gdn.alloc_running();
  s.page_table = table.data();
  s.logits = pe::LogitsMode::None;
  b.seqs.push_back(s);
  pe::ForwardResult res;
  model->model->forward(b, kv, gdn, res);
  // Kept layer-major [n_layers, n, H] -> token-major [n, n_layers * H] (the context features).
  const int64_t H = cfg.hidden, L = static_cast<int64_t>(layers.size());
  std::vector<float> out(static_cast<size_t>(n * L * H));
  for (int64_t j = 0; j < L; ++j)
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(out.data() + (t * L + j) * H, res.kept.data() + (j * n + t) * H, sizeof(float) * H);
  return out;
}

void check_tokens(const int32_t* tokens, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab) fail(PE_ERR_INVALID_ARGUMENT, "token id ", tokens[i], " outside the vocabulary");
}

}  // namespace

extern "C" {

int32_t pe_model_layer_features(pe_model* model, const int32_t* tokens, int64_t n, const int32_t* layer_ids,
                                int32_t n_layer_ids, float* out_features) {
  return pe::api::guarded([&] {
    qwen35(model, "pe_model_layer_features");
    if (!tokens || !layer_ids || !out_features) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_layer_features: null argument");
    if (n < 1) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_layer_features: empty prompt");
    if (n_layer_ids < 1) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_layer_features: no layer ids");
    check_tokens(tokens, n, model->model->config().vocab);
    const std::vector<float> f = target_features(model, tokens, n, std::vector<int32_t>(layer_ids, layer_ids + n_layer_ids));
    std::memcpy(out_features, f.data(), sizeof(float) * f.size());
  });
}

int32_t pe_draft_create(pe_model* target, const pe_draft_config* cfg, pe_draft** out_draft) {
  return pe::api::guarded([&] {
    if (!cfg || !out_draft) fail(PE_ERR_INVALID_ARGUMENT, "pe_draft_create: null argument");
    const pe::Qwen35Model& m = qwen35(target, "pe_draft_create");
    auto d = std::make_unique<pe_draft>();
    d->draft = std::make_unique<pe::DFlashDraft>(pe::DFlashConfig::from_c(*cfg, m.config()), m);
    d->target = target;
    *out_draft = d.release();
  });
}

int32_t pe_draft_set_tensor(pe_draft* draft, const char* name, int32_t dtype, int32_t ndim, const int64_t* shape,
                            const void* data) {
  return pe::api::guarded([&] {
    if (!draft || !name || !data || (ndim > 0 && !shape)) fail(PE_ERR_INVALID_ARGUMENT, "pe_draft_set_tensor: null argument");
    if (draft->finalized) fail(PE_ERR_STATE, "tensor ", name, ": the draft is already finalized");
    if (!pe::dtype_valid(dtype)) fail(PE_ERR_INVALID_ARGUMENT, "tensor ", name, ": unknown dtype code ", dtype);
    if (ndim < 0 || ndim > 8) fail(PE_ERR_INVALID_ARGUMENT, "tensor ", name, ": bad rank ", ndim);
    draft->draft->weights().set(name, static_cast<pe::DType>(dtype), std::vector<int64_t>(shape, shape + ndim), data);
  });
}

int32_t pe_draft_set_weight_quant(pe_draft* draft, int32_t dtype) {
  return pe::api::guarded([&] {
    if (!draft) fail(PE_ERR_INVALID_ARGUMENT, "pe_draft_set_weight_quant: null draft");
    if (!pe::dtype_valid(dtype)) fail(PE_ERR_INVALID_ARGUMENT, "draft_quant: unknown dtype code ", dtype);
    draft->draft->set_weight_quant(static_cast<pe::DType>(dtype));
  });
}

int32_t pe_draft_finalize(pe_draft* draft) {
  return pe::api::guarded([&] {
    if (!draft) fail(PE_ERR_INVALID_ARGUMENT, "pe_draft_finalize: null draft");
    draft->draft->finalize();
    draft->finalized = true;
  });
}

int32_t pe_draft_weight_bytes(pe_draft* draft, int64_t* out_bytes) {
  return pe::api::guarded([&] {
    if (!draft || !out_bytes) fail(PE_ERR_INVALID_ARGUMENT, "pe_draft_weight_bytes: null argument");
    *out_bytes = draft->draft->weight_bytes();
  });
}

void pe_draft_free(pe_draft* draft) { delete draft; }

int32_t pe_draft_block_logits(pe_draft* draft, const int32_t* tokens, int64_t n, const float* features,
                              const int64_t* context_ends, int32_t n_blocks, int32_t kv_cache_dtype, float* out_logits) {
  return pe::api::guarded([&] {
    if (!draft || !tokens || !context_ends || !out_logits) fail(PE_ERR_INVALID_ARGUMENT, "pe_draft_block_logits: null argument");
    if (!draft->finalized) fail(PE_ERR_STATE, "pe_draft_block_logits: the draft is not finalized");
    if (!pe::dtype_valid(kv_cache_dtype)) fail(PE_ERR_INVALID_ARGUMENT, "unknown kv_cache_dtype code ", kv_cache_dtype);
    if (n_blocks < 1) fail(PE_ERR_INVALID_ARGUMENT, "pe_draft_block_logits: n_blocks must be >= 1");
    pe::DFlashDraft& d = *draft->draft;
    const pe::DFlashConfig& c = d.config();
    check_tokens(tokens, n, c.vocab);
    for (int32_t b = 0; b < n_blocks; ++b)
      if (context_ends[b] < (b ? context_ends[b - 1] : 0) || context_ends[b] >= n)
        fail(PE_ERR_INVALID_ARGUMENT, "context_ends[", b, "] = ", context_ends[b], ": must be non-decreasing and < ", n);
    const int64_t S = context_ends[n_blocks - 1], FW = c.n_features() * c.hidden;
    std::vector<float> computed;
    if (!features && S > 0) {
      computed = target_features(draft->target, tokens, S, c.target_layers);
      features = computed.data();
    }
    // The features on the draft's device, the draft's KV in pages of 16 (blocks cross pages).
    const pe::Device dev = d.device();
    pe::Buffer feat(dev, sizeof(float) * std::max<int64_t>(S * FW, 1));
    if (S > 0) pe::mem_upload(dev, feat.data(), features, sizeof(float) * S * FW);
    const int64_t page = 16, n_pages = (S + c.block_size + page - 1) / page;
    pe::KvPool kv(c.cache_shape(), n_pages, page, static_cast<pe::DType>(kv_cache_dtype), dev);
    std::vector<int32_t> table;
    for (int64_t i = 0; i < n_pages; ++i) table.push_back(kv.alloc());
    const int64_t rows = (c.block_size - 1) * c.vocab;
    int64_t done = 0;
    for (int32_t b = 0; b < n_blocks; ++b) {
      pe::DraftSeq s;
      s.n_context = done;
      s.n_new = context_ends[b] - done;
      s.features = feat.as<float>() + done * FW;
      s.layer_stride = c.hidden;
      s.row_stride = FW;
      s.last_token = tokens[context_ends[b]];
      s.page_table = table.data();
      pe::ForwardResult res;
      d.forward({s}, kv, true, res);
      std::memcpy(out_logits + b * rows, res.logits.data(), sizeof(float) * rows);
      done = context_ends[b];
    }
  });
}

}  // extern "C"
