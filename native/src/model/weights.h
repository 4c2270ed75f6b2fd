// The weight table of one model: which tensors a config needs, their shapes and allowed dtypes,
// and the tensors as handed over by the loader (copied, in their checkpoint dtype).
//
// Design: validation lives here, next to the shapes, so every loader (Python safetensors, the
// dummy generator, a future TP shard) gets the same errors naming the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/ops.h"
#include "model/config.h"

namespace pe {

enum class TensorKind {
  Matrix,  // linear weight [out, in]: F32/F16/BF16, or FP8_E4M3 with a "<name>_scale_inv" sibling
  Vector,  // norms, biases, gates, conv: any float type, converted to fp32 at finalize
};

struct Tensor {
  TensorKind kind = TensorKind::Vector;
  bool required = true;
  bool present = false;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // expected shape (the checkpoint's, e.g. conv1d [C, 1, K])
  std::vector<uint8_t> bytes;  // as given
  std::vector<float> f32;      // Vector tensors after finalize; FP8 block scales as fp32
  bool has_scale = false;      // Matrix FP8: block scales in f32; I8: row scales in f32
  std::vector<uint8_t> group_scale;  // Matrix NVFP4: fp8 scale per 16 values
  float global_scale = 1.0f;         // Matrix NVFP4
  int64_t numel() const;
};

class WeightStore {
 public:
  // The table of a Qwen3.5 config (embedding, layers, lm_head, the optional MTP head).
  explicit WeightStore(const ModelConfig& cfg);
  // An empty table another architecture fills with expect (the DFlash draft, model/dflash.h).
  WeightStore() = default;
  // Declares a tensor of the table (replacing one of that name).
  void expect(const std::string& name, TensorKind kind, std::vector<int64_t> shape, bool required = true);

  // Copies one tensor; throws pe::Error (NOT_FOUND / INVALID_ARGUMENT) naming it.
  void set(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data);
  // Checks completeness, converts Vector tensors and scales to fp32. Throws naming what is missing.
  void finalize();

  // On-load quantization (after finalize): every layer matrix stored as F32/F16/BF16 becomes
  // `target` (I8, FP8_E4M3, NVFP4); embed_tokens and lm_head are kept. Host memory.
  void quantize(DType target);
  // Frees the host copies of matrices (after a device model uploaded them).
  void drop_host_matrices();
  // Every tensor this config can hold, present or not (loaders and the dummy generator).
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  // Marks a tensor present without host data (weights generated on the device); the MTP head
  // counts as loaded once every mtp.* tensor is marked.
  void mark_present(const std::string& name, DType dtype);

  bool has(const std::string& name) const;
  const Tensor& get(const std::string& name) const;
  WeightView matrix(const std::string& name) const;        // view over a Matrix tensor
  const float* vec(const std::string& name) const;         // fp32 data of a Vector tensor
  bool has_mtp() const { return has_mtp_; }
  // A tensor of the MTP head (mtp.*; expected only where the config has one).
  static bool is_mtp(const std::string& name) { return name.rfind("mtp.", 0) == 0; }
  // Whether the config uses the tensor: a required one or one of its MTP head (what dummy weights fill).
  static bool used(const std::string& name, const Tensor& t) { return t.required || is_mtp(name); }
  int64_t bytes_total() const;

 private:
  void expect_layer(const std::string& prefix, bool full, bool required);
  std::map<std::string, Tensor> tensors_;
  bool has_mtp_ = false;
  const ModelConfig* cfg_ = nullptr;
};

}  // namespace pe
