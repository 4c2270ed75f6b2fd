// model/quantize.h: exact codes and scales on hand-made matrices, round-trip error bounds per
// format on random and outlier-heavy matrices, thread-count independence, error messages.
// PE_QUANT_BENCH=1 also times a 17408 x 5120 bf16 matrix per format (the 27B gate|up half).
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "core/dtype.h"
#include "core/threadpool.h"
#include "model/quantize.h"

using namespace pe;

namespace {

WeightView f32_view(const std::vector<float>& v, int64_t rows, int64_t cols) {
  WeightView w;
  w.dtype = DType::F32;
  w.rows = rows;
  w.cols = cols;
  w.data = v.data();
  return w;
}

// The dequantized matrix, straight from the formulas of kernels/ops.h.
std::vector<float> dequant(const QuantizedMatrix& q) {
  const int64_t rows = q.rows, cols = q.cols;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float v = 0.0f;
      if (q.dtype == DType::I8) {
        v = static_cast<float>(static_cast<int8_t>(q.data[i * cols + j])) * q.scales[i];
      } else if (q.dtype == DType::FP8_E4M3) {
        const int64_t cb = (cols + q.block - 1) / q.block;
        v = fp8e4m3_to_f32(q.data[i * cols + j]) * q.scales[(i / q.block) * cb + j / q.block];
      } else {
        const uint8_t byte = q.data[(i * cols + j) / 2];
        const float s = fp8e4m3_to_f32(q.group_scale[i * (cols / 16) + j / 16]) * q.global_scale;
        v = fp4e2m1_to_f32((byte >> ((j & 1) * 4)) & 0xf) * s;
      }
      out[i * cols + j] = v;
    }
  return out;
}

// Largest error a value of w may carry given its scale (per format), checked per element.
bool within_bound(const QuantizedMatrix& q, const std::vector<float>& w, const std::vector<float>& d,
                  int64_t i, int64_t j) {
  const int64_t cols = q.cols;
  const float x = w[i * cols + j], err = std::fabs(x - d[i * cols + j]);
  if (q.dtype == DType::I8) return err <= 0.5f * q.scales[i] * (1.0f + 1e-5f);
  if (q.dtype == DType::FP8_E4M3) {
    const int64_t cb = (cols + q.block - 1) / q.block;
    const float s = q.scales[(i / q.block) * cb + j / q.block];
    // e4m3: 3 mantissa bits (half ulp = 2^-4 relative), subnormal quantum 2^-9.
    return err <= std::fabs(x) * 0.0625f + s * 0.001f + 1e-12f;
  }
  const float s = fp8e4m3_to_f32(q.group_scale[i * (cols / 16) + j / 16]) * q.global_scale;
  float amax = 0.0f;
  for (int64_t k = j / 16 * 16; k < j / 16 * 16 + 16; ++k) amax = std::max(amax, std::fabs(w[i * cols + k]));
  // Half the e2m1 step (<= 1 * s), plus whatever the e4m3 rounding of the scale clipped at 6 s;
  // a group below the scale's range dequantizes to 0 (err <= amax).
  if (s == 0.0f) return err <= amax;
  return err <= s * (std::fabs(x) / s > 4.0f ? 1.0f : 0.5f) + std::max(0.0f, amax - 6.0f * s) + 1e-6f * amax;
}

struct RoundTrip {
  double rel;  // ||w - dequant|| / ||w||
  int64_t out_of_bound;
};

RoundTrip round_trip(const std::vector<float>& w, int64_t rows, int64_t cols, DType t) {
  const QuantizedMatrix q = quantize_matrix(f32_view(w, rows, cols), t);
  const std::vector<float> d = dequant(q);
  RoundTrip r{pe_test::compare(d.data(), w.data(), rows * cols).rel, 0};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) r.out_of_bound += within_bound(q, w, d, i, j) ? 0 : 1;
  return r;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(quantize_i8_known_values) {
  // Row 0: absmax 127 -> scale 1; -63.5 ties to even (-64). Row 1: zeros -> scale 1, codes 0.
  // Row 2: absmax 254 -> scale 2 (-63.5 -> -64, 0.5 -> 0, 1.5 -> 2: ties to even).
  const std::vector<float> w = {127, -63.5f, 1, 0, 0, 0, 0, 0, 254, -127, 1, 3};
  const QuantizedMatrix q = quantize_matrix(f32_view(w, 3, 4), DType::I8);
  CHECK(q.dtype == DType::I8 && q.rows == 3 && q.cols == 4);
  CHECK_EQ(q.scales[0], 1.0f);
  CHECK_EQ(q.scales[1], 1.0f);
  CHECK_EQ(q.scales[2], 2.0f);
  const int8_t want[12] = {127, -64, 1, 0, 0, 0, 0, 0, 127, -64, 0, 2};
  for (int i = 0; i < 12; ++i) CHECK_EQ(static_cast<int>(static_cast<int8_t>(q.data[i])), static_cast<int>(want[i]));
  const WeightView v = q.view();
  CHECK(v.dtype == DType::I8 && v.row_scale == q.scales.data() && v.block_scale == nullptr);
}

TEST(quantize_fp8_known_values) {
  // 130 x 130: four blocks (two partial). Block (0,0) absmax 896 -> scale 2; block (0,1) absmax
  // 44.8 -> 0.1; block (1,0) zeros -> 1; block (1,1) absmax 448 -> 1.
  std::vector<float> w(130 * 130, 0.0f);
  w[0] = 896.0f;
  w[1] = -3.0f;      // /2 = -1.5 exact
  w[2] = 0.0078125f; // /2 = 2^-8: an e4m3 subnormal (2 * 2^-9)
  w[129] = -44.8f;
  w[128] = 1.0f;     // /0.1 = 10
  w[129 * 130 + 129] = 448.0f;
  w[129 * 130 + 128] = 0.3f;
  const QuantizedMatrix q = quantize_matrix(f32_view(w, 130, 130), DType::FP8_E4M3);
  CHECK_EQ(static_cast<int>(q.scales.size()), 4);
  CHECK_EQ(q.scales[0], 2.0f);
  CHECK_EQ(q.scales[1], 44.8f / 448.0f);
  CHECK_EQ(q.scales[2], 1.0f);
  CHECK_EQ(q.scales[3], 1.0f);
  CHECK_EQ(static_cast<int>(q.data[0]), 0x7e);  // 448
  CHECK_EQ(static_cast<int>(q.data[1]), 0xbc);  // -1.5
  CHECK_EQ(static_cast<int>(q.data[2]), 0x02);  // 2 * 2^-9
  CHECK_EQ(static_cast<int>(q.data[129]), 0xfe);
  CHECK_EQ(static_cast<int>(q.data[128]), static_cast<int>(f32_to_fp8e4m3(1.0f / (44.8f / 448.0f))));
  CHECK_EQ(static_cast<int>(q.data[129 * 130 + 128]), static_cast<int>(f32_to_fp8e4m3(0.3f)));
  CHECK(q.view().block_scale == q.scales.data() && q.view().block == 128);
}

TEST(quantize_nvfp4_known_values) {
  // One row of 32: group 1 holds the absmax 2688 = 448 * 6 -> global scale 1, group scale 448;
  // group 0 absmax 6 -> group scale 1: the codes are the e2m1 roundings of the values themselves.
  std::vector<float> w(32, 0.0f);
  const float g0[16] = {6, -3, 1.5f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.5f, -6, 0.2f, 0.8f, 4, 100};
  for (int j = 0; j < 16; ++j) w[j] = g0[j];
  w[15] = 1.0f;  // (100 would be the absmax: keep it 6)
  w[16] = 2688.0f;
  w[17] = -1344.0f;  // /448 = -3
  w[18] = 100.0f;    // /448 = 0.223 -> 0
  const QuantizedMatrix q = quantize_matrix(f32_view(w, 1, 32), DType::NVFP4);
  CHECK_EQ(q.global_scale, 1.0f);
  CHECK_EQ(static_cast<int>(q.group_scale[0]), 0x38);  // 1.0
  CHECK_EQ(static_cast<int>(q.group_scale[1]), 0x7e);  // 448
  // Codes (low nibble = even column): 6->7, -3->8|5, 1.5->3, 0.25->0 (tie, even), 0.75->2 (tie,
  // even), 1.25->2, 1.75->4, 2.5->4, 3.5->6, 5->6, -0.5->9, -6->15, 0.2->0, 0.8->2, 4->6, 1->2.
  const uint8_t codes[16] = {7, 13, 3, 0, 2, 2, 4, 4, 6, 6, 9, 15, 0, 2, 6, 2};
  for (int j = 0; j < 16; j += 2)
    CHECK_EQ(static_cast<int>(q.data[j / 2]), codes[j] | (codes[j + 1] << 4));
  CHECK_EQ(static_cast<int>(q.data[8]), 7 | (13 << 4));
  CHECK_EQ(static_cast<int>(q.data[9] & 0xf), 0);
  const WeightView v = q.view();
  CHECK(v.group_scale == q.group_scale.data() && v.global_scale == 1.0f);
}

TEST(quantize_codes_match_dtype_conversions) {
  // Scale 1 (absmax 448 / 2688): every code must be dtype.cpp's rounding of the value itself,
  // over normals, subnormals, ties and the saturation edge.
  pe_test::Rng rng(9);
  std::vector<float> v(128 * 128);
  for (size_t i = 0; i < v.size(); ++i) {
    const float mag = std::ldexp(rng.uniform(1.0f, 2.0f), static_cast<int>(rng.below(22)) - 13);
    v[i] = (i & 1 ? -1.0f : 1.0f) * std::min(mag, 448.0f);
  }
  v[0] = 448.0f;
  v[1] = 0.0f;
  v[2] = 3.0f * 0.0009765625f;  // 1.5 subnormal quanta: a tie
  v[3] = 0.0146484375f;         // 7.5 quanta: ties up to the smallest normal
  v[4] = 17.0f;                 // a mantissa tie in the normal range
  const QuantizedMatrix q = quantize_matrix(f32_view(v, 128, 128), DType::FP8_E4M3);
  CHECK_EQ(q.scales[0], 1.0f);
  int bad = 0;
  for (size_t i = 0; i < v.size(); ++i) bad += q.data[i] != f32_to_fp8e4m3(v[i]);
  CHECK_EQ(bad, 0);
  std::vector<float> f(16 * 64);
  for (size_t i = 0; i < f.size(); ++i) f[i] = rng.uniform(-6.0f, 6.0f);
  for (int k = 0; k < 7; ++k) f[17 + k] = 0.25f + 0.5f * k;  // 0.25 .. 1.75: ties
  for (size_t g = 0; g < f.size(); g += 16) f[g] = 6.0f;       // every group absmax 6: scale 1
  f[5] = 2688.0f;                                              // global 1; group 0 scale 448
  const QuantizedMatrix n4 = quantize_matrix(f32_view(f, 16, 64), DType::NVFP4);
  bad = 0;
  for (size_t i = 16; i < f.size(); ++i)  // group 0 has its own scale
    bad += ((n4.data[i / 2] >> ((i & 1) * 4)) & 0xf) != f32_to_fp4e2m1(f[i]);
  CHECK_EQ(bad, 0);
}

TEST(quantize_round_trip_random) {
  // Gaussian weights: rms error ~ step / sqrt(12) (I8 absmax ~ 4 sigma over 127 levels), e4m3
  // ~ 2^-4 / sqrt(3) relative, e2m1 ~ 10% with its 8 levels.
  pe_test::Rng rng(5);
  const std::pair<int64_t, int64_t> shapes[] = {{1, 16}, {7, 48}, {130, 272}, {257, 128}};
  for (const auto& rc : shapes) {
    const std::vector<float> w = rng.normals(rc.first * rc.second, 0.02f);
    const RoundTrip i8 = round_trip(w, rc.first, rc.second, DType::I8);
    const RoundTrip f8 = round_trip(w, rc.first, rc.second, DType::FP8_E4M3);
    const RoundTrip f4 = round_trip(w, rc.first, rc.second, DType::NVFP4);
    CHECK(i8.rel < 0.012);
    CHECK(f8.rel < 0.04);
    CHECK(f4.rel < 0.12);
    CHECK(i8.rel > 1e-4 && f8.rel > 1e-3 && f4.rel > 1e-2);  // something was rounded
    CHECK_EQ(i8.out_of_bound + f8.out_of_bound + f4.out_of_bound, 0);
  }
}

TEST(quantize_round_trip_outliers) {
  // 0.1% of the values 300x larger (the activation-outlier channels of LLM weights): the bounds
  // per element still hold; I8 loses precision on outlier rows only, FP8 on outlier blocks only,
  // NVFP4 stays within its per-group bound (the global scale sets the group scales' range).
  pe_test::Rng rng(6);
  const int64_t rows = 256, cols = 512;
  std::vector<float> w = rng.normals(rows * cols, 0.02f);
  for (int k = 0; k < 131; ++k) w[rng.below(rows * cols)] = (k & 1 ? 6.0f : -6.0f) * rng.uniform(0.5f, 1.0f);
  for (DType t : {DType::I8, DType::FP8_E4M3, DType::NVFP4}) {
    const RoundTrip r = round_trip(w, rows, cols, t);
    CHECK_EQ(r.out_of_bound, 0);
    CHECK(r.rel < 0.1);  // I8: outlier rows get a coarse step
  }
  // A clean row block (no outlier) keeps the clean precision in FP8 (its own block scales).
  std::vector<float> clean = rng.normals(128 * cols, 0.02f);
  std::vector<float> mixed = clean;
  mixed.insert(mixed.end(), w.begin(), w.begin() + 128 * cols);
  const QuantizedMatrix q = quantize_matrix(f32_view(mixed, 256, cols), DType::FP8_E4M3);
  const std::vector<float> d = dequant(q);
  CHECK(pe_test::compare(d.data(), clean.data(), 128 * cols).rel < 0.04);
}

TEST(quantize_threads_bf16_source) {
  // Same bytes on 1 and 3 threads; a bf16 source quantizes like its fp32 widening.
  pe_test::Rng rng(7);
  const int64_t rows = 300, cols = 160;
  const std::vector<float> w = rng.normals(rows * cols, 0.05f);
  std::vector<uint16_t> b(w.size());
  std::vector<float> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) b[i] = f32_to_bf16(w[i]), wb[i] = bf16_to_f32(b[i]);
  WeightView src;
  src.dtype = DType::BF16;
  src.rows = rows;
  src.cols = cols;
  src.data = b.data();
  const int before = num_threads();
  for (DType t : {DType::I8, DType::FP8_E4M3, DType::NVFP4}) {
    set_num_threads(1);
    const QuantizedMatrix a = quantize_matrix(src, t);
    set_num_threads(3);
    const QuantizedMatrix c = quantize_matrix(src, t);
    const QuantizedMatrix ref = quantize_matrix(f32_view(wb, rows, cols), t);
    CHECK(a.data == c.data && a.scales == c.scales && a.group_scale == c.group_scale);
    CHECK(a.data == ref.data && a.scales == ref.scales && a.group_scale == ref.group_scale);
    CHECK_EQ(a.global_scale, ref.global_scale);
  }
  set_num_threads(before);
}

TEST(quantize_errors) {
  std::vector<float> w(4 * 24, 1.0f);
  WeightView v = f32_view(w, 4, 24);
  std::string e = error_of([&] { quantize_matrix(v, DType::NVFP4); });
  CHECK(e.find("cols % 16") != std::string::npos && e.find("24") != std::string::npos);
  e = error_of([&] { quantize_matrix(v, DType::BF16); });
  CHECK(e.find("target") != std::string::npos && e.find("bf16") != std::string::npos);
  WeightView f8 = v;
  f8.dtype = DType::FP8_E4M3;
  e = error_of([&] { quantize_matrix(f8, DType::I8); });
  CHECK(e.find("source") != std::string::npos && e.find("fp8_e4m3") != std::string::npos);
  w[5] = NAN;
  e = error_of([&] { quantize_matrix(v, DType::I8); });
  CHECK(e.find("NaN") != std::string::npos);
  // Empty matrices are fine.
  const QuantizedMatrix q = quantize_matrix(f32_view(w, 0, 24), DType::I8);
  CHECK(q.data.empty() && q.rows == 0);
}

TEST(quantize_speed_27b_matrix) {
  if (!std::getenv("PE_QUANT_BENCH")) return;
  const int64_t rows = 17408, cols = 5120;
  std::vector<uint16_t> b(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(static_cast<float>((i * 7919) % 2001) * 1e-5f - 0.01f);
  WeightView src;
  src.dtype = DType::BF16;
  src.rows = rows;
  src.cols = cols;
  src.data = b.data();
  for (DType t : {DType::I8, DType::FP8_E4M3, DType::NVFP4}) {
    const auto t0 = std::chrono::steady_clock::now();
    const QuantizedMatrix q = quantize_matrix(src, t);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  quantize %s %lldx%lld bf16: %.3f s (%.0f M weights/s, %d threads)\n", dtype_name(t),
                (long long)rows, (long long)cols, s, rows * cols / s / 1e6, num_threads());
    CHECK(!q.data.empty());
  }
}
