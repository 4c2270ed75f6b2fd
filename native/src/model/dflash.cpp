// DFlashDraft: config validation, the weight table, weight placement and sampling. The forward is
// dflash_forward.cpp.
#include "model/dflash.h"

#include <string>

#include "core/error.h"

namespace pe {
namespace {

void require_positive(const char* field, int64_t v) {
  if (v <= 0) fail(PE_ERR_INVALID_ARGUMENT, "draft config: ", field, " must be > 0, got ", v);
}

}  // namespace

CacheShape DFlashConfig::cache_shape() const {
  CacheShape s;
  s.n_attn_layers = n_layers;
  s.n_kv_heads = n_kv_heads;
  s.head_dim = head_dim;
  return s;
}

DFlashConfig DFlashConfig::from_c(const pe_draft_config& c, const ModelConfig& target) {
  DFlashConfig d;
  d.hidden = c.hidden_size;
  d.n_layers = c.num_hidden_layers;
  d.n_heads = c.num_attention_heads;
  d.n_kv_heads = c.num_key_value_heads;
  d.head_dim = c.head_dim;
  d.intermediate = c.intermediate_size;
  d.vocab = c.vocab_size;
  d.eps = c.rms_norm_eps;
  d.rope_theta = c.rope_theta;
  d.block_size = c.block_size;
  d.mask_token = c.mask_token_id;
  require_positive("hidden_size", d.hidden);
  require_positive("num_hidden_layers", d.n_layers);
  require_positive("num_attention_heads", d.n_heads);
  require_positive("num_key_value_heads", d.n_kv_heads);
  require_positive("head_dim", d.head_dim);
  require_positive("intermediate_size", d.intermediate);
  require_positive("vocab_size", d.vocab);
  if (d.n_layers > 1024) fail(PE_ERR_INVALID_ARGUMENT, "draft config: num_hidden_layers too large: ", d.n_layers);
  if (d.n_heads % d.n_kv_heads)
    fail(PE_ERR_INVALID_ARGUMENT, "draft config: num_attention_heads (", d.n_heads,
         ") must be a multiple of num_key_value_heads (", d.n_kv_heads, ")");
  if (d.head_dim % 2) fail(PE_ERR_INVALID_ARGUMENT, "draft config: head_dim must be even (RoPE), got ", d.head_dim);
  if (!(d.eps > 0.0f)) fail(PE_ERR_INVALID_ARGUMENT, "draft config: rms_norm_eps must be > 0");
  if (!(d.rope_theta > 0.0f)) fail(PE_ERR_INVALID_ARGUMENT, "draft config: rope_theta must be > 0");
  if (d.block_size < 2 || d.block_size > 64)
    fail(PE_ERR_INVALID_ARGUMENT, "draft config: block_size must be in 2 .. 64, got ", d.block_size);
  // The draft embeds with the target's table and projects with its lm_head.
  if (d.hidden != target.hidden)
    fail(PE_ERR_INVALID_ARGUMENT, "draft config: hidden_size ", d.hidden, " differs from the target's ", target.hidden);
  if (d.vocab != target.vocab)
    fail(PE_ERR_INVALID_ARGUMENT, "draft config: vocab_size ", d.vocab, " differs from the target's ", target.vocab);
  if (d.mask_token < 0 || d.mask_token >= d.vocab)
    fail(PE_ERR_INVALID_ARGUMENT, "draft config: dflash_config.mask_token_id ", d.mask_token, " outside the vocabulary");
  if (c.n_target_layers <= 0 || !c.target_layer_ids)
    fail(PE_ERR_INVALID_ARGUMENT, "draft config: dflash_config.target_layer_ids is empty");
  for (int32_t i = 0; i < c.n_target_layers; ++i) {
    const int32_t l = c.target_layer_ids[i];
    if (l < 0 || l >= target.n_layers)
      fail(PE_ERR_INVALID_ARGUMENT, "draft config: dflash_config.target_layer_ids[", i, "] = ", l,
           " outside the target's layers 0 .. ", target.n_layers - 1);
    d.target_layers.push_back(l);
  }
  return d;
}

DFlashDraft::DFlashDraft(const DFlashConfig& cfg, const Qwen35Model& target)
    : cfg_(cfg), target_(target), be_(target.device() == Device::CUDA ? make_cuda_backend() : make_cpu_backend()) {
  if (target.tp_size() > 1)
    fail(PE_ERR_UNSUPPORTED, "a DFlash draft needs the whole lm_head: not at tensor_parallel_size > 1 yet");
  shape_cfg_.vocab = cfg.vocab;
  shape_cfg_.hidden = cfg.hidden;
  shape_cfg_.n_heads = cfg.block_size * cfg.n_heads;  // attention_blocks: one query of bs * Hq heads a block
  shape_cfg_.n_kv_heads = cfg.n_kv_heads;
  shape_cfg_.head_dim = cfg.head_dim;
  declare_tensors();
}

DFlashDraft::~DFlashDraft() = default;

// The public checkpoint format: no prefix, no embedding, no lm_head (MODEL_SPEC §6).
void DFlashDraft::declare_tensors() {
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, I = cfg_.intermediate;
  const int64_t q_rows = cfg_.n_heads * D, kv_rows = cfg_.n_kv_heads * D;
  weights_.expect("fc.weight", TensorKind::Matrix, {H, cfg_.n_features() * H});
  weights_.expect("hidden_norm.weight", TensorKind::Vector, {H});
  weights_.expect("norm.weight", TensorKind::Vector, {H});
  for (int64_t i = 0; i < cfg_.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    weights_.expect(p + "input_layernorm.weight", TensorKind::Vector, {H});
    weights_.expect(p + "post_attention_layernorm.weight", TensorKind::Vector, {H});
    weights_.expect(p + "self_attn.q_proj.weight", TensorKind::Matrix, {q_rows, H});
    weights_.expect(p + "self_attn.k_proj.weight", TensorKind::Matrix, {kv_rows, H});
    weights_.expect(p + "self_attn.v_proj.weight", TensorKind::Matrix, {kv_rows, H});
    weights_.expect(p + "self_attn.o_proj.weight", TensorKind::Matrix, {H, q_rows});
    weights_.expect(p + "self_attn.q_norm.weight", TensorKind::Vector, {D});
    weights_.expect(p + "self_attn.k_norm.weight", TensorKind::Vector, {D});
    weights_.expect(p + "mlp.gate_proj.weight", TensorKind::Matrix, {I, H});
    weights_.expect(p + "mlp.up_proj.weight", TensorKind::Matrix, {I, H});
    weights_.expect(p + "mlp.down_proj.weight", TensorKind::Matrix, {H, I});
  }
}

void DFlashDraft::set_weight_quant(DType target) {
  if (ready_) fail(PE_ERR_STATE, "draft_quant must be set before the draft is finalized");
  if (target != DType::F32 && target != DType::I8 && target != DType::FP8_E4M3 && target != DType::NVFP4)
    fail(PE_ERR_INVALID_ARGUMENT, "draft_quant: ", dtype_name(target), " is not a weight quantization (int8, fp8, nvfp4)");
  weight_quant_ = target;
}

void DFlashDraft::finalize() {
  if (ready_) return;
  weights_.finalize();
  if (weight_quant_ != DType::F32) weights_.quantize(weight_quant_);
  auto run = [&](const std::vector<RunPart>& parts) { return be_->place(weights_, parts, true); };
  auto proj = [&](const std::vector<std::string>& names) { return make_projection(*be_, weights_, names, run); };
  auto vec = [&](const std::string& name) { return be_->place_vector(weights_, name); };
  fc_ = proj({"fc.weight"});
  hidden_norm_ = vec("hidden_norm.weight");
  final_norm_ = vec("norm.weight");
  layers_.clear();
  for (int64_t i = 0; i < cfg_.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".", a = p + "self_attn.", m = p + "mlp.";
    Layer L;
    L.input_norm = vec(p + "input_layernorm.weight");
    L.post_norm = vec(p + "post_attention_layernorm.weight");
    L.q_norm = vec(a + "q_norm.weight");
    L.k_norm = vec(a + "k_norm.weight");
    L.q = proj({a + "q_proj.weight"});
    L.kv = proj({a + "k_proj.weight", a + "v_proj.weight"});
    L.o = proj({a + "o_proj.weight"});
    L.gate_up = proj({m + "gate_proj.weight", m + "up_proj.weight"});
    L.down = proj({m + "down_proj.weight"});
    layers_.push_back(std::move(L));
  }
  if (device() != Device::CPU) weights_.drop_host_matrices();  // the backend's copies are the weights now
  be_->sync();
  ready_ = true;
}

void DFlashDraft::sample_launch(const ForwardResult& res, const std::vector<SampleJob>& jobs) {
  std::lock_guard<std::mutex> lock(mu_);
  be_->sample_launch(res, jobs, cfg_.vocab);
}

void DFlashDraft::sample_collect(std::vector<SampleOut>& outs) {
  std::lock_guard<std::mutex> lock(mu_);
  be_->sample_collect(outs);
}

}  // namespace pe
