// Row norms (rms_norm plain/offset, rms_norm_gated, l2_norm, add_rms_norm), the attention inputs
// (head norms + RoPE) and element-wise ops (swiglu, add) against double references; in-place
// (aliased) calls give the same result.
#include <algorithm>
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

TEST(rms_norm_gated_strided_z) {
  // z read in place from a wider row (a projection's z part): groups of `heads` rows, tokens
  // `stride` floats apart, the same bits as the dense copy.
  pe_test::Rng rng(3);
  const int64_t heads = 3, dim = 32, stride = heads * dim + 17;
  for (int64_t tokens : {1, 4, 9}) {
    const int64_t rows = tokens * heads;
    const auto x = rng.normals(rows * dim), zs = rng.normals(tokens * stride, 3.0f), w = rng.normals(dim);
    std::vector<float> z(rows * dim), dense(rows * dim), strided(rows * dim);
    for (int64_t t = 0; t < tokens; ++t)
      std::copy(zs.begin() + t * stride, zs.begin() + t * stride + heads * dim, z.begin() + t * heads * dim);
    cpu::rms_norm_gated(x.data(), z.data(), w.data(), rows, dim, 1e-6f, dense.data());
    cpu::rms_norm_gated(x.data(), zs.data(), w.data(), rows, dim, 1e-6f, strided.data(), heads, stride);
    CHECK(strided == dense);
  }
}

TEST(norms_with_mean_square_near_eps) {
  // Rows whose mean(x^2) (sum(x^2) for l2_norm) is about eps = 1e-6: leaving eps out, or using
  // the sum where the mean belongs, changes the result by tens of percent, far past 1e-6. Rows
  // scaled 0.3x .. 3x around it; one row of zeros gives zeros (eps keeps it finite).
  pe_test::Rng rng(8);
  const double eps = 1e-6;
  for (int64_t dim : {1, 7, 64, 130}) {
    const int64_t rows = 9;
    std::vector<float> x(rows * dim), z = rng.normals(rows * dim, 3.0f), w = rng.normals(dim, 0.3f);
    for (int64_t r = 0; r < rows; ++r) {
      const float scale = 1e-3f * (r == 0 ? 0.0f : 0.3f * static_cast<float>(r) / 2.0f);
      for (int64_t j = 0; j < dim; ++j) x[r * dim + j] = rng.normal() * scale;
    }
    for (bool offset : {false, true}) {
      std::vector<float> y(rows * dim);
      cpu::rms_norm(x.data(), w.data(), rows, dim, static_cast<float>(eps), offset, y.data());
      const auto ref = ref_rms(x, w, rows, dim, eps, offset, nullptr);
      CHECK_CLOSE(y.data(), ref.data(), rows * dim, 1e-6);
      // add_rms_norm: x + r near eps too (r = -x / 2).
      std::vector<float> sum = x, half(rows * dim), y2(rows * dim);
      for (int64_t i = 0; i < rows * dim; ++i) half[i] = -0.5f * x[i];
      cpu::add_rms_norm(sum.data(), half.data(), w.data(), rows, dim, static_cast<float>(eps), offset, y2.data());
      const auto ref2 = ref_rms(sum, w, rows, dim, eps, offset, nullptr);
      CHECK_CLOSE(y2.data(), ref2.data(), rows * dim, 1e-6);
    }
    std::vector<float> yg(rows * dim);
    cpu::rms_norm_gated(x.data(), z.data(), w.data(), rows, dim, static_cast<float>(eps), yg.data());
    const auto refg = ref_rms(x, w, rows, dim, eps, false, z.data());
    CHECK_CLOSE(yg.data(), refg.data(), rows * dim, 1e-6);
    // l2_norm: sum(x^2) near eps, so rows scaled down by sqrt(dim) more.
    std::vector<float> xl = x;
    for (auto& v : xl) v /= std::sqrt(static_cast<float>(dim));
    std::vector<double> refl(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0.0;
      for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(xl[r * dim + j]) * xl[r * dim + j];
      for (int64_t j = 0; j < dim; ++j) refl[r * dim + j] = xl[r * dim + j] / std::sqrt(ss + eps) * 0.5;
    }
    cpu::l2_norm(xl.data(), rows, dim, static_cast<float>(eps), 0.5f);
    CHECK_CLOSE(xl.data(), refl.data(), rows * dim, 1e-6);
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

TEST(add_rms_norm_random) {
  // Simple: x = [1, 2] + [2, 2] = [3, 4] -> x / sqrt(12.5), offset w = 0.
  float x0[2] = {1, 2};
  const float r0[2] = {2, 2}, w0[2] = {0, 0};
  float y0[2];
  cpu::add_rms_norm(x0, r0, w0, 1, 2, 0.0f, true, y0);
  CHECK_EQ(x0[0], 3.0f);
  CHECK_NEAR(y0[1], 4 / std::sqrt(12.5), 1e-6);
  pe_test::Rng rng(6);
  for (int64_t rows : {1, 3, 17})
    for (int64_t dim : {1, 7, 130, 5120})
      for (bool offset : {false, true}) {
        const auto x = rng.normals(rows * dim, 2.0f), r = rng.normals(rows * dim), w = rng.normals(dim, 0.3f);
        // The two ops it replaces, bit for bit.
        std::vector<float> want_x(rows * dim), want_y(rows * dim);
        cpu::add(x.data(), r.data(), rows * dim, want_x.data());
        cpu::rms_norm(want_x.data(), w.data(), rows, dim, 1e-6f, offset, want_y.data());
        std::vector<float> got_x = x, got_y(rows * dim);
        cpu::add_rms_norm(got_x.data(), r.data(), w.data(), rows, dim, 1e-6f, offset, got_y.data());
        CHECK(got_x == want_x);
        CHECK(got_y == want_y);
        std::vector<float> sum(rows * dim);
        for (int64_t i = 0; i < rows * dim; ++i) sum[i] = x[i] + r[i];
        const auto ref = ref_rms(sum, w, rows, dim, 1e-6, offset, nullptr);
        CHECK_CLOSE(got_y.data(), ref.data(), rows * dim, 1e-6);
      }
}

namespace {

// Double reference of rope_neox on one head row (the angle rounded to fp32 as the op does).
void ref_rope(std::vector<double>& a, int64_t rot_dim, int32_t pos, float theta) {
  const int64_t half = rot_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rot_dim);
    const float inv = 1.0f / static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
    const double ang = static_cast<double>(static_cast<float>(pos) * inv);
    const double x0 = a[i], x1 = a[i + half];
    a[i] = x0 * std::cos(ang) - x1 * std::sin(ang);
    a[i + half] = x1 * std::cos(ang) + x0 * std::sin(ang);
  }
}

}  // namespace

TEST(attention_inputs_random) {
  pe_test::Rng rng(7);
  struct Case { int64_t Hq, Hkv, D, rot; };
  for (const Case& c : {Case{1, 1, 4, 2}, Case{4, 2, 16, 8}, Case{6, 2, 64, 16}, Case{24, 4, 256, 64}})
    for (int64_t T : {1, 3, 9}) {
      const int64_t q_stride = c.Hq * 2 * c.D + 5, kv_stride = c.Hkv * c.D + 3;
      const auto qg = rng.normals(T * q_stride, 2.0f), k_in = rng.normals(T * kv_stride, 2.0f),
                 v_in = rng.normals(T * kv_stride), qw = rng.normals(c.D, 0.3f), kw = rng.normals(c.D, 0.3f);
      std::vector<int32_t> pos(T);
      for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(rng.below(5000));
      std::vector<float> q(T * c.Hq * c.D), gate(q.size()), k(T * c.Hkv * c.D), v(k.size());
      cpu::attention_inputs({qg.data(), q_stride, k_in.data(), kv_stride, v_in.data(), kv_stride, qw.data(), kw.data(),
                             pos.data(), T, c.Hq, c.Hkv, c.D, c.rot, 1e-6f, 1e6f, q.data(), gate.data(), k.data(),
                             v.data()});
      // Reference: per head, gather, double rms_norm (offset weights), double rope.
      std::vector<double> rq(q.size()), rk(k.size());
      auto head = [&](const float* src, const std::vector<float>& w, int32_t p, double* dst) {
        std::vector<float> row(src, src + c.D);
        const auto n = ref_rms(row, w, 1, c.D, 1e-6, true, nullptr);
        std::vector<double> a(n.begin(), n.end());
        ref_rope(a, c.rot, p, 1e6f);
        std::copy(a.begin(), a.end(), dst);
      };
      bool copies_ok = true;
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < c.Hq; ++h) {
          const float* row = &qg[t * q_stride + h * 2 * c.D];
          head(row, qw, pos[t], &rq[(t * c.Hq + h) * c.D]);
          copies_ok = copies_ok && std::equal(row + c.D, row + 2 * c.D, &gate[(t * c.Hq + h) * c.D]);
        }
        for (int64_t h = 0; h < c.Hkv; ++h) {
          head(&k_in[t * kv_stride + h * c.D], kw, pos[t], &rk[(t * c.Hkv + h) * c.D]);
          const float* vr = &v_in[t * kv_stride + h * c.D];
          copies_ok = copies_ok && std::equal(vr, vr + c.D, &v[(t * c.Hkv + h) * c.D]);
        }
      }
      CHECK(copies_ok);
      CHECK_CLOSE(q.data(), rq.data(), static_cast<int64_t>(q.size()), 1e-5);
      CHECK_CLOSE(k.data(), rk.data(), static_cast<int64_t>(k.size()), 1e-5);
      // In place on dense k and v: the same k, v untouched.
      std::vector<float> kd(k.size()), vd(v.size());
      for (int64_t t = 0; t < T; ++t) {
        std::copy_n(&k_in[t * kv_stride], c.Hkv * c.D, &kd[t * c.Hkv * c.D]);
        std::copy_n(&v_in[t * kv_stride], c.Hkv * c.D, &vd[t * c.Hkv * c.D]);
      }
      const std::vector<float> v_before = vd;
      cpu::attention_inputs({qg.data(), q_stride, kd.data(), c.Hkv * c.D, vd.data(), c.Hkv * c.D, qw.data(), kw.data(),
                             pos.data(), T, c.Hq, c.Hkv, c.D, c.rot, 1e-6f, 1e6f, q.data(), gate.data(), kd.data(),
                             vd.data()});
      CHECK(kd == k);
      CHECK(vd == v_before);
    }
}
