// CUDA row norms, RoPE and element-wise ops against the CPU twins on awkward sizes: per-token
// norms (hidden 111, 5120), per-head norms (head dims 16 .. 256), partial rotary (27B: 64 of 256
// dims, theta 1e7, positions up to 262K), swiglu, the residual add and add + norm fused.
#include <vector>

#include "kernels/ops.h"
#include "test_cuda_util.h"

using namespace pe;
using pe_test::DevBuf;

TEST(cuda_rms_norm) {
  pe_test::Rng rng(1);
  for (int64_t dim : {16, 111, 256, 1000, 5120})
    for (int64_t rows : {1, 3, 17, 65, 1000})
      for (int offset = 0; offset < 2; ++offset) {
        const auto x = rng.normals(rows * dim, 3.0f), w = rng.normals(dim, 0.5f);
        std::vector<float> ref(rows * dim);
        cpu::rms_norm(x.data(), w.data(), rows, dim, 1e-6f, offset != 0, ref.data());
        DevBuf<float> dx(x), dw(w), dout(rows * dim);
        cuda::rms_norm(dx.p, dw.p, rows, dim, 1e-6f, offset != 0, dout.p, nullptr);
        EXPECT_CLOSE("rms_norm", cfgs("dim=%lld rows=%lld offset=%d", (long long)dim, (long long)rows, offset),
                     dout.download(), ref, 1e-5);
        cuda::rms_norm(dx.p, dw.p, rows, dim, 1e-6f, offset != 0, dx.p, nullptr);  // in place
        EXPECT_CLOSE("rms_norm", "in place", dx.download(), ref, 1e-5);
      }
}

TEST(cuda_rms_norm_gated_and_l2) {
  pe_test::Rng rng(2);
  for (int64_t dim : {16, 24, 128, 2000})
    for (int64_t rows : {1, 3, 17, 63, 1000}) {
      const auto x = rng.normals(rows * dim, 2.0f), z = rng.normals(rows * dim, 2.0f),
                 w = rng.normals(dim, 0.5f);
      std::vector<float> ref(rows * dim);
      cpu::rms_norm_gated(x.data(), z.data(), w.data(), rows, dim, 1e-6f, ref.data());
      DevBuf<float> dx(x), dz(z), dw(w), dout(rows * dim);
      cuda::rms_norm_gated(dx.p, dz.p, dw.p, rows, dim, 1e-6f, dout.p, nullptr);
      const std::string cfg = cfgs("dim=%lld rows=%lld", (long long)dim, (long long)rows);
      EXPECT_CLOSE("rms_norm_gated", cfg, dout.download(), ref, 1e-5);
      std::vector<float> l2 = x;
      cpu::l2_norm(l2.data(), rows, dim, 1e-6f, 0.125f);
      cuda::l2_norm(dx.p, rows, dim, 1e-6f, 0.125f, nullptr);
      EXPECT_CLOSE("l2_norm", cfg, dx.download(), l2, 1e-5);
    }
}

TEST(cuda_rope_neox) {
  pe_test::Rng rng(3);
  struct Case { int64_t heads, hd, rot; float theta; int32_t max_pos; };
  for (const Case& c : {Case{3, 32, 32, 1e4f, 100}, Case{6, 64, 16, 1e6f, 5000},
                        Case{24, 256, 64, 1e7f, 262000}, Case{4, 256, 64, 1e7f, 70000}})
    for (int64_t n : {1, 3, 17, 65, 1000}) {
      const int64_t stride = c.heads * c.hd + 8;  // a slice of a wider row (q of q|gate)
      const auto x = rng.normals(n * stride);
      std::vector<int32_t> pos(n);
      for (auto& p : pos) p = static_cast<int32_t>(rng.below(c.max_pos));
      std::vector<float> ref = x;
      cpu::rope_neox(ref.data(), n, stride, c.heads, c.hd, c.rot, pos.data(), c.theta);
      DevBuf<float> dx(x);
      DevBuf<int32_t> dpos(pos);
      cuda::rope_neox(dx.p, n, stride, c.heads, c.hd, c.rot, dpos.p, c.theta, nullptr);
      EXPECT_CLOSE("rope_neox", cfgs("H%lld D%lld rot%lld n=%lld", (long long)c.heads, (long long)c.hd,
                                     (long long)c.rot, (long long)n),
                   dx.download(), ref, 1e-5);
    }
}

TEST(cuda_swiglu_add) {
  pe_test::Rng rng(4);
  for (int64_t I : {1, 111, 17408})
    for (int64_t n : {1, 3, 17, 65}) {
      const auto gu = rng.normals(n * 2 * I, 3.0f);
      std::vector<float> ref(n * I);
      cpu::swiglu(gu.data(), n, I, ref.data());
      DevBuf<float> dgu(gu), dout(n * I);
      cuda::swiglu(dgu.p, n, I, dout.p, nullptr);
      const std::string cfg = cfgs("I=%lld n=%lld", (long long)I, (long long)n);
      EXPECT_CLOSE("swiglu", cfg, dout.download(), ref, 1e-5);
      const auto a = rng.normals(n * I), b = rng.normals(n * I);
      std::vector<float> sum(n * I);
      cpu::add(a.data(), b.data(), n * I, sum.data());
      DevBuf<float> da(a), db(b);
      cuda::add(da.p, db.p, n * I, da.p, nullptr);  // out aliases a
      EXPECT_CLOSE("add", cfg, da.download(), sum, 0.0);
    }
}

TEST(cuda_add_rms_norm) {
  pe_test::Rng rng(5);
  for (int64_t dim : {16, 111, 1000, 1024, 1025, 5120})
    for (int64_t rows : {1, 3, 17, 65})
      for (int offset = 0; offset < 2; ++offset) {
        const auto x = rng.normals(rows * dim, 3.0f), r = rng.normals(rows * dim), w = rng.normals(dim, 0.5f);
        std::vector<float> ref_x = x, ref(rows * dim);
        cpu::add_rms_norm(ref_x.data(), r.data(), w.data(), rows, dim, 1e-6f, offset != 0, ref.data());
        DevBuf<float> dx(x), dr(r), dw(w), dout(rows * dim);
        cuda::add_rms_norm(dx.p, dr.p, dw.p, rows, dim, 1e-6f, offset != 0, dout.p, nullptr);
        const std::string cfg = cfgs("dim=%lld rows=%lld offset=%d", (long long)dim, (long long)rows, offset);
        EXPECT_CLOSE("add_rms_norm x", cfg, dx.download(), ref_x, 0.0);
        EXPECT_CLOSE("add_rms_norm", cfg, dout.download(), ref, 1e-5);
        // Bit-equal to the two launches it replaces.
        DevBuf<float> dx2(x), dout2(rows * dim);
        cuda::add(dx2.p, dr.p, rows * dim, dx2.p, nullptr);
        cuda::rms_norm(dx2.p, dw.p, rows, dim, 1e-6f, offset != 0, dout2.p, nullptr);
        EXPECT_CLOSE("add_rms_norm vs add + rms_norm", cfg, dout.download(), dout2.download(), 0.0);
      }
}
