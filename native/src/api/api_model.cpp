// extern "C" shims of the model half of pyengine.h.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/api_common.h"
#include "api/handles.h"
#include "model/qwen35.h"
#include "pyengine.h"

using pe::fail;

extern "C" {

int32_t pe_model_create(const pe_model_config* cfg, const char* device, pe_model** out_model) {
  return pe::api::guarded([&] {
    if (!cfg || !out_model) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_create: null argument");
    std::string dev = device ? device : "cpu";
    // The CUDA kernels are built and tested (kernels/cuda), but the model forward does not use
    // them yet: say so rather than silently running on the CPU.
    if (dev == "cuda")
      fail(PE_ERR_UNSUPPORTED, "device 'cuda': the CUDA model path is not implemented yet (build: ", pe_build_info(),
           "); use device='cpu'");
    if (dev != "cpu") fail(PE_ERR_UNSUPPORTED, "unknown device '", dev, "' (use 'cpu')");
    auto m = std::make_unique<pe_model>();
    m->model = std::make_unique<pe::Qwen35Model>(pe::ModelConfig::from_c(*cfg));
    *out_model = m.release();
  });
}

int32_t pe_model_set_tensor(pe_model* model, const char* name, int32_t dtype, int32_t ndim, const int64_t* shape,
                            const void* data) {
  return pe::api::guarded([&] {
    if (!model || !name || !data || (ndim > 0 && !shape)) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_set_tensor: null argument");
    if (model->finalized) fail(PE_ERR_STATE, "tensor ", name, ": the model is already finalized");
    if (!pe::dtype_valid(dtype)) fail(PE_ERR_INVALID_ARGUMENT, "tensor ", name, ": unknown dtype code ", dtype);
    if (ndim < 0 || ndim > 8) fail(PE_ERR_INVALID_ARGUMENT, "tensor ", name, ": bad rank ", ndim);
    std::vector<int64_t> dims(shape, shape + ndim);
    model->model->weights().set(name, static_cast<pe::DType>(dtype), dims, data);
  });
}

int32_t pe_model_finalize(pe_model* model) {
  return pe::api::guarded([&] {
    if (!model) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_finalize: null model");
    if (model->finalized) return;
    model->model->finalize();
    model->finalized = true;
  });
}

void pe_model_free(pe_model* model) { delete model; }

}  // extern "C"

namespace {

// Runs tokens[0..n) as one fresh sequence on private pools (KV of kv_dtype, one GDN slot).
void run_fresh_sequence(pe_model* model, const int32_t* tokens, int64_t n, pe::DType kv_dtype,
                        pe::LogitsMode logits, pe::ForwardResult& res) {
  if (!model || !tokens) fail(PE_ERR_INVALID_ARGUMENT, "null argument");
  if (!model->finalized) fail(PE_ERR_STATE, "the model is not finalized");
  if (n < 1) fail(PE_ERR_INVALID_ARGUMENT, "empty prompt");
  const pe::ModelConfig& cfg = model->model->config();
  const int64_t page = 64, n_pages = (n + page - 1) / page;
  pe::KvPool kv(cfg, n_pages, page, kv_dtype);
  pe::GdnPool gdn(cfg, 1, 0);
  std::vector<int32_t> table;
  for (int64_t i = 0; i < n_pages; ++i) table.push_back(kv.alloc());
  pe::Batch b;
  b.tokens.assign(tokens, tokens + n);
  pe::SeqChunk s;
  s.n_new = n;
  s.gdn_slot = gdn.alloc_running();
  s.page_table = table.data();
  s.logits = logits;
  b.seqs.push_back(s);
  model->model->forward(b, kv, gdn, res);
}

}  // namespace

extern "C" {

int32_t pe_model_prompt_logits_kv(pe_model* model, const int32_t* tokens, int64_t n, int32_t kv_cache_dtype,
                                  float* out_logits) {
  return pe::api::guarded([&] {
    if (!out_logits) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_prompt_logits: null output");
    if (!pe::dtype_valid(kv_cache_dtype)) fail(PE_ERR_INVALID_ARGUMENT, "unknown kv_cache_dtype code ", kv_cache_dtype);
    pe::ForwardResult res;
    run_fresh_sequence(model, tokens, n, static_cast<pe::DType>(kv_cache_dtype), pe::LogitsMode::All, res);
    std::memcpy(out_logits, res.logits.data(), sizeof(float) * res.logits.size());
  });
}

int32_t pe_model_mtp_logits(pe_model* model, const int32_t* tokens, int64_t n, float* out_logits) {
  return pe::api::guarded([&] {
    if (!out_logits) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_mtp_logits: null output");
    if (n < 2) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_mtp_logits: needs at least 2 tokens, got ", n);
    if (model && !model->model->has_mtp()) fail(PE_ERR_UNSUPPORTED, "this checkpoint has no MTP head (mtp.* tensors)");
    pe::ForwardResult res;
    run_fresh_sequence(model, tokens, n, pe::DType::F32, pe::LogitsMode::None, res);
    pe::ModelConfig mtp_cfg = model->model->config();  // the MTP layer's own KV: one attention layer
    mtp_cfg.n_layers = 1;
    mtp_cfg.is_full_attention = {true};
    pe::KvPool mtp_kv(mtp_cfg, (n + 63) / 64, 64);
    std::vector<float> logits;
    model->model->mtp_forward(tokens, n, res.hidden.data(), mtp_kv, logits);
    std::memcpy(out_logits, logits.data(), sizeof(float) * logits.size());
  });
}

int32_t pe_model_prompt_logits(pe_model* model, const int32_t* tokens, int64_t n, float* out_logits) {
  return pe_model_prompt_logits_kv(model, tokens, n, PE_DTYPE_F32, out_logits);
}

}
