// Row norms (rms_norm plain/offset, rms_norm_gated, l2_norm) and element-wise ops (swiglu, add)
// against double references; in-place (aliased) calls give the same result.
#include <cmath>
#include <vector>

#include "check.h"
#include "kernels/ops.h"

using namespace pe;

namespace {

double silu_d(double x) { return x / (1.0 + std::exp(-x)); }

std::vector<double> ref_rms(const std::vector<float>& x, const std::vector<float>& w, int64_t rows,
                            int64_t dim, double eps, bool offset, const float* z) {
  std::vector<double> y(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(x[r * dim + j]) * x[r * dim + j];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t j = 0; j < dim; ++j) {
      double v = x[r * dim + j] * inv * (offset ? 1.0 + w[j] : w[j]);
      if (z) v *= silu_d(z[r * dim + j]);
      y[r * dim + j] = v;
    }
  }
  return y;
}

}  // namespace

TEST(rms_norm_simple) {
  // x = [3, 4]: mean(x^2) = 12.5; eps 0 -> x / sqrt(12.5). Offset w = 0 means scale 1.
  const float x[2] = {3, 4}, w0[2] = {0, 0}, w1[2] = {1, 2};
  float y[2];
  cpu::rms_norm(x, w0, 1, 2, 0.0f, true, y);
  CHECK_NEAR(y[0], 3 / std::sqrt(12.5), 1e-6);
  CHECK_NEAR(y[1], 4 / std::sqrt(12.5), 1e-6);
  cpu::rms_norm(x, w1, 1, 2, 0.0f, false, y);
  CHECK_NEAR(y[1], 8 / std::sqrt(12.5), 1e-6);
}

TEST(rms_norm_random) {
  pe_test::Rng rng(1);
  for (int64_t rows : {1, 3, 17, 130})
    for (int64_t dim : {1, 7, 64, 130, 1000})
      for (bool offset : {false, true}) {
        const auto x = rng.normals(rows * dim, 2.0f);
        const auto w = rng.normals(dim, 0.3f);
        std::vector<float> y(rows * dim);
        cpu::rms_norm(x.data(), w.data(), rows, dim, 1e-6f, offset, y.data());
        const auto ref = ref_rms(x, w, rows, dim, 1e-6, offset, nullptr);
        CHECK_CLOSE(y.data(), ref.data(), rows * dim, 1e-6);
        std::vector<float> inplace = x;
        cpu::rms_norm(inplace.data(), w.data(), rows, dim, 1e-6f, offset, inplace.data());
        CHECK(inplace == y);
      }
}

TEST(rms_norm_gated_random) {
  pe_test::Rng rng(2);
  for (int64_t rows : {1, 5, 63, 200})
    for (int64_t dim : {3, 32, 128}) {
      const auto x = rng.normals(rows * dim);
      const auto z = rng.normals(rows * dim, 3.0f);
      const auto w = rng.normals(dim);
      std::vector<float> y(rows * dim);
      cpu::rms_norm_gated(x.data(), z.data(), w.data(), rows, dim, 1e-6f, y.data());
      const auto ref = ref_rms(x, w, rows, dim, 1e-6, false, z.data());
      CHECK_CLOSE(y.data(), ref.data(), rows * dim, 1e-6);
      std::vector<float> inplace = x;
      cpu::rms_norm_gated(inplace.data(), z.data(), w.data(), rows, dim, 1e-6f, inplace.data());
      CHECK(inplace == y);
    }
}

TEST(l2_norm_random) {
  float simple[2] = {3, 4};
  cpu::l2_norm(simple, 1, 2, 0.0f, 2.0f);
  CHECK_NEAR(simple[0], 1.2, 1e-6);
  CHECK_NEAR(simple[1], 1.6, 1e-6);
  pe_test::Rng rng(3);
  for (int64_t rows : {1, 17, 130})
    for (int64_t dim : {1, 5, 128}) {
      auto x = rng.normals(rows * dim);
      std::vector<double> ref(rows * dim);
      const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0.0;
        for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(x[r * dim + j]) * x[r * dim + j];
        for (int64_t j = 0; j < dim; ++j) ref[r * dim + j] = x[r * dim + j] / std::sqrt(ss + 1e-6) * scale;
      }
      cpu::l2_norm(x.data(), rows, dim, 1e-6f, static_cast<float>(scale));
      CHECK_CLOSE(x.data(), ref.data(), rows * dim, 1e-6);
    }
}

TEST(swiglu_random) {
  const float gu[4] = {0, 1, 2, 3};  // gate [0, 1], up [2, 3]
  float o[2];
  cpu::swiglu(gu, 1, 2, o);
  CHECK_EQ(o[0], 0.0f);
  CHECK_NEAR(o[1], 3 * silu_d(1), 1e-6);
  pe_test::Rng rng(4);
  for (int64_t n : {1, 3, 65})
    for (int64_t I : {1, 17, 5000}) {
      const auto x = rng.normals(n * 2 * I, 4.0f);
      std::vector<float> out(n * I);
      std::vector<double> ref(n * I);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < I; ++j)
          ref[t * I + j] = silu_d(x[t * 2 * I + j]) * x[t * 2 * I + I + j];
      cpu::swiglu(x.data(), n, I, out.data());
      CHECK_CLOSE(out.data(), ref.data(), n * I, 1e-6);
    }
}

TEST(add_random) {
  pe_test::Rng rng(5);
  for (int64_t n : {1, 17, 16384, 100001}) {
    const auto a = rng.normals(n), b = rng.normals(n);
    std::vector<float> out(n), want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
    cpu::add(a.data(), b.data(), n, out.data());
    CHECK(out == want);
    std::vector<float> inplace = a;
    cpu::add(inplace.data(), b.data(), n, inplace.data());
    CHECK(inplace == want);
  }
}
