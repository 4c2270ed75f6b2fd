// GDN ops: conv1d_causal against the conv over the whole input history (steps, pieces and a
// prefill give the same bits and ring), gdn_gates, gdn_recurrent against a naive double
// reference, and gdn_chunked against gdn_recurrent (awkward lengths, GQA 2 and 3, dk != dv,
// strided q/k/v as they come out of the conv, state carried between calls).
#include <algorithm>
#include <cmath>
#include <vector>

#include "check.h"
#include "kernels/ops.h"

using namespace pe;

TEST(conv1d_simple) {
  // One channel, K = 3, w = [1, 2, 3], u = [1] at position 5: the ring rows of positions 3 and 4
  // (rows 0 and 1: 10, 20) and u: 1*10 + 2*20 + 3*1 = 53. Row 2 (position 2) takes u.
  float state[3] = {10, 20, 99};
  const float w[3] = {1, 2, 3}, u[1] = {1};
  float out[1];
  cpu::conv1d_causal(u, 1, 1, 1, w, 3, 5, state, out);
  CHECK_NEAR(out[0], 53.0 / (1.0 + std::exp(-53.0)), 1e-4);
  CHECK_EQ(state[0], 10.0f);
  CHECK_EQ(state[1], 20.0f);
  CHECK_EQ(state[2], 1.0f);
}

namespace {

// Naive reference: the conv at position p over a sequence's whole raw input history X (row q =
// input of position q, C channels; positions < 0 are zeros), in double.
double naive_conv(const std::vector<float>& X, int64_t C, const std::vector<float>& w, int64_t K, int64_t p,
                  int64_t c) {
  double s = 0.0;
  for (int64_t j = 0; j < K; ++j) {
    const int64_t q = p - (K - 1) + j;
    if (q >= 0) s += static_cast<double>(w[c * K + j]) * X[q * C + c];
  }
  return s / (1.0 + std::exp(-s));
}

// The ring of a sequence whose inputs 0 .. len - 1 are X's first rows: row q % K = X[q] for the
// last min(len, K) of them, the other rows still zero (never written).
std::vector<float> ring_of(const std::vector<float>& X, int64_t C, int64_t K, int64_t len) {
  std::vector<float> ring(K * C, 0.0f);
  for (int64_t q = std::max<int64_t>(0, len - K); q < len; ++q)
    std::copy(X.begin() + q * C, X.begin() + (q + 1) * C, ring.begin() + q % K * C);
  return ring;
}

}  // namespace

TEST(conv1d_pieces_equal_full_history) {
  // One sequence of 5K + 7 positions (the ring wraps 5+ times) fed from a zeroed ring in three
  // ways: single steps, pieces of mixed sizes (n < K and n >= K), one prefill. The outputs
  // against the naive conv over the history, the ring after every piece exactly, and the three
  // ways bit for bit.
  pe_test::Rng rng(1);
  for (int64_t K : {1, 2, 4, 6})
    for (int64_t C : {1, 3, 65, 130}) {
      const int64_t P = 5 * K + 7, stride = C + 5;  // u is a slice of a wider row
      const auto X = rng.normals(P * C);
      const auto w = rng.normals(C * K, 0.5f);
      const std::vector<int64_t> mixed = {1, K + 1, 2, K, std::max<int64_t>(K - 1, 1), 2 * K + 3, 1};
      std::vector<double> ref(P * C);
      for (int64_t p = 0; p < P; ++p)
        for (int64_t c = 0; c < C; ++c) ref[p * C + c] = naive_conv(X, C, w, K, p, c);
      std::vector<std::vector<float>> outs, rings;
      for (int plan = 0; plan < 3; ++plan) {
        std::vector<float> ring(K * C, 0.0f), out(P * C, NAN);
        int64_t p0 = 0;
        for (size_t i = 0; p0 < P; ++i) {
          const int64_t want_n = plan == 0 ? 1 : plan == 1 ? mixed[i % mixed.size()] : P;
          const int64_t n = std::min(want_n, P - p0);
          std::vector<float> u(n * stride, NAN);
          for (int64_t t = 0; t < n; ++t)
            std::copy(X.begin() + (p0 + t) * C, X.begin() + (p0 + t + 1) * C, u.begin() + t * stride);
          cpu::conv1d_causal(u.data(), n, stride, C, w.data(), K, p0, ring.data(), out.data() + p0 * C);
          p0 += n;
          CHECK(ring == ring_of(X, C, K, p0));
        }
        CHECK_CLOSE(out.data(), ref.data(), P * C, 1e-6);
        outs.push_back(out);
        rings.push_back(ring);
      }
      CHECK(outs[1] == outs[0]);
      CHECK(outs[2] == outs[0]);
      CHECK(rings[1] == rings[0] && rings[2] == rings[0]);
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
