// Chunked gated delta rule (WY / UT form), equal to gdn_recurrent in exact arithmetic.
//
// Per value head h and chunk of L <= C tokens (the last chunk is simply shorter; no padding),
// with K, Q [L, dk], V [L, dv] of the chunk, beta [L], gamma = cumsum(g) within the chunk:
//   A[i,j] = beta_i (k_i . k_j) e^{gamma_i - gamma_j}            (i > j, strictly lower)
//   T      = (I + A)^-1           unit lower triangular, by forward substitution row by row
//   U      = T (beta . V)         W = T (beta . e^gamma . K)
//   V'     = U - W S              (the delta-rule corrections of all L tokens at once)
//   O      = (e^gamma . Q) S + (M . Q K^T) V'     M[i,j] = e^{gamma_i - gamma_j}, j <= i
//   S     <- e^{gamma_L} S + (e^{gamma_L - gamma} . K)^T V'
// Exponents are only ever of non-positive differences (g <= 0), so nothing overflows.
// The chunk's K, Q, V are gathered into contiguous thread-local buffers; U, W, V', O and the state
// update are register-tiled small GEMMs. Parallel over value heads; chunks of one head in order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {
namespace {

struct ChunkBuffers {
  float *K, *Q, *W, *Kb, *V, *U, *A, *T, *gam, *bet, *kd;
};

ChunkBuffers chunk_buffers(int64_t C, int64_t dk, int64_t dv) {
  const size_t n = static_cast<size_t>(4 * C * dk + 2 * C * dv + 2 * C * C + 3 * C);
  float* p = scratch(0, n);
  ChunkBuffers b;
  b.K = p; p += C * dk;
  b.Q = p; p += C * dk;
  b.W = p; p += C * dk;
  b.Kb = p; p += C * dk;  // beta e^gamma K, later (e^{gamma_L - gamma} K)^T [dk, C]
  b.V = p; p += C * dv;
  b.U = p; p += C * dv;
  b.A = p; p += C * C;    // A, later the decayed causal scores M . Q K^T
  b.T = p; p += C * C;
  b.gam = p; p += C;
  b.bet = p; p += C;
  b.kd = p;
  return b;
}

// One chunk [t0, t0 + L) of value head h (key head kh); updates S [dk, dv] in place. The five
// products with S or over the chunk are small GEMMs (gemm_rows); A and Q K^T are row dots.
void run_chunk(const GdnArgs& a, int64_t h, int64_t kh, int64_t t0, int64_t L, int64_t C,
               const ChunkBuffers& b, float* S) {
  const int64_t dk = a.dk, dv = a.dv;
  auto rows = [](const float* base, int64_t ld) {
    return [base, ld](int64_t k) { return base + k * ld; };
  };
  float gsum = 0.0f;
  for (int64_t i = 0; i < L; ++i) {
    const int64_t t = t0 + i;
    std::memcpy(b.K + i * dk, a.k + t * a.qk_stride + kh * dk, dk * sizeof(float));
    std::memcpy(b.Q + i * dk, a.q + t * a.qk_stride + kh * dk, dk * sizeof(float));
    std::memcpy(b.V + i * dv, a.v + t * a.v_stride + h * dv, dv * sizeof(float));
    gsum += a.g[t * a.Hv + h];
    b.gam[i] = gsum;
    b.bet[i] = a.beta[t * a.Hv + h];
  }
  // A (strictly lower) and T = (I + A)^-1 by forward substitution: T[i] = e_i - sum_{m<i} A[i,m] T[m].
  for (int64_t i = 0; i < L; ++i) {
    float* Ai = b.A + i * C;
    for (int64_t j = 0; j < i; ++j)
      Ai[j] = b.bet[i] * std::exp(b.gam[i] - b.gam[j]) * dot(b.K + i * dk, b.K + j * dk, dk);
    float* Ti = b.T + i * C;
    std::fill(Ti, Ti + L, 0.0f);
    for (int64_t m = 0; m < i; ++m) axpy(-Ai[m], b.T + m * C, Ti, m + 1);
    Ti[i] = 1.0f;
  }
  // U = T (beta V), W = T (beta e^gamma K). V is scaled in place (the raw V is not needed again).
  for (int64_t i = 0; i < L; ++i) {
    const float bk = b.bet[i] * std::exp(b.gam[i]);
    for (int64_t x = 0; x < dv; ++x) b.V[i * dv + x] *= b.bet[i];
    for (int64_t x = 0; x < dk; ++x) b.Kb[i * dk + x] = bk * b.K[i * dk + x];
  }
  gemm_rows(L, dv, L, 1.0f, b.T, C, rows(b.V, dv), 0.0f, b.U, dv);
  gemm_rows(L, dk, L, 1.0f, b.T, C, rows(b.Kb, dk), 0.0f, b.W, dk);
  // V' = U - W S (in place in U).
  gemm_rows(L, dv, dk, -1.0f, b.W, dk, rows(S, dv), 1.0f, b.U, dv);
  // O = (e^gamma Q) S + (M . Q K^T) V', written straight into out (row stride Hv dv).
  float* P = b.A;
  for (int64_t i = 0; i < L; ++i) {
    float* Pi = P + i * C;
    for (int64_t j = 0; j <= i; ++j)
      Pi[j] = std::exp(b.gam[i] - b.gam[j]) * dot(b.Q + i * dk, b.K + j * dk, dk);
    std::fill(Pi + i + 1, Pi + L, 0.0f);
    const float eg = std::exp(b.gam[i]);
    for (int64_t x = 0; x < dk; ++x) b.Q[i * dk + x] *= eg;
  }
  float* O = a.out + (t0 * a.Hv + h) * dv;
  const int64_t ldo = a.Hv * dv;
  gemm_rows(L, dv, dk, 1.0f, b.Q, dk, rows(S, dv), 0.0f, O, ldo);
  gemm_rows(L, dv, L, 1.0f, P, C, rows(b.U, dv), 1.0f, O, ldo);
  // S = e^{gamma_L} S + (e^{gamma_L - gamma} K)^T V'.
  const float gl = b.gam[L - 1];
  for (int64_t j = 0; j < L; ++j) b.kd[j] = std::exp(gl - b.gam[j]);
  float* KdT = b.Kb;  // [dk, C]
  for (int64_t x = 0; x < dk; ++x)
    for (int64_t j = 0; j < L; ++j) KdT[x * C + j] = b.kd[j] * b.K[j * dk + x];
  gemm_rows(dk, dv, L, 1.0f, KdT, C, rows(b.U, dv), std::exp(gl), S, dv);
}

}  // namespace

void gdn_chunked(const GdnArgs& a, int64_t chunk) {
  if (a.n <= 0) return;
  if (a.Hk <= 0 || a.Hv % a.Hk != 0)
    throw std::invalid_argument("gdn_chunked: Hv must be a multiple of Hk");
  if (chunk < 1) throw std::invalid_argument("gdn_chunked: chunk must be >= 1");
  const int64_t r = a.Hv / a.Hk;
  const int64_t C = std::min(chunk, a.n);
  parallel_for(
      a.Hv,
      [&](int64_t begin, int64_t end) {
        const ChunkBuffers b = chunk_buffers(C, a.dk, a.dv);
        for (int64_t h = begin; h < end; ++h) {
          float* S = a.state + h * a.dk * a.dv;
          for (int64_t t0 = 0; t0 < a.n; t0 += C)
            run_chunk(a, h, h / r, t0, std::min(C, a.n - t0), C, b, S);
        }
      },
      1);
}

}  // namespace cpu
}  // namespace pe
