#include "model/weights.h"

#include <cstring>
#include <sstream>

#include "core/error.h"

namespace pe {

static std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void WeightStore::expect(const std::string& name, TensorKind kind, std::vector<int64_t> shape,
                         bool required) {
  Tensor t;
  t.kind = kind;
  t.required = required;
  t.shape = std::move(shape);
  tensors_[name] = std::move(t);
}

void WeightStore::expect_layer(const std::string& p, bool full, bool required) {
  const ModelConfig& c = *cfg_;
  const int64_t H = c.hidden;
  expect(p + "input_layernorm.weight", TensorKind::Vector, {H}, required);
  expect(p + "post_attention_layernorm.weight", TensorKind::Vector, {H}, required);
  expect(p + "mlp.gate_proj.weight", TensorKind::Matrix, {c.intermediate, H}, required);
  expect(p + "mlp.up_proj.weight", TensorKind::Matrix, {c.intermediate, H}, required);
  expect(p + "mlp.down_proj.weight", TensorKind::Matrix, {H, c.intermediate}, required);
  if (full) {
    const std::string a = p + "self_attn.";
    expect(a + "q_proj.weight", TensorKind::Matrix, {2 * c.n_heads * c.head_dim, H}, required);
    expect(a + "k_proj.weight", TensorKind::Matrix, {c.n_kv_heads * c.head_dim, H}, required);
    expect(a + "v_proj.weight", TensorKind::Matrix, {c.n_kv_heads * c.head_dim, H}, required);
    expect(a + "o_proj.weight", TensorKind::Matrix, {H, c.n_heads * c.head_dim}, required);
    expect(a + "q_norm.weight", TensorKind::Vector, {c.head_dim}, required);
    expect(a + "k_norm.weight", TensorKind::Vector, {c.head_dim}, required);
  } else {
    const std::string g = p + "linear_attn.";
    const int64_t Hv = c.gdn_v_heads;
    expect(g + "in_proj_qkv.weight", TensorKind::Matrix, {c.conv_dim(), H}, required);
    expect(g + "in_proj_z.weight", TensorKind::Matrix, {Hv * c.gdn_v_dim, H}, required);
    expect(g + "in_proj_b.weight", TensorKind::Matrix, {Hv, H}, required);
    expect(g + "in_proj_a.weight", TensorKind::Matrix, {Hv, H}, required);
    expect(g + "conv1d.weight", TensorKind::Vector, {c.conv_dim(), 1, c.conv_kernel}, required);
    expect(g + "dt_bias", TensorKind::Vector, {Hv}, required);
    expect(g + "A_log", TensorKind::Vector, {Hv}, required);
    expect(g + "norm.weight", TensorKind::Vector, {c.gdn_v_dim}, required);
    expect(g + "out_proj.weight", TensorKind::Matrix, {H, Hv * c.gdn_v_dim}, required);
  }
}

WeightStore::WeightStore(const ModelConfig& c) : cfg_(&c) {
  expect("embed_tokens.weight", TensorKind::Matrix, {c.vocab, c.hidden});
  expect("norm.weight", TensorKind::Vector, {c.hidden});
  // A tied checkpoint may still carry lm_head; it is then accepted and ignored.
  expect("lm_head.weight", TensorKind::Matrix, {c.lm_head_rows(), c.hidden}, !c.tied_embeddings);
  for (int64_t i = 0; i < c.n_layers; ++i)
    expect_layer("layers." + std::to_string(i) + ".", c.is_full_attention[i], true);
  // The MTP head is optional: a checkpoint without mtp.* still serves without speculation.
  for (int64_t i = 0; i < c.mtp_layers; ++i)
    expect_layer("mtp.layers." + std::to_string(i) + ".", true, false);
  if (c.mtp_layers > 0) {
    expect("mtp.fc.weight", TensorKind::Matrix, {c.hidden, 2 * c.hidden}, false);
    expect("mtp.pre_fc_norm_embedding.weight", TensorKind::Vector, {c.hidden}, false);
    expect("mtp.pre_fc_norm_hidden.weight", TensorKind::Vector, {c.hidden}, false);
    expect("mtp.norm.weight", TensorKind::Vector, {c.hidden}, false);
  }
}

static bool is_float_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

void WeightStore::set(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                      const void* data) {
  static const std::string kScale = "_scale_inv";
  if (name.size() > kScale.size() && name.compare(name.size() - kScale.size(), kScale.size(), kScale) == 0) {
    std::string base = name.substr(0, name.size() - kScale.size());
    auto it = tensors_.find(base);
    if (it == tensors_.end() || it->second.kind != TensorKind::Matrix)
      fail(PE_ERR_NOT_FOUND, "tensor ", name, ": no linear weight ", base, " to scale");
    Tensor& w = it->second;
    std::vector<int64_t> want = {ceil_div(w.shape[0], 128), ceil_div(w.shape[1], 128)};
    if (shape != want)
      fail(PE_ERR_INVALID_ARGUMENT, "tensor ", name, ": shape ", shape_str(shape), ", expected ",
           shape_str(want), " (128x128 blocks of ", shape_str(w.shape), ")");
    if (!is_float_type(dtype))
      fail(PE_ERR_INVALID_ARGUMENT, "tensor ", name, ": dtype ", dtype_name(dtype), ", expected F32 or BF16");
    w.f32.resize(want[0] * want[1]);
    to_f32(dtype, data, want[0] * want[1], w.f32.data());
    w.has_scale = true;
    return;
  }
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(PE_ERR_NOT_FOUND, "tensor ", name, ": not a tensor of this model");
  Tensor& t = it->second;
  if (shape != t.shape)
    fail(PE_ERR_INVALID_ARGUMENT, "tensor ", name, ": shape ", shape_str(shape), ", expected ", shape_str(t.shape));
  bool ok = is_float_type(dtype) || (t.kind == TensorKind::Matrix && dtype == DType::FP8_E4M3);
  if (!ok)
    fail(PE_ERR_INVALID_ARGUMENT, "tensor ", name, ": dtype ", dtype_name(dtype), " is not supported here",
         t.kind == TensorKind::Matrix ? " (F32, F16, BF16 or F8_E4M3 with block scales)" : " (F32, F16 or BF16)");
  t.dtype = dtype;
  size_t n = dtype_bytes_for(dtype, t.numel());
  t.bytes.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n);
  t.present = true;
}

void WeightStore::finalize() {
  bool any_mtp = false, all_mtp = cfg_ && cfg_->mtp_layers > 0;
  std::string first_missing_mtp;
  for (auto& [name, t] : tensors_) {
    const bool mtp = is_mtp(name);
    if (!t.present) {
      if (t.required) fail(PE_ERR_NOT_FOUND, "tensor ", name, " is missing from the checkpoint");
      if (mtp) {
        all_mtp = false;
        if (first_missing_mtp.empty()) first_missing_mtp = name;
      }
      continue;
    }
    any_mtp |= mtp;
    if (t.kind == TensorKind::Matrix) {
      if (t.dtype == DType::FP8_E4M3 && !t.has_scale)
        fail(PE_ERR_NOT_FOUND, "tensor ", name, "_scale_inv is missing (", name, " is F8_E4M3)");
      if (t.dtype != DType::FP8_E4M3 && t.has_scale)
        fail(PE_ERR_INVALID_ARGUMENT, "tensor ", name, "_scale_inv given but ", name, " is ", dtype_name(t.dtype));
    } else {
      t.f32.resize(t.numel());
      to_f32(t.dtype, t.bytes.data(), t.numel(), t.f32.data());
      std::vector<uint8_t>().swap(t.bytes);
    }
  }
  if (any_mtp && !all_mtp)
    fail(PE_ERR_NOT_FOUND, "tensor ", first_missing_mtp, " is missing: the MTP head is incomplete");
  has_mtp_ = all_mtp;
}

bool WeightStore::has(const std::string& name) const {
  auto it = tensors_.find(name);
  return it != tensors_.end() && it->second.present;
}

const Tensor& WeightStore::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end() || !it->second.present) fail(PE_ERR_INTERNAL, "tensor ", name, " not loaded");
  return it->second;
}

WeightView WeightStore::matrix(const std::string& name) const {
  const Tensor& t = get(name);
  if (t.kind != TensorKind::Matrix) fail(PE_ERR_INTERNAL, "tensor ", name, " is not a matrix");
  WeightView v;
  v.dtype = t.dtype;
  v.rows = t.shape[0];
  v.cols = t.shape[1];
  v.data = t.bytes.data();
  if (t.dtype == DType::FP8_E4M3) v.block_scale = t.has_scale ? t.f32.data() : nullptr;
  if (t.dtype == DType::I8) v.row_scale = t.f32.data();
  if (t.dtype == DType::NVFP4) {
    v.group_scale = t.group_scale.data();
    v.global_scale = t.global_scale;
  }
  return v;
}

const float* WeightStore::vec(const std::string& name) const {
  const Tensor& t = get(name);
  if (t.kind != TensorKind::Vector) fail(PE_ERR_INTERNAL, "tensor ", name, " is not a vector");
  return t.f32.data();
}

int64_t WeightStore::bytes_total() const {
  int64_t n = 0;
  for (auto& [name, t] : tensors_) n += t.bytes.size() + t.f32.size() * 4 + t.group_scale.size();
  return n;
}

void WeightStore::drop_host_matrices() {
  for (auto& [name, t] : tensors_)
    if (t.kind == TensorKind::Matrix) {
      std::vector<uint8_t>().swap(t.bytes);
      std::vector<float>().swap(t.f32);
      std::vector<uint8_t>().swap(t.group_scale);
    }
}

void WeightStore::mark_present(const std::string& name, DType dtype) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(PE_ERR_NOT_FOUND, "tensor ", name, ": not a tensor of this model");
  it->second.dtype = dtype;
  it->second.present = true;
  if (is_mtp(name) && cfg_ && cfg_->mtp_layers > 0) {  // the head is there once all of it is
    has_mtp_ = true;
    for (const auto& [n, t] : tensors_) has_mtp_ = has_mtp_ && (!is_mtp(n) || t.present);
  }
}

}  // namespace pe
