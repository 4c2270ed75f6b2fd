// CUDA GDN ops against the CPU twins: conv1d_causal (pieces at positions that wrap its ring),
// gdn_gates, gdn_recurrent and gdn_chunked (GQA 2 and 3, dk != dv, strided q/k/v slices of the
// conv output, state carried between calls), the test checkpoints' and the 27B head shapes.
#include <cmath>
#include <vector>

#include "kernels/ops.h"
#include "test_cuda_util.h"

using namespace pe;
using cpu::GdnArgs;
using cpu::PagedKV;
using pe_test::DevBuf;

namespace {

struct GdnShape {
  int64_t hk, hv, dk, dv;
};

// Random q, k (l2-normed, q scaled), v, gates of realistic range; CPU and GPU copies.
struct GdnInputs {
  int64_t n, qk_stride, v_stride;
  std::vector<float> q, k, v, g, beta, state;
};

GdnInputs make_inputs(const GdnShape& s, int64_t n, pe_test::Rng& rng) {
  GdnInputs in;
  in.n = n;
  in.qk_stride = s.hk * s.dk + 3;
  in.v_stride = s.hv * s.dv + 5;
  in.q = rng.normals(n * in.qk_stride);
  in.k = rng.normals(n * in.qk_stride);
  in.v = rng.normals(n * in.v_stride);
  for (int64_t t = 0; t < n; ++t) {
    cpu::l2_norm(in.q.data() + t * in.qk_stride, s.hk, s.dk, 1e-6f, 1.0f / std::sqrt((float)s.dk));
    cpu::l2_norm(in.k.data() + t * in.qk_stride, s.hk, s.dk, 1e-6f, 1.0f);
  }
  in.g.resize(n * s.hv);
  in.beta.resize(n * s.hv);
  const std::vector<float> a = rng.normals(n * s.hv, 2.0f), b = rng.normals(n * s.hv, 2.0f);
  const std::vector<float> A_log = rng.uniforms(s.hv, -2.0f, 1.0f), dt = rng.normals(s.hv);
  cpu::gdn_gates(a.data(), b.data(), s.hv, n, s.hv, A_log.data(), dt.data(), in.g.data(), in.beta.data());
  in.state = rng.normals(s.hv * s.dk * s.dv, 0.3f);
  return in;
}

// chunked: gdn_chunked instead of gdn_recurrent; scratch_chunks > 0 passes a scratch that holds
// that many chunks (several segments per call), 0 takes the convenience form.
void check_gdn(const GdnShape& s, int64_t n, bool chunked, uint64_t seed, int64_t chunk = 64,
               int64_t scratch_chunks = 0) {
  pe_test::Rng rng(seed);
  GdnInputs in = make_inputs(s, n, rng);
  DevBuf<float> q(in.q), k(in.k), v(in.v), g(in.g), beta(in.beta), st(in.state), out(n * s.hv * s.dv);
  const size_t scratch_bytes = cuda::gdn_chunked_scratch_bytes(scratch_chunks * chunk, s.hv, chunk);
  DevBuf<uint8_t> scratch(scratch_bytes);
  std::vector<float> ref(n * s.hv * s.dv), ref_state = in.state;
  GdnArgs c{in.q.data(), in.k.data(), in.qk_stride, in.v.data(), in.v_stride, in.g.data(),
            in.beta.data(), n, s.hk, s.hv, s.dk, s.dv, ref_state.data(), ref.data()};
  GdnArgs d{q.p, k.p, in.qk_stride, v.p, in.v_stride, g.p, beta.p, n, s.hk, s.hv, s.dk, s.dv, st.p, out.p};
  // Two calls, the state carried: the first half, then the rest.
  const int64_t n1 = n / 2;
  for (int part = 0; part < 2; ++part) {
    const int64_t t0 = part ? n1 : 0, len = part ? n - n1 : n1;
    if (len == 0) continue;
    GdnArgs cc = c, dd = d;
    cc.q += t0 * in.qk_stride; cc.k += t0 * in.qk_stride; cc.v += t0 * in.v_stride;
    cc.g += t0 * s.hv; cc.beta += t0 * s.hv; cc.out += t0 * s.hv * s.dv; cc.n = len;
    dd.q += t0 * in.qk_stride; dd.k += t0 * in.qk_stride; dd.v += t0 * in.v_stride;
    dd.g += t0 * s.hv; dd.beta += t0 * s.hv; dd.out += t0 * s.hv * s.dv; dd.n = len;
    cpu::gdn_recurrent(cc);
    if (!chunked) cuda::gdn_recurrent(dd, nullptr);
    else if (scratch_chunks > 0) cuda::gdn_chunked(dd, scratch.p, scratch_bytes, nullptr, chunk);
    else cuda::gdn_chunked(dd, nullptr, chunk);
  }
  std::string cfg = cfgs("Hk%lld Hv%lld dk%lld dv%lld n=%lld", (long long)s.hk, (long long)s.hv,
                         (long long)s.dk, (long long)s.dv, (long long)n);
  if (chunked && (chunk != 64 || scratch_chunks > 0))
    cfg += cfgs(" C%lld scr%lld", (long long)chunk, (long long)scratch_chunks);
  const char* op = chunked ? "gdn_chunked" : "gdn_recurrent";
  EXPECT_CLOSE(op, cfg, out.download(), ref, chunked ? 1e-4 : 1e-5);
  EXPECT_CLOSE(op, cfg + " state", st.download(), ref_state, chunked ? 1e-4 : 1e-5);
}

const GdnShape kShapes[] = {{2, 4, 16, 16}, {2, 6, 20, 24}, {2, 4, 24, 32}, {1, 3, 64, 40}};

}  // namespace

TEST(cuda_gdn_recurrent) {
  const bool small = small_only();
  for (const GdnShape& s : kShapes)
    for (int64_t n : {1, 3, 17, 63, 65, 200}) {
      if (small && n > 65) continue;
      check_gdn(s, n, false, 40 + n);
    }
  if (!small) check_gdn({16, 48, 128, 128}, 2, false, 3);
}

TEST(cuda_gdn_chunked) {
  const bool small = small_only();
  const GdnShape shapes[] = {kShapes[0], kShapes[1], kShapes[2], kShapes[3],
                             {2, 4, 32, 32}, {2, 2, 64, 64}, {2, 2, 128, 128}};
  for (const GdnShape& s : shapes)
    for (int64_t n : {1, 2, 3, 17, 63, 64, 65, 128, 129, 200, 1000}) {
      if (small && n > 65) continue;
      check_gdn(s, n, true, 50 + n);
    }
  // Segments: a scratch of 1 or 3 chunks (many launches, state carried), and chunks of 16 / 37.
  check_gdn({2, 4, 32, 32}, 300, true, 5, 64, 1);
  check_gdn({2, 6, 20, 24}, 300, true, 6, 16, 3);
  check_gdn({2, 4, 64, 64}, small ? 65 : 1000, true, 7, 37, 2);
  // The 27B heads; at 4100 tokens the segments of 32 chunks and the last partial chunk.
  check_gdn({16, 48, 128, 128}, small ? 17 : 300, true, 4);
  if (!small) check_gdn({16, 48, 128, 128}, 4100, true, 8);
}

TEST(cuda_conv1d) {
  // A piece of n rows at a random position of a random ring, then pieces of 1 and K + 1 rows
  // after it with the ring carried (pieces with n < K and n >= K; positions that wrap the ring).
  pe_test::Rng rng(1);
  for (int64_t K : {1, 2, 4, 6})
    for (int64_t C : {1, 3, 65, 130, 10240})
      for (int64_t n : {1, 3, 17, 63, 65, 1000}) {
        if (C * n > 2000000 || (small_only() && n > 65)) continue;
        const int64_t stride = C + 5, pieces[3] = {n, 1, K + 1}, rows = n + K + 2;
        const auto u = rng.normals(rows * stride);
        const auto w = rng.normals(C * K, 0.5f);
        const auto state0 = rng.normals(K * C);
        const int64_t pos0 = rng.below(3 * K + 1);
        std::vector<float> st = state0, ref(rows * C);
        DevBuf<float> du(u), dw(w), dst(state0), dout(rows * C);
        for (int64_t i = 0, r = 0; i < 3; r += pieces[i++]) {
          cpu::conv1d_causal(u.data() + r * stride, pieces[i], stride, C, w.data(), K, pos0 + r, st.data(),
                             ref.data() + r * C);
          cuda::conv1d_causal(du.p + r * stride, pieces[i], stride, C, dw.p, K, pos0 + r, dst.p, dout.p + r * C,
                              nullptr);
        }
        const std::string cfg = cfgs("K%lld C%lld n=%lld pos %lld", (long long)K, (long long)C, (long long)n,
                                     (long long)pos0);
        EXPECT_CLOSE("conv1d", cfg, dout.download(), ref, 1e-5);
        EXPECT_CLOSE("conv1d", cfg + " state", dst.download(), st, 0.0);
      }
}

TEST(cuda_gdn_gates) {
  pe_test::Rng rng(2);
  for (int64_t H : {4, 6, 48})
    for (int64_t n : {1, 17, 1000}) {
      const int64_t stride = H + 3;
      const auto a = rng.normals(n * stride, 8.0f), b = rng.normals(n * stride, 3.0f);
      const auto A_log = rng.normals(H), dt = rng.normals(H);
      std::vector<float> g(n * H), beta(n * H);
      cpu::gdn_gates(a.data(), b.data(), stride, n, H, A_log.data(), dt.data(), g.data(), beta.data());
      DevBuf<float> da(a), db(b), dA(A_log), ddt(dt), dg(n * H), dbeta(n * H);
      cuda::gdn_gates(da.p, db.p, stride, n, H, dA.p, ddt.p, dg.p, dbeta.p, nullptr);
      const std::string cfg = cfgs("H%lld n=%lld", (long long)H, (long long)n);
      EXPECT_CLOSE("gdn_gates g", cfg, dg.download(), g, 1e-5);
      EXPECT_CLOSE("gdn_gates beta", cfg, dbeta.download(), beta, 1e-5);
    }
}
