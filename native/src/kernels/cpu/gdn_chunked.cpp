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
// The chunk's K, Q, V are gathered into contiguous thread-local buffers; all inner loops run over
// contiguous dk or dv floats. Parallel over value heads; chunks of one head run in order.
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
  float *K, *Q, *W, *V, *U, *A, *T, *gam, *bet, *kd;
};

ChunkBuffers chunk_buffers(int64_t C, int64_t dk, int64_t dv) {
  const size_t n = static_cast<size_t>(3 * C * dk + 2 * C * dv + 2 * C * C + 3 * C);
  float* p = scratch(0, n);
  ChunkBuffers b;
  b.K = p; p += C * dk;
  b.Q = p; p += C * dk;
  b.W = p; p += C * dk;
  b.V = p; p += C * dv;
  b.U = p; p += C * dv;
  b.A = p; p += C * C;
  b.T = p; p += C * C;
  b.gam = p; p += C;
  b.bet = p; p += C;
  b.kd = p;
  return b;
}

// One chunk [t0, t0 + L) of value head h (key head kh); updates S [dk, dv] in place.
void run_chunk(const GdnArgs& a, int64_t h, int64_t kh, int64_t t0, int64_t L, int64_t C,
               const ChunkBuffers& b, float* S) {
  const int64_t dk = a.dk, dv = a.dv;
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
  // A (strictly lower) and T = (I + A)^-1: T[i] = e_i - sum_{m<i} A[i,m] T[m].
  for (int64_t i = 0; i < L; ++i) {
    float* Ai = b.A + i * C;
    for (int64_t j = 0; j < i; ++j)
      Ai[j] = b.bet[i] * std::exp(b.gam[i] - b.gam[j]) * dot(b.K + i * dk, b.K + j * dk, dk);
    float* Ti = b.T + i * C;
    std::fill(Ti, Ti + i + 1, 0.0f);
    for (int64_t m = 0; m < i; ++m) axpy(-Ai[m], b.T + m * C, Ti, m + 1);
    Ti[i] = 1.0f;
  }
  // U = T (beta V), W = T (beta e^gamma K).
  for (int64_t i = 0; i < L; ++i) {
    float* Ui = b.U + i * dv;
    float* Wi = b.W + i * dk;
    std::fill(Ui, Ui + dv, 0.0f);
    std::fill(Wi, Wi + dk, 0.0f);
    const float* Ti = b.T + i * C;
    for (int64_t m = 0; m <= i; ++m) {
      const float tb = Ti[m] * b.bet[m];
      axpy(tb, b.V + m * dv, Ui, dv);
      axpy(tb * std::exp(b.gam[m]), b.K + m * dk, Wi, dk);
    }
  }
  // V' = U - W S (in place in U).
  for (int64_t i = 0; i < L; ++i) {
    float* Ui = b.U + i * dv;
    const float* Wi = b.W + i * dk;
    for (int64_t x = 0; x < dk; ++x) axpy(-Wi[x], S + x * dv, Ui, dv);
  }
  // O = (e^gamma Q) S + (M . Q K^T) V'.
  for (int64_t i = 0; i < L; ++i) {
    float* o = a.out + ((t0 + i) * a.Hv + h) * dv;
    std::fill(o, o + dv, 0.0f);
    const float* Qi = b.Q + i * dk;
    const float eg = std::exp(b.gam[i]);
    for (int64_t x = 0; x < dk; ++x) axpy(eg * Qi[x], S + x * dv, o, dv);
    for (int64_t j = 0; j <= i; ++j) {
      const float c = std::exp(b.gam[i] - b.gam[j]) * dot(Qi, b.K + j * dk, dk);
      axpy(c, b.U + j * dv, o, dv);
    }
  }
  // S = e^{gamma_L} S + (e^{gamma_L - gamma} K)^T V'.
  const float gl = b.gam[L - 1];
  for (int64_t j = 0; j < L; ++j) b.kd[j] = std::exp(gl - b.gam[j]);
  const float el = std::exp(gl);
  for (int64_t x = 0; x < dk; ++x) {
    float* Sx = S + x * dv;
    for (int64_t c = 0; c < dv; ++c) Sx[c] *= el;
    for (int64_t j = 0; j < L; ++j) axpy(b.kd[j] * b.K[j * dk + x], b.U + j * dv, Sx, dv);
  }
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
