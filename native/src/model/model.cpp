#include "model/model.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"

namespace pe {

Model::Model(const ModelConfig& cfg) : cfg_(cfg), weights_(cfg_) {}
Model::~Model() = default;

void Model::set_weight_quant(DType target) {
  if (target != DType::F32 && target != DType::I8 && target != DType::FP8_E4M3 && target != DType::NVFP4)
    fail(PE_ERR_INVALID_ARGUMENT, "weight_quant: ", dtype_name(target),
         " is not a weight quantization (use int8, fp8 or nvfp4)");
  weight_quant_ = target;
}

void Model::set_prefill_weight_copy(int mode) {
  if (mode < -1 || mode > 1) fail(PE_ERR_INVALID_ARGUMENT, "prefill_weight_copy must be -1 (auto), 0 or 1, got ", mode);
  prefill_weight_copy_ = mode;
}

// Value ranges of the dummy tensors: small enough that 64 random layers keep the residual stream
// finite, varied enough that nothing is a special case (zeros, ones) for the kernels.
float dummy_scale(const std::string& name, const Tensor& t) {
  if (t.kind == TensorKind::Matrix)
    return name == "embed_tokens.weight" ? 1.0f : std::sqrt(3.0f / static_cast<float>(t.shape[1]));
  if (name.find("conv1d") != std::string::npos) return 0.5f;
  return 0.1f;  // norms (offset form), gates, biases
}

void Model::load_dummy(DType matrix_dtype, uint64_t seed) {
  if (matrix_dtype != DType::F32 && matrix_dtype != DType::F16 && matrix_dtype != DType::BF16 &&
      matrix_dtype != DType::FP8_E4M3)
    fail(PE_ERR_INVALID_ARGUMENT, "dummy weights: matrix dtype ", dtype_name(matrix_dtype), " is not supported");
  std::vector<std::pair<std::string, Tensor>> todo;
  for (const auto& [name, t] : weights_.tensors())
    if (WeightStore::used(name, t)) todo.emplace_back(name, t);
  uint64_t index = 0;
  for (const auto& [name, t] : todo) {
    const float scale = dummy_scale(name, t);
    const int64_t n = t.numel();
    std::vector<float> v(static_cast<size_t>(n));
    const uint64_t s = seed * 1000003u + (++index);
    for (int64_t i = 0; i < n; ++i) v[i] = (uniform_at(s, static_cast<uint64_t>(i)) * 2.0f - 1.0f) * scale;
    const bool fp8 = t.kind == TensorKind::Matrix && matrix_dtype == DType::FP8_E4M3 && name != "embed_tokens.weight" &&
                     name != "lm_head.weight";
    // Embeddings and lm_head stay 16-bit, as in the FP8 checkpoints.
    const DType big = matrix_dtype == DType::FP8_E4M3 ? DType::BF16 : matrix_dtype;
    const DType dt = t.kind == TensorKind::Vector ? DType::F32 : fp8 ? DType::FP8_E4M3 : big;
    std::vector<uint8_t> bytes(dtype_bytes_for(dt, n));
    for (int64_t i = 0; i < n; ++i) {
      switch (dt) {
        case DType::F16: reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_f16(v[i]); break;
        case DType::BF16: reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_bf16(v[i]); break;
        case DType::FP8_E4M3: bytes[i] = f32_to_fp8e4m3(v[i] / scale); break;  // block scale = scale
        default: std::memcpy(bytes.data() + 4 * i, &v[i], 4); break;
      }
    }
    weights_.set(name, dt, t.shape, bytes.data());
    if (fp8) {
      const std::vector<int64_t> sshape = {(t.shape[0] + 127) / 128, (t.shape[1] + 127) / 128};
      std::vector<float> sc(static_cast<size_t>(sshape[0] * sshape[1]), scale);
      weights_.set(name + "_scale_inv", DType::F32, sshape, sc.data());
    }
  }
  finalize();
}

void Model::mtp_forward(const int32_t*, int64_t, const float*, KvPool&, std::vector<float>&) {
  fail(PE_ERR_UNSUPPORTED, "this model has no MTP head");
}

void Model::mtp_step(const Batch&, const std::vector<int32_t>&, KvPool&, int64_t, ForwardResult&) {
  fail(PE_ERR_UNSUPPORTED, "this model has no MTP head");
}

}  // namespace pe
