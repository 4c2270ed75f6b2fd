// linear (F32, F16, BF16, FP8 e4m3 with 128x128 block scales, I8 with row scales, NVFP4 with
// group + global scales) and embedding (F32/F16/BF16 tables)
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
  std::vector<uint8_t> group_scale;  // NVFP4
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
  if (t == DType::I8) {  // int8 codes, per-row scales
    w.scales.resize(rows);
    for (auto& s : w.scales) s = rng.uniform(0.001f, 0.02f);
    w.view.row_scale = w.scales.data();
    for (int64_t i = 0; i < rows * cols; ++i) {
      const int8_t q = static_cast<int8_t>(static_cast<int>(rng.below(255)) - 127);
      w.bytes[i] = static_cast<uint8_t>(q);
      w.dequant[i] = static_cast<float>(q) * w.scales[i / cols];
    }
  } else if (t == DType::NVFP4) {  // random e2m1 codes, random e4m3 group scales, a global scale
    w.group_scale.resize(rows * cols / 16);
    for (auto& g : w.group_scale) g = f32_to_fp8e4m3(rng.uniform(0.01f, 2.0f));
    w.view.group_scale = w.group_scale.data();
    w.view.global_scale = 0.0123f;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint8_t code = static_cast<uint8_t>(rng.below(16));
      w.bytes[i / 2] |= static_cast<uint8_t>(code << ((i & 1) * 4));
      w.dequant[i] = fp4e2m1_to_f32(code) * fp8e4m3_to_f32(w.group_scale[i / 16]) * 0.0123f;
    }
  } else if (t == DType::FP8_E4M3) {
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

TEST(fp8_group_quantize_known_values) {
  // Token 0: group 0 has amax 448 (scale 1): 1.0625 ties to even (1), 0.3 rounds to 0.3125; group
  // 1 (2 columns) has amax 3.5 (scale 2^-7): 0.001 / 2^-7 = 0.128 rounds to 0.125. Token 1 is all
  // zeros (the amax floor keeps the scale finite and the values 0).
  std::vector<float> x(2 * 130, 0.0f), out(x.size(), -1.0f);
  x[0] = 448.0f;
  x[1] = 1.0625f;
  x[2] = 0.3f;
  x[128] = -3.5f;
  x[129] = 0.001f;
  cpu::fp8_group_quantize(x.data(), 2, 130, out.data());
  CHECK_EQ(out[0], 448.0f);
  CHECK_EQ(out[1], 1.0f);
  CHECK_EQ(out[2], 0.3125f);
  CHECK_EQ(out[3], 0.0f);
  CHECK_EQ(out[128], -3.5f);
  CHECK_EQ(out[129], 0.125f / 128.0f);
  for (int i = 130; i < 260; ++i) CHECK_EQ(out[i], 0.0f);
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

TEST(linear_i8_nvfp4) {
  // Decode (n <= 4: row tiles) and the packed GEMM (n > 4), rows on and off the 16-row panels,
  // NVFP4 columns multiples of 16 only (ops.h).
  const int before = num_threads();
  uint64_t seed = 81;
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    for (DType t : {DType::I8, DType::NVFP4})
      for (int64_t n : {1, 2, 3, 4, 5, 8, 17, 65})
        for (auto rc : {std::pair<int64_t, int64_t>{1, 16}, {5, 48}, {17, 96}, {130, 272}, {33, 4096}})
          check_linear(t, n, rc.first, rc.second, ++seed);
    for (int64_t n : {1, 6})
      for (auto rc : {std::pair<int64_t, int64_t>{7, 9}, {67, 129}}) check_linear(DType::I8, n, rc.first, rc.second, ++seed);
  }
  set_num_threads(before);
}

TEST(linear_i8_nvfp4_known_values) {
  // I8: W = [[1, -2], [127, 0]] * row scales [0.5, 2]; NVFP4: one row of 16, codes 1 (0.5) and
  // 15 (-6) alternating, group scale 2.0 (e4m3 0x40), global 0.25 -> W = 0.25, -3, 0.25, -3 ...
  const int8_t q[4] = {1, -2, 127, 0};
  const float rs[2] = {0.5f, 2.0f};
  WeightView w;
  w.dtype = DType::I8;
  w.rows = 2;
  w.cols = 2;
  w.data = q;
  w.row_scale = rs;
  const float x[2] = {1.0f, 3.0f};
  float out[2];
  cpu::linear(x, 1, w, out);
  CHECK_EQ(out[0], 0.5f * (1.0f - 6.0f));
  CHECK_EQ(out[1], 254.0f);
  uint8_t codes[8];
  for (auto& c : codes) c = 0xf1;
  const uint8_t gs = 0x40;
  CHECK_EQ(fp8e4m3_to_f32(gs), 2.0f);
  WeightView f4;
  f4.dtype = DType::NVFP4;
  f4.rows = 1;
  f4.cols = 16;
  f4.data = codes;
  f4.group_scale = &gs;
  f4.global_scale = 0.25f;
  std::vector<float> x16(16, 1.0f);
  cpu::linear(x16.data(), 1, f4, out);
  CHECK_EQ(out[0], 8 * (0.25f - 3.0f));
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
  // FP8 over several 128 x 128 scale blocks (partial ones too): each id takes its own row block.
  {
    const TestWeight w8 = make_weight(DType::FP8_E4M3, 300, 150, 53);
    const int32_t far[6] = {0, 299, 128, 127, 256, 200};
    std::vector<float> out(6 * 150);
    cpu::embedding(w8.view, far, 6, out.data());
    int bad = 0;
    for (int i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 150; ++j) bad += out[i * 150 + j] != w8.dequant[far[i] * 150 + j];
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
