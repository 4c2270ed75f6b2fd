// Random quantized and 16-bit weights for the CUDA linear tests (test_cuda_linear.cpp,
// test_cuda_split_norm.cpp): the host bytes and scales of a WeightView, and the same on the device.
#pragma once
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "test_cuda_util.h"

namespace pe_test {

using pe::DType;
using pe::WeightView;
using pe::dtype_bytes_for;
using pe::f32_to_bf16;
using pe::f32_to_f16;
using pe::f32_to_fp8e4m3;

// A weight of dtype t with random values (normal * 0.5 before quantization), host bytes + scales.
struct HostWeight {
  WeightView view;  // host pointers
  std::vector<uint8_t> bytes;
  std::vector<float> scales;         // FP8 block / I8 row scales
  std::vector<uint8_t> group_scale;  // NVFP4
};

inline HostWeight make_weight(DType t, int64_t rows, int64_t cols, uint64_t seed, int64_t block = 128) {
  pe_test::Rng rng(seed);
  HostWeight w;
  w.view.dtype = t;
  w.view.rows = rows;
  w.view.cols = cols;
  const std::vector<float> src = rng.normals(rows * cols, 0.5f);
  w.bytes.resize(dtype_bytes_for(t, rows * cols));
  if (t == DType::FP8_E4M3) {
    const int64_t rb = (rows + block - 1) / block, cb = (cols + block - 1) / block;
    w.scales.resize(rb * cb);
    for (auto& s : w.scales) s = rng.uniform(0.001f, 0.02f);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        w.bytes[i * cols + j] = f32_to_fp8e4m3(src[i * cols + j] / w.scales[(i / block) * cb + j / block]);
    w.view.block_scale = w.scales.data();
    w.view.block = block;
  } else if (t == DType::I8) {
    w.scales.resize(rows);
    for (auto& s : w.scales) s = rng.uniform(0.001f, 0.02f);
    for (int64_t i = 0; i < rows * cols; ++i) w.bytes[i] = static_cast<uint8_t>(rng.below(256));
    w.view.row_scale = w.scales.data();
  } else if (t == DType::NVFP4) {  // every code, group scales over e4m3's normal and subnormal range
    w.group_scale.resize(rows * cols / 16);
    for (auto& g : w.group_scale) g = static_cast<uint8_t>(rng.below(0x7f));  // 0x00 .. 0x7e
    for (auto& b : w.bytes) b = static_cast<uint8_t>(rng.below(256));
    w.view.group_scale = w.group_scale.data();
    w.view.global_scale = 0.0173f;
  } else if (t == DType::F32) {
    std::memcpy(w.bytes.data(), src.data(), src.size() * 4);
  } else {
    auto* d = reinterpret_cast<uint16_t*>(w.bytes.data());
    for (size_t i = 0; i < src.size(); ++i) d[i] = t == DType::F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
  }
  w.view.data = w.bytes.data();
  return w;
}

// The same weight on the device.
struct DevWeight {
  DevBuf<uint8_t> bytes;
  DevBuf<float> scales;
  DevBuf<uint8_t> group_scale;
  WeightView view;
  explicit DevWeight(const HostWeight& h) : bytes(h.bytes), scales(h.scales), group_scale(h.group_scale) {
    view = h.view;
    view.data = bytes.p;
    if (h.view.block_scale) view.block_scale = scales.p;
    if (h.view.row_scale) view.row_scale = scales.p;
    if (h.view.group_scale) view.group_scale = group_scale.p;
  }
};

// The device weight in the GEMV tile layout of `tile` rows (cuda::tile_weight; 0: row-major).
struct DevTiledWeight {
  DevWeight dense;
  DevBuf<uint8_t> tiled;
  WeightView view;
  DevTiledWeight(const HostWeight& h, int tile)
      : dense(h), tiled(tile ? pe::cuda::tiled_weight_bytes(dense.view, tile) : 0), view(dense.view) {
    if (tile) view = pe::cuda::tile_weight(dense.view, tiled.p, tile, nullptr);
  }
};

}  // namespace pe_test
