// WeightStore::quantize: on-load quantization of the layer matrices (model/quantize.h does the
// per-matrix work).
#include "core/error.h"
#include "model/quantize.h"
#include "model/weights.h"

namespace pe {

void WeightStore::quantize(DType target) {
  if (target != DType::I8 && target != DType::FP8_E4M3 && target != DType::NVFP4)
    fail(PE_ERR_INVALID_ARGUMENT, "weight_quant: ", dtype_name(target), " is not a quantized weight format (int8, fp8, nvfp4)");
  for (auto& [name, t] : tensors_) {
    if (!t.present || t.kind != TensorKind::Matrix) continue;
    if (name == "embed_tokens.weight" || name == "lm_head.weight") continue;
    if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16) continue;  // already quantized
    if (target == DType::NVFP4 && t.shape[1] % 16 != 0)
      fail(PE_ERR_INVALID_ARGUMENT, "weight_quant nvfp4: tensor ", name, " has ", t.shape[1],
           " columns, not a multiple of 16");
    QuantizedMatrix q = quantize_matrix(matrix(name), target);
    t.dtype = q.dtype;
    t.bytes = std::move(q.data);
    t.f32 = std::move(q.scales);
    t.has_scale = target != DType::NVFP4;
    t.group_scale = std::move(q.group_scale);
    t.global_scale = q.global_scale;
  }
}

}  // namespace pe
