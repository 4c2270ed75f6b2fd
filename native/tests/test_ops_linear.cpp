// linear (F32, F16, BF16, FP8 e4m3 with 128x128 block scales) and embedding (F32/F16/BF16 tables)
// against double-precision references on the dequantized weights.
#include <vector>

#include "check.h"
#include "core/dtype.h"
#include "core/threadpool.h"
#include "kernels/ops.h"

using namespace pe;

namespace {

// A weight of the given dtype built from random values, with its exact fp32 dequantization.
struct TestWeight {
  WeightView view;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<float> dequant;  // [rows, cols]
};

TestWeight make_weight(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  pe_test::Rng rng(seed);
  TestWeight w;
  w.view.dtype = t;
  w.view.rows = rows;
  w.view.cols = cols;
  w.dequant.resize(rows * cols);
  std::vector<float> src = rng.normals(rows * cols, 0.5f);
  w.bytes.resize(dtype_bytes_for(t, rows * cols));
  if (t == DType::FP8_E4M3) {
    const int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
    w.scales.resize(rb * cb);
    for (auto& s : w.scales) s = rng.uniform(0.001f, 0.02f);
    w.view.block_scale = w.scales.data();
    w.view.block = 128;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const float s = w.scales[(i / 128) * cb + j / 128];
        const uint8_t q = f32_to_fp8e4m3(src[i * cols + j] / s);
        w.bytes[i * cols + j] = q;
        w.dequant[i * cols + j] = fp8e4m3_to_f32(q) * s;
      }
  } else {
    for (int64_t i = 0; i < rows * cols; ++i) {
      float v = src[i];
      if (t == DType::F16) {
        const uint16_t h = f32_to_f16(v);
        std::memcpy(&w.bytes[2 * i], &h, 2);
        v = f16_to_f32(h);
      } else if (t == DType::BF16) {
        const uint16_t b = f32_to_bf16(v);
        std::memcpy(&w.bytes[2 * i], &b, 2);
        v = bf16_to_f32(b);
      } else {
        std::memcpy(&w.bytes[4 * i], &v, 4);
      }
      w.dequant[i] = v;
    }
  }
  w.view.data = w.bytes.data();
  return w;
}

std::vector<double> ref_linear(const std::vector<float>& x, int64_t n, const TestWeight& w) {
  const int64_t rows = w.view.rows, cols = w.view.cols;
  std::vector<double> out(n * rows);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0.0;
      for (int64_t j = 0; j < cols; ++j)
        s += static_cast<double>(x[t * cols + j]) * w.dequant[r * cols + j];
      out[t * rows + r] = s;
    }
  return out;
}

void check_linear(DType t, int64_t n, int64_t rows, int64_t cols, uint64_t seed) {
  const TestWeight w = make_weight(t, rows, cols, seed);
  pe_test::Rng rng(seed + 100);
  const std::vector<float> x = rng.normals(n * cols);
  std::vector<float> out(n * rows, -1.0f);
  cpu::linear(x.data(), n, w.view, out.data());
  const std::vector<double> ref = ref_linear(x, n, w);
  CHECK_CLOSE(out.data(), ref.data(), n * rows, 2e-6);
}

}  // namespace

TEST(linear_simple) {
  // W = [[1, 2], [3, 4], [5, 6]], x = [[1, 1], [1, -1]] -> [[3, 7, 11], [-1, -1, -1]].
  const float W[6] = {1, 2, 3, 4, 5, 6};
  const float x[4] = {1, 1, 1, -1};
  WeightView w;
  w.rows = 3;
  w.cols = 2;
  w.data = W;
  float out[6];
  cpu::linear(x, 2, w, out);
  const float want[6] = {3, 7, 11, -1, -1, -1};
  for (int i = 0; i < 6; ++i) CHECK_EQ(out[i], want[i]);
}

TEST(linear_f32_sizes) {
  for (int64_t n : {1, 2, 3, 5, 8, 17, 65})
    for (auto rc : {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {17, 64}, {130, 63}, {257, 96}})
      check_linear(DType::F32, n, rc.first, rc.second, 11 + n);
}

TEST(linear_f16_bf16) {
  for (DType t : {DType::F16, DType::BF16})
    for (int64_t n : {1, 2, 3, 4, 9, 33})
      for (auto rc : {std::pair<int64_t, int64_t>{7, 9}, {64, 130}, {300, 256}})
        check_linear(t, n, rc.first, rc.second, 21 + n);
}

TEST(linear_fp8_block_scales) {
  // Rows and columns on and off multiples of the 128 block.
  for (int64_t n : {1, 3, 8, 20})
    for (auto rc : {std::pair<int64_t, int64_t>{128, 128}, {200, 300}, {129, 127}, {5, 260},
                    {384, 129}})
      check_linear(DType::FP8_E4M3, n, rc.first, rc.second, 31 + n);
}

TEST(linear_large_prefill_multithread) {
  const int before = num_threads();
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    check_linear(DType::BF16, 130, 515, 384, 41);
    check_linear(DType::F32, 64, 1000, 70, 42);
  }
  set_num_threads(before);
}

TEST(linear_every_dtype_awkward_sizes) {
  // GEMV (16-bit weights, n <= 16: 16-column blocks + tails, 4/2-row tiles + leftovers, token
  // groups of 4), F32/FP8 row tiles (n <= 4) and the packed GEMM (6-token tiles + leftovers, full
  // 16-row panels (8x8 transposes, K tails) and partial ones, row blocks) on 1..3 threads.
  const int before = num_threads();
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},  {5, 15},  {16, 16},  {17, 17}, {33, 31},
                                                {6, 384}, {100, 33}, {67, 129}, {130, 200}};
  uint64_t seed = 61;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3})
      for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 17, 67})
        for (const auto& rc : shapes) check_linear(t, n, rc.first, rc.second, ++seed);
  }
  set_num_threads(before);
}

TEST(linear_model_shapes_multithread) {
  // The default model's projections: many row blocks and token splits, big K (down_proj).
  const int before = num_threads();
  for (int threads : {2, 4}) {
    set_num_threads(threads);
    for (int64_t n : {1, 2, 7, 200}) {
      check_linear(DType::BF16, n, 1024, 384, 71 + n);
      check_linear(DType::BF16, n, 384, 1024, 72 + n);
      check_linear(DType::F16, n, 8192 / 4, 384, 73 + n);
    }
  }
  set_num_threads(before);
}

TEST(embedding_tables) {
  const int64_t V = 37, H = 19;
  const int32_t ids[5] = {0, 36, 5, 5, 17};
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3}) {
    const TestWeight w = make_weight(t, V, H, 51);
    std::vector<float> out(5 * H);
    cpu::embedding(w.view, ids, 5, out.data());
    int bad = 0;
    for (int i = 0; i < 5; ++i)
      for (int64_t j = 0; j < H; ++j) bad += out[i * H + j] != w.dequant[ids[i] * H + j];
    CHECK_EQ(bad, 0);
  }
  // Many tokens (parallel path).
  const TestWeight w = make_weight(DType::BF16, 1000, 64, 52);
  std::vector<int32_t> many(700);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int32_t>((i * 37) % 1000);
  std::vector<float> out(many.size() * 64);
  cpu::embedding(w.view, many.data(), static_cast<int64_t>(many.size()), out.data());
  int bad = 0;
  for (size_t i = 0; i < many.size(); ++i)
    for (int64_t j = 0; j < 64; ++j) bad += out[i * 64 + j] != w.dequant[many[i] * 64 + j];
  CHECK_EQ(bad, 0);
}
