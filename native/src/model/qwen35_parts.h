// Internals of Qwen35Model shared by its translation units (qwen35.cpp, mtp.cpp): the per-layer
// weight views and the activation workspace.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/qwen35.h"

namespace pe {

struct Qwen35Model::LayerViews {
  bool full = false;
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  WeightView gate, up, down;
  // attention
  WeightView q, k, v, o;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  // GDN
  WeightView qkv, z, b, a, out;
  const float* conv = nullptr;  // [conv_dim, K]
  const float* dt_bias = nullptr;
  const float* A_log = nullptr;
  const float* norm = nullptr;
};

// Activation buffers, grown to the largest batch seen (no allocation per step once warm).
struct Qwen35Model::Workspace {
  std::vector<float> x, h, mix, t0, t1, t2, t3, t4, t5;
  std::vector<int32_t> pos, slots;
  static float* get(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v.data();
  }
};

}  // namespace pe
