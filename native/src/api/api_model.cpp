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

namespace {

// A TP rank's part of a whole checkpoint tensor (FP8 scales: the blocks of their weight's part).
void set_shard_tensor(pe_model& m, const std::string& name, pe::DType dtype, const std::vector<int64_t>& shape,
                      const void* data) {
  static const std::string kScale = "_scale_inv";
  const bool scale = name.size() > kScale.size() && name.compare(name.size() - kScale.size(), kScale.size(), kScale) == 0;
  const std::string base = scale ? name.substr(0, name.size() - kScale.size()) : name;
  if (!m.full_shapes->tensors().count(base)) fail(PE_ERR_NOT_FOUND, "tensor ", name, ": not a tensor of this model");
  const std::vector<int64_t>& full = m.full_shapes->tensors().at(base).shape;
  if (!scale && shape != full) {
    m.model->weights().set(name, dtype, shape, data);  // the whole-shape check names the mismatch
    return;
  }
  pe::ShardRanges r = m.shard->ranges(base);
  if (scale && r.dim >= 0) r = pe::block_ranges(r, full[r.dim], 128, base);
  std::vector<int64_t> part_shape;
  const size_t elem = pe::dtype_bytes_for(dtype, 1);
  std::vector<uint8_t> part = pe::take_shard(r, shape, elem, data, &part_shape);
  m.model->weights().set(name, dtype, part_shape, part.data());
}

}  // namespace

extern "C" {

namespace {

std::unique_ptr<pe::Model> make_model(const pe::ModelConfig& mc, const std::string& dev) {
  if (dev == "cuda") {
#ifdef PE_WITH_CUDA
    if (!pe::device_usable(pe::Device::CUDA))
      fail(PE_ERR_UNSUPPORTED, "device 'cuda': no usable CUDA device found (build: ", pe_build_info(), ")");
    return std::make_unique<pe::Qwen35Model>(mc, pe::Device::CUDA);
#else
    fail(PE_ERR_UNSUPPORTED, "device 'cuda': this build has no CUDA backend (build: ", pe_build_info(),
         "); reinstall with PYENGINE_CUDA=ON pip install . or use device='cpu'");
#endif
  }
  return std::make_unique<pe::Qwen35Model>(mc);
}

}  // namespace

int32_t pe_model_create(const pe_model_config* cfg, const char* device, pe_model** out_model) {
  return pe::api::guarded([&] {
    if (!cfg || !out_model) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_create: null argument");
    std::string dev = device ? device : "cpu";
    if (dev != "cpu" && dev != "cuda") fail(PE_ERR_UNSUPPORTED, "unknown device '", dev, "' (use 'cpu' or 'cuda')");
    auto m = std::make_unique<pe_model>();
    m->full_config = pe::ModelConfig::from_c(*cfg);
    m->device = dev;
    m->model = make_model(m->full_config, dev);
    *out_model = m.release();
  });
}

int32_t pe_model_set_tp(pe_model* model, pe_comm* data, pe_comm* control) {
  return pe::api::guarded([&] {
    if (!model || !data || !control) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_set_tp: null argument");
    if (model->finalized || model->shard) fail(PE_ERR_STATE, "pe_model_set_tp: call it once, before any tensor");
    pe::Communicator& d = *data->comm;
    pe::Communicator& c = *control->comm;
    if (d.size() != c.size() || d.rank() != c.rank())
      fail(PE_ERR_INVALID_ARGUMENT, "pe_model_set_tp: data (rank ", d.rank(), " of ", d.size(), ") and control (rank ",
           c.rank(), " of ", c.size(), ") communicators differ");
    if (c.device() != pe::Device::CPU) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_set_tp: control must be a CPU communicator");
    const pe::Device dev = model->device == "cuda" ? pe::Device::CUDA : pe::Device::CPU;
    if (d.device() != dev)
      fail(PE_ERR_INVALID_ARGUMENT, "pe_model_set_tp: a ", model->device, " model needs a ",
           model->device == "cuda" ? "NCCL" : "CPU", " data communicator");
    auto shard = std::make_unique<pe::TpShard>(pe::make_tp_shard(model->full_config, d.rank(), d.size()));
    model->full_shapes = std::make_unique<pe::WeightStore>(model->full_config);
    model->model = make_model(shard->local, model->device);
    model->model->set_tp(&d, &c);
    model->shard = std::move(shard);
    if (c.rank() == 0) model->tp_leader = std::make_unique<pe::TpLeader>(c);
  });
}

int32_t pe_model_serve_tp_worker(pe_model* model) {
  return pe::api::guarded([&] {
    if (!model) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_serve_tp_worker: null model");
    if (!model->finalized) fail(PE_ERR_STATE, "pe_model_serve_tp_worker: the model is not finalized");
    if (!model->shard || model->shard->rank == 0)
      fail(PE_ERR_STATE, "pe_model_serve_tp_worker: only a worker rank (rank > 0 after pe_model_set_tp) serves");
    pe::tp_worker_run(*model->model, *model->model->tp_control());
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
    if (model->shard) return set_shard_tensor(*model, name, static_cast<pe::DType>(dtype), dims, data);
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

int32_t pe_model_set_weight_quant(pe_model* model, int32_t dtype) {
  return pe::api::guarded([&] {
    if (!model) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_set_weight_quant: null model");
    if (model->finalized) fail(PE_ERR_STATE, "weight_quant must be set before the model is finalized");
    if (!pe::dtype_valid(dtype)) fail(PE_ERR_INVALID_ARGUMENT, "weight_quant: unknown dtype code ", dtype);
    model->model->set_weight_quant(static_cast<pe::DType>(dtype));
  });
}

int32_t pe_model_set_prefill_weight_copy(pe_model* model, int32_t mode) {
  return pe::api::guarded([&] {
    if (!model) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_set_prefill_weight_copy: null model");
    if (model->finalized) fail(PE_ERR_STATE, "prefill_weight_copy must be set before the model is finalized");
    model->model->set_prefill_weight_copy(mode);
  });
}

int32_t pe_model_load_dummy(pe_model* model, int32_t matrix_dtype, uint64_t seed) {
  return pe::api::guarded([&] {
    if (!model) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_load_dummy: null model");
    if (model->finalized) fail(PE_ERR_STATE, "the model is already finalized");
    if (!pe::dtype_valid(matrix_dtype)) fail(PE_ERR_INVALID_ARGUMENT, "dummy weights: unknown dtype code ", matrix_dtype);
    model->model->load_dummy(static_cast<pe::DType>(matrix_dtype), seed);
    model->finalized = true;
  });
}

int32_t pe_model_weight_bytes(pe_model* model, int64_t* out_bytes) {
  return pe::api::guarded([&] {
    if (!model || !out_bytes) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_weight_bytes: null argument");
    *out_bytes = model->model->weight_bytes();
  });
}

int32_t pe_model_prefill_copy_bytes(pe_model* model, int64_t* out_bytes) {
  return pe::api::guarded([&] {
    if (!model || !out_bytes) fail(PE_ERR_INVALID_ARGUMENT, "pe_model_prefill_copy_bytes: null argument");
    *out_bytes = model->model->prefill_copy_bytes();
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
  const pe::Device dev = model->model->device();
  pe::KvPool kv(cfg, n_pages, page, kv_dtype, dev);
  pe::GdnPool gdn(cfg, 1, 0, dev);
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
  if (model->tp_leader) {
    pe::TpPoolShape shape;
    shape.kv_pages = n_pages;
    shape.kv_page_size = page;
    shape.kv_dtype = static_cast<int32_t>(kv_dtype);
    shape.gdn_running = 1;
    model->tp_leader->forward_scratch(*model->model, b, shape, kv, gdn, res);
    return;
  }
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
    pe::TpPoolShape shape;  // the MTP layer's own KV
    shape.kv_pages = (n + 63) / 64;
    shape.kv_page_size = 64;
    shape.kv_dtype = static_cast<int32_t>(pe::DType::F32);
    pe::KvPool mtp_kv(model->model->config().mtp_kv_config(), shape.kv_pages, shape.kv_page_size, pe::DType::F32,
                      model->model->device());
    std::vector<float> logits;
    if (model->tp_leader)
      model->tp_leader->mtp_forward(*model->model, std::vector<int32_t>(tokens, tokens + n), res.hidden, shape, mtp_kv,
                                    logits);
    else
      model->model->mtp_forward(tokens, n, res.hidden.data(), mtp_kv, logits);
    std::memcpy(out_logits, logits.data(), sizeof(float) * logits.size());
  });
}

int32_t pe_model_prompt_logits(pe_model* model, const int32_t* tokens, int64_t n, float* out_logits) {
  return pe_model_prompt_logits_kv(model, tokens, n, PE_DTYPE_F32, out_logits);
}

}
