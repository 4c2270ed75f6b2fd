// GDN ops: conv1d_causal (prefill == steps, state carried), gdn_gates, gdn_recurrent against a
// naive double reference, and gdn_chunked against gdn_recurrent (awkward lengths, GQA 2 and 3,
// dk != dv, strided q/k/v as they come out of the conv, state carried between calls).
#include <cmath>
#include <vector>

#include "check.h"
#include "kernels/ops.h"

using namespace pe;

TEST(conv1d_simple) {
  // One channel, K = 3, w = [1, 2, 3], state = [10, 20]; u = [1]: 1*10 + 2*20 + 3*1 = 53.
  float state[2] = {10, 20};
  const float w[3] = {1, 2, 3}, u[1] = {1};
  float out[1];
  cpu::conv1d_causal(u, 1, 1, 1, w, 3, state, out);
  CHECK_NEAR(out[0], 53.0 / (1.0 + std::exp(-53.0)), 1e-4);
  CHECK_EQ(state[0], 20.0f);
  CHECK_EQ(state[1], 1.0f);
}

TEST(conv1d_prefill_equals_steps) {
  pe_test::Rng rng(1);
  for (int64_t K : {2, 4})
    for (int64_t C : {1, 3, 65, 130})
      for (int64_t n : {1, 2, 3, 17, 63}) {
        const int64_t stride = C + 5;  // u is a slice of a wider row
        const auto u = rng.normals(n * stride);
        const auto w = rng.normals(C * K, 0.5f);
        const auto state0 = rng.normals((K - 1) * C);
        // Naive reference over x = [state0; u].
        std::vector<double> ref(n * C);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t c = 0; c < C; ++c) {
            double s = 0.0;
            for (int64_t j = 0; j < K; ++j) {
              const int64_t r = t + j;
              const double xv = r < K - 1 ? state0[r * C + c] : u[(r - (K - 1)) * stride + c];
              s += w[c * K + j] * xv;
            }
            ref[t * C + c] = s / (1.0 + std::exp(-s));
          }
        std::vector<float> st_a = state0, out_a(n * C);
        cpu::conv1d_causal(u.data(), n, stride, C, w.data(), K, st_a.data(), out_a.data());
        CHECK_CLOSE(out_a.data(), ref.data(), n * C, 1e-6);
        // n single steps with the state carried give the same bits.
        std::vector<float> st_b = state0, out_b(n * C);
        for (int64_t t = 0; t < n; ++t)
          cpu::conv1d_causal(u.data() + t * stride, 1, stride, C, w.data(), K, st_b.data(),
                             out_b.data() + t * C);
        CHECK(out_a == out_b);
        CHECK(st_a == st_b);
        // The state holds the last K-1 raw rows of [state0; u].
        int bad = 0;
        for (int64_t r = 0; r < K - 1; ++r)
          for (int64_t c = 0; c < C; ++c) {
            const int64_t src = n + r;
            const float want = src < K - 1 ? state0[src * C + c] : u[(src - (K - 1)) * stride + c];
            bad += st_a[r * C + c] != want;
          }
        CHECK_EQ(bad, 0);
      }
}

TEST(gdn_gates_values) {
  pe_test::Rng rng(2);
  const int64_t n = 17, H = 6, stride = 13;
  const auto a = rng.normals(n * stride, 8.0f), b = rng.normals(n * stride, 3.0f);
  const auto A_log = rng.normals(H), dt = rng.normals(H);
  std::vector<float> g(n * H), beta(n * H);
  std::vector<double> rg(n * H), rb(n * H);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const double x = static_cast<double>(a[t * stride + h]) + dt[h];
      rg[t * H + h] = -std::exp(static_cast<double>(A_log[h])) * std::log1p(std::exp(x));
      rb[t * H + h] = 1.0 / (1.0 + std::exp(-static_cast<double>(b[t * stride + h])));
    }
  cpu::gdn_gates(a.data(), b.data(), stride, n, H, A_log.data(), dt.data(), g.data(), beta.data());
  CHECK_CLOSE(g.data(), rg.data(), n * H, 1e-6);
  CHECK_CLOSE(beta.data(), rb.data(), n * H, 1e-6);
  int positive = 0;
  for (float x : g) positive += x > 0.0f;
  CHECK_EQ(positive, 0);
}

namespace {

// Inputs laid out like the conv output of a GDN layer: each token row is q | k | v | padding.
struct GdnInputs {
  int64_t n, Hk, Hv, dk, dv, row;
  std::vector<float> y, g, beta, state0;
};

GdnInputs make_inputs(int64_t n, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, uint64_t seed) {
  pe_test::Rng rng(seed);
  GdnInputs in{n, Hk, Hv, dk, dv, 2 * Hk * dk + Hv * dv + 3, {}, {}, {}, {}};
  in.y = rng.normals(n * in.row);
  for (int64_t t = 0; t < n; ++t)  // l2-normalize q (and scale it) and k, as the layer does
    for (int64_t part = 0; part < 2; ++part)
      cpu::l2_norm(in.y.data() + t * in.row + part * Hk * dk, Hk, dk, 1e-6f,
                   part == 0 ? 1.0f / std::sqrt(static_cast<float>(dk)) : 1.0f);
  in.g = rng.uniforms(n * Hv, -0.3f, 0.0f);
  in.beta = rng.uniforms(n * Hv, 0.0f, 1.0f);
  in.state0 = rng.normals(Hv * dk * dv, 0.5f);
  return in;
}

cpu::GdnArgs args_for(GdnInputs& in, int64_t t0, int64_t n, float* state, float* out) {
  cpu::GdnArgs a;
  a.q = in.y.data() + t0 * in.row;
  a.k = a.q + in.Hk * in.dk;
  a.qk_stride = in.row;
  a.v = a.q + 2 * in.Hk * in.dk;
  a.v_stride = in.row;
  a.g = in.g.data() + t0 * in.Hv;
  a.beta = in.beta.data() + t0 * in.Hv;
  a.n = n;
  a.Hk = in.Hk;
  a.Hv = in.Hv;
  a.dk = in.dk;
  a.dv = in.dv;
  a.state = state;
  a.out = out + t0 * in.Hv * in.dv;
  return a;
}

}  // namespace

TEST(gdn_recurrent_vs_naive) {
  for (auto shape : {std::vector<int64_t>{1, 1, 4, 4}, {2, 6, 16, 24}, {3, 6, 8, 5}})
    for (int64_t n : {1, 3, 17}) {
      const int64_t Hk = shape[0], Hv = shape[1], dk = shape[2], dv = shape[3];
      GdnInputs in = make_inputs(n, Hk, Hv, dk, dv, 10 + n);
      std::vector<float> state = in.state0, out(n * Hv * dv);
      cpu::gdn_recurrent(args_for(in, 0, n, state.data(), out.data()));

      std::vector<double> S(in.state0.begin(), in.state0.end()), ref(n * Hv * dv);
      for (int64_t h = 0; h < Hv; ++h) {
        double* Sh = S.data() + h * dk * dv;
        const int64_t kh = h / (Hv / Hk);
        for (int64_t t = 0; t < n; ++t) {
          const float* q = in.y.data() + t * in.row + kh * dk;
          const float* k = q + Hk * dk;
          const float* v = in.y.data() + t * in.row + 2 * Hk * dk + h * dv;
          const double decay = std::exp(static_cast<double>(in.g[t * Hv + h]));
          const double beta = in.beta[t * Hv + h];
          for (int64_t i = 0; i < dk * dv; ++i) Sh[i] *= decay;
          for (int64_t j = 0; j < dv; ++j) {
            double kv = 0.0;
            for (int64_t i = 0; i < dk; ++i) kv += Sh[i * dv + j] * k[i];
            const double delta = beta * (v[j] - kv);
            for (int64_t i = 0; i < dk; ++i) Sh[i * dv + j] += k[i] * delta;
            double o = 0.0;
            for (int64_t i = 0; i < dk; ++i) o += Sh[i * dv + j] * q[i];
            ref[(t * Hv + h) * dv + j] = o;
          }
        }
      }
      CHECK_CLOSE(out.data(), ref.data(), n * Hv * dv, 1e-5);
      CHECK_CLOSE(state.data(), S.data(), Hv * dk * dv, 1e-5);
    }
}

TEST(gdn_chunked_vs_recurrent) {
  for (auto shape : {std::vector<int64_t>{2, 4, 32, 32}, {1, 3, 16, 24}, {2, 6, 24, 16}})
    for (int64_t n : {1, 63, 64, 65, 130, 200}) {
      const int64_t Hv = shape[1], dk = shape[2], dv = shape[3];
      GdnInputs in = make_inputs(n, shape[0], Hv, dk, dv, 20 + n);
      std::vector<float> st_r = in.state0, out_r(n * Hv * dv);
      cpu::gdn_recurrent(args_for(in, 0, n, st_r.data(), out_r.data()));
      std::vector<float> st_c = in.state0, out_c(n * Hv * dv);
      cpu::gdn_chunked(args_for(in, 0, n, st_c.data(), out_c.data()));
      CHECK_CLOSE(out_c.data(), out_r.data(), n * Hv * dv, 1e-5);
      CHECK_CLOSE(st_c.data(), st_r.data(), Hv * dk * dv, 1e-5);
      // Two chunked calls with the state carried (split off the chunk grid), and a small chunk.
      const int64_t n1 = n / 3;
      std::vector<float> st_s = in.state0, out_s(n * Hv * dv);
      cpu::gdn_chunked(args_for(in, 0, n1, st_s.data(), out_s.data()));
      cpu::gdn_chunked(args_for(in, n1, n - n1, st_s.data(), out_s.data()), 16);
      CHECK_CLOSE(out_s.data(), out_r.data(), n * Hv * dv, 1e-5);
      CHECK_CLOSE(st_s.data(), st_r.data(), Hv * dk * dv, 1e-5);
    }
}

TEST(gdn_padding_tokens_keep_state) {
  // beta = 0 and g = 0 make a token a no-op on the state, in both forms.
  GdnInputs in = make_inputs(70, 1, 2, 8, 8, 30);
  std::fill(in.g.begin(), in.g.end(), 0.0f);
  std::fill(in.beta.begin(), in.beta.end(), 0.0f);
  std::vector<float> st = in.state0, out(70 * 2 * 8);
  cpu::gdn_chunked(args_for(in, 0, 70, st.data(), out.data()));
  CHECK_CLOSE(st.data(), in.state0.data(), 2 * 8 * 8, 1e-7);
  st = in.state0;
  cpu::gdn_recurrent(args_for(in, 0, 70, st.data(), out.data()));
  CHECK(st == in.state0);
}
