// Qwen35Model: weight placement (which checkpoint matrices form which projection runs), workspace
// sizing and the hand-over to the backend of sampling. The forward is qwen35_forward.cpp.
#include "model/qwen35.h"

#include <algorithm>

#include "core/error.h"

namespace pe {

Qwen35Model::Qwen35Model(const ModelConfig& cfg, Device device)
    : Model(cfg), be_(device == Device::CUDA ? make_cuda_backend() : make_cpu_backend()) {}
Qwen35Model::~Qwen35Model() = default;

Projection Qwen35Model::projection(const std::vector<std::string>& names, const RunSource& run) const {
  return make_projection(*be_, weights_, names, run);
}

Qwen35Model::Layer Qwen35Model::layer(const std::string& p, bool full, const RunSource& run,
                                      const VectorSource& vec) const {
  Layer L;
  L.full = full;
  L.input_norm = vec(p + "input_layernorm.weight");
  L.post_norm = vec(p + "post_attention_layernorm.weight");
  L.gate_up = projection({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, run);
  L.down = projection({p + "mlp.down_proj.weight"}, run);
  if (full) {
    const std::string a = p + "self_attn.";
    L.in = projection({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, run);
    L.out = projection({a + "o_proj.weight"}, run);
    L.q_norm = vec(a + "q_norm.weight");
    L.k_norm = vec(a + "k_norm.weight");
  } else {
    const std::string g = p + "linear_attn.";
    L.in = projection({g + "in_proj_qkv.weight", g + "in_proj_z.weight", g + "in_proj_a.weight",
                       g + "in_proj_b.weight"},
                      run);
    L.out = projection({g + "out_proj.weight"}, run);
    L.conv = vec(g + "conv1d.weight");
    L.dt_bias = vec(g + "dt_bias");
    L.A_log = vec(g + "A_log");
    L.norm = vec(g + "norm.weight");
  }
  return L;
}

void Qwen35Model::place_weights(const RunSource& run, const VectorSource& vec) {
  layers_.clear();
  for (int64_t i = 0; i < cfg_.n_layers; ++i)
    layers_.push_back(layer("layers." + std::to_string(i) + ".", cfg_.is_full_attention[i], run, vec));
  final_norm_ = vec("norm.weight");
  mtp_.reset();
  if (weights_.has_mtp()) {
    mtp_ = std::make_unique<Mtp>();
    mtp_->layer = layer("mtp.layers.0.", true, run, vec);
    mtp_->fc = projection({"mtp.fc.weight"}, run);
    mtp_->norm_embedding = vec("mtp.pre_fc_norm_embedding.weight");
    mtp_->norm_hidden = vec("mtp.pre_fc_norm_hidden.weight");
    mtp_->norm = vec("mtp.norm.weight");
  }
}

// The FP8 layer matrices' bytes (in their final format; the runs' join padding left out), for the
// backend's choice of prefill copies.
void Qwen35Model::plan_prefill_copies() {
  int64_t bytes = 0;
  for (const auto& [name, t] : weights_.tensors())
    if (t.kind == TensorKind::Matrix && t.dtype == DType::FP8_E4M3 && WeightStore::used(name, t) &&
        name != "embed_tokens.weight" && name != "lm_head.weight")
      bytes += t.shape[0] * t.shape[1];
  be_->plan_prefill_copies(prefill_weight_copy_, bytes);
}

void Qwen35Model::finalize() {
  weights_.finalize();
  if (weight_quant_ != DType::F32) weights_.quantize(weight_quant_);  // per tensor, on the host
  plan_prefill_copies();
  place_weights([&](const std::vector<RunPart>& parts) { return be_->place(weights_, parts, true); },
                [&](const std::string& name) { return be_->place_vector(weights_, name); });
  embed_ = be_->place(weights_, {{"embed_tokens.weight"}}, false);
  if (!cfg_.tied_embeddings) lm_head_ = be_->place(weights_, {{"lm_head.weight"}}, false);
  if (device() != Device::CPU) weights_.drop_host_matrices();  // the backend's copies are the weights now
  be_->sync();
  ready_ = true;
}

void Qwen35Model::load_dummy(DType matrix_dtype, uint64_t seed) {
  if (!be_->dummy_on_device()) return Model::load_dummy(matrix_dtype, seed);
  if (matrix_dtype != DType::F32 && matrix_dtype != DType::F16 && matrix_dtype != DType::BF16 &&
      matrix_dtype != DType::FP8_E4M3)
    fail(PE_ERR_INVALID_ARGUMENT, "dummy weights: matrix dtype ", dtype_name(matrix_dtype), " is not supported");
  if (weight_quant_ != DType::F32)
    fail(PE_ERR_UNSUPPORTED, "weight_quant with dummy weights on ", device() == Device::CUDA ? "cuda" : "this device",
         ": generate the dummy weights in the target format (fp8) instead");
  // Embeddings and lm_head stay 16-bit, as in the FP8 checkpoints.
  const DType big = matrix_dtype == DType::FP8_E4M3 ? DType::BF16 : matrix_dtype;
  for (const auto& [name, t] : weights_.tensors())
    if (WeightStore::used(name, t))
      weights_.mark_present(name, t.kind == TensorKind::Vector ? DType::F32
                                  : (name == "embed_tokens.weight" || name == "lm_head.weight") ? big
                                                                                                : matrix_dtype);
  plan_prefill_copies();
  place_weights([&](const std::vector<RunPart>& parts) { return be_->place_dummy(weights_, parts, matrix_dtype, seed); },
                [&](const std::string& name) { return be_->place_dummy_vector(weights_, name, seed); });
  embed_ = be_->place_dummy(weights_, {{"embed_tokens.weight"}}, big, seed);
  if (!cfg_.tied_embeddings) lm_head_ = be_->place_dummy(weights_, {{"lm_head.weight"}}, big, seed);
  be_->sync();
  ready_ = true;
}

// Floats of activation workspace for T tokens: x, h, mix, then the largest of the mixers, the MLP
// and the MTP head's [T, 2H] input.
int64_t Qwen35Model::act_floats(int64_t T) const {
  const ModelConfig& c = cfg_;
  int64_t in_w = 0, swiglu = 0;
  auto size = [&](const Layer& L) {
    in_w = std::max(in_w, L.in.width);
    swiglu = std::max(swiglu, Backend::project_swiglu_scratch(T, L.gate_up, c.intermediate));
  };
  for (const Layer& L : layers_) size(L);
  if (mtp_) size(mtp_->layer);
  const int64_t gdn = aligned_floats(T * in_w) + aligned_floats(T * c.conv_dim()) +
                      aligned_floats(T * c.gdn_v_heads * c.gdn_v_dim) + 4 * aligned_floats(T * c.gdn_v_heads);
  const int64_t att = aligned_floats(T * in_w) + 3 * aligned_floats(T * c.n_heads * c.head_dim) +
                      2 * aligned_floats(T * c.n_kv_heads * c.head_dim);
  const int64_t mlp = aligned_floats(T * c.intermediate) + swiglu;
  const int64_t mtp = mtp_ ? aligned_floats(T * 2 * c.hidden) : 0;
  return 3 * aligned_floats(T * c.hidden) + std::max({gdn, att, mlp, mtp});
}

void Qwen35Model::ensure_workspace(int64_t tokens, int64_t rows, int64_t ints, size_t attn_scratch) {
  if (tokens > cap_tokens_) {
    act_ = Buffer(device(), static_cast<size_t>(act_floats(tokens)) * sizeof(float));
    cap_tokens_ = tokens;
  }
  be_->reserve(cfg_, tokens, rows, ints, attn_scratch);
}

// The vocab-parallel lm_head's space for n rows: this rank's part and every rank's (project_logits).
void Qwen35Model::ensure_tp_logits(int64_t n) {
  const size_t floats = static_cast<size_t>(n * cfg_.vocab_padded * (1 + tp_data_->size()));
  if (tp_logits_.size() < floats * sizeof(float)) tp_logits_ = Buffer(device(), floats * sizeof(float));
}

void Qwen35Model::reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) {
  if (device() == Device::CPU) return;  // host workspace grows with the steps
  std::lock_guard<std::mutex> lock(mu_);
  // Attention scratch: the largest over chunk sizes at the deepest position (small chunks split
  // the keys the most; long prefill chunks need none).
  size_t scratch = 0;
  for (int64_t n : {int64_t(1), int64_t(2), int64_t(4), int64_t(8), int64_t(16), int64_t(17), int64_t(32), int64_t(64),
                    int64_t(128), int64_t(256), int64_t(512), max_tokens})
    if (n <= max_tokens)
      scratch = std::max(scratch, be_->attention_scratch_bytes(n, std::max<int64_t>(0, max_context - n), cfg_));
  // prepare_step's ints: tokens, positions, cache rows and fed-token sources per token; pages
  // (page size >= 1) and the GDN slot per sequence.
  ensure_workspace(max_tokens, max_seqs, 4 * max_tokens + max_seqs * (max_context + 2), scratch);
}

void Qwen35Model::sample_launch(const ForwardResult& res, const std::vector<SampleJob>& jobs) {
  std::lock_guard<std::mutex> lock(mu_);
  be_->sample_launch(res, jobs, cfg_.vocab);
}

void Qwen35Model::sample_collect(std::vector<SampleOut>& outs) {
  std::lock_guard<std::mutex> lock(mu_);
  be_->sample_collect(outs);
}

}  // namespace pe
