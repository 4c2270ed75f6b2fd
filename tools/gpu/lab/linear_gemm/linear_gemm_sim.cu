// CPU simulation of the prefill GEMM's index math (native/src/kernels/cuda/linear_gemm.cuh), for
// checking a change of its tiles or layouts without a GPU: each thread's loads into the shared
// tile, ldmatrix x4 and the m16n8k16 fragments as the PTX ISA lays them out, the epilogue's
// stores, on small-integer data (exact) with weights in the GEMV tile layout (tiled_offset) or
// row-major; and the layout offset's row / column split (tiled_row_part + tiled_col_part) against
// tiled_offset. A transcription of the kernel's indexing: keep it in step with the kernel.
// Build and run (repo root, nvcc, no GPU):
//   nvcc -O2 -std=c++17 -I native/include -I native/src -x cu tools/gpu/lab/linear_gemm/linear_gemm_sim.cu \
//     -o /tmp/linear_gemm_sim && /tmp/linear_gemm_sim
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <cmath>
#include <algorithm>
#include "kernels/cuda/linear_gemm.cuh"
using namespace pe::cuda;

template <int BM, int BN, int BK>
long run(int64_t n, int64_t rows, int64_t cols, int tile, bool split) {
  constexpr int kT = 256, LDS = BK + 8, WM = BM / 2, WN = BN / 4, MI = WM / 16, NI = WN / 8, KC = BK / 8;
  constexpr int RSTEP = kT / KC, XC = BM / RSTEP, WC = BN / RSTEP;
  std::vector<float> x(n * cols);
  std::vector<int8_t> W(rows * cols);
  for (auto& v : x) v = float(rand() % 7 - 3);
  for (auto& v : W) v = int8_t(rand() % 9 - 4);
  // device bytes: tiled (rows padded to the tile) or row-major
  const int64_t row_bytes = cols;
  const int64_t prow = tile ? (rows + tile - 1) / tile * tile : rows;
  std::vector<uint8_t> dev(prow * row_bytes, 0xEE);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols; ++b)
      dev[tile ? tiled_offset(r, b, row_bytes, tile) : r * row_bytes + b] = uint8_t(W[r * cols + b]);
  std::vector<double> out(n * rows, NAN);
  const int num_n = int((rows + BN - 1) / BN), num_m = int((n + BM - 1) / BM);
  const int group_m = 3;
  const int n_k = int((cols + BK - 1) / BK);
  std::vector<float> As(2 * BM * LDS), Bs(2 * BN * LDS);
  for (int bid = 0; bid < num_n * num_m; ++bid) {
    const int per_group = group_m * num_n, gid = bid / per_group;
    const int first_m = gid * group_m, gsize = std::min(num_m - first_m, group_m);
    const int in_group = bid - gid * per_group;
    const int64_t m0 = int64_t(first_m + in_group % gsize) * BM, n0 = int64_t(in_group / gsize) * BN;
    std::vector<double> acc(8 * 32 * MI * NI * 4, 0.0);  // [warp][lane][mi][ni][e]
    auto A = [&](int w, int l, int mi, int ni, int e) -> double& { return acc[((((w * 32 + l) * MI + mi) * NI + ni) * 4) + e]; };
    auto load_store = [&](int kt, int buf, bool do_x, bool do_w) {
      for (int tid = 0; tid < kT; ++tid) {
        const int lr = tid / KC, lk = (tid % KC) * 8;
        const int64_t k = int64_t(kt) * BK + lk;
        if (do_x)
          for (int j = 0; j < XC; ++j) {
            const int64_t t = m0 + lr + j * RSTEP;
            for (int e = 0; e < 8; ++e)
              As[(buf * BM + lr + j * RSTEP) * LDS + lk + e] = (t < n && k < cols) ? x[t * cols + k + e] : 0.f;
          }
        if (do_w) {
          const int64_t r0 = n0 + lr;
          const int64_t base = tile ? gemm::tiled_row_part(r0, row_bytes, tile) : r0 * row_bytes;
          const int64_t col = tile ? gemm::tiled_col_part(k, tile) : k;
          for (int j = 0; j < WC; ++j) {
            const bool ok = r0 + j * RSTEP < rows && k < cols;
            for (int e = 0; e < 8; ++e)
              Bs[(buf * BN + lr + j * RSTEP) * LDS + lk + e] = ok ? float(int8_t(dev.at(base + j * RSTEP * row_bytes + col + e))) : 0.f;
          }
        }
      }
    };
    // ldmatrix x4: lane l gives the row address of matrix l / 8, row l % 8; thread t gets, per
    // matrix m, elements (t / 4, 2 (t % 4) .. + 1) of it.
    auto ldsm = [&](const float* s, std::vector<const float*> addr, int lane, int m, float* two) {
      const float* row = addr[m * 8 + lane / 4];
      two[0] = row[2 * (lane % 4)];
      two[1] = row[2 * (lane % 4) + 1];
      (void)s;
    };
    auto mma_phase = [&](int buf, int ks) {
      for (int w = 0; w < 8; ++w) {
        const int wm = w >> 2, wn = w & 3;
        const float* a_s = &As[(buf * BM + wm * WM) * LDS];
        const float* b_s = &Bs[(buf * BN + wn * WN) * LDS];
        // fragments per lane: af[lane][mi][4][2], bf[lane][ni][2][2]
        std::vector<float> af(32 * MI * 8), bf(32 * NI * 4);
        for (int mi = 0; mi < MI; ++mi) {
          std::vector<const float*> addr(32);
          for (int l = 0; l < 32; ++l) addr[l] = a_s + (mi * 16 + (l & 15)) * LDS + ks + (l >> 4) * 8;
          for (int l = 0; l < 32; ++l)
            for (int m = 0; m < 4; ++m) ldsm(a_s, addr, l, m, &af[((l * MI + mi) * 4 + m) * 2]);
        }
        for (int np = 0; np < NI / 2; ++np) {
          std::vector<const float*> addr(32);
          for (int l = 0; l < 32; ++l) addr[l] = b_s + (np * 16 + (l & 7) + ((l >> 4) << 3)) * LDS + ks + ((l >> 3) & 1) * 8;
          for (int l = 0; l < 32; ++l) {
            float r[4][2];
            for (int m = 0; m < 4; ++m) ldsm(b_s, addr, l, m, r[m]);
            // bf[2np] = r0, r1; bf[2np+1] = r2, r3
            for (int e = 0; e < 2; ++e) {
              bf[((l * NI + 2 * np) * 2 + 0) * 2 + e] = r[0][e];
              bf[((l * NI + 2 * np) * 2 + 1) * 2 + e] = r[1][e];
              bf[((l * NI + 2 * np + 1) * 2 + 0) * 2 + e] = r[2][e];
              bf[((l * NI + 2 * np + 1) * 2 + 1) * 2 + e] = r[3][e];
            }
          }
        }
        // mma m16n8k16 from the fragments (PTX layouts): A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..];
        // B[2t..][g], B[2t+8..][g]; C[g][2t..], C[g+8][2t..].
        for (int mi = 0; mi < MI; ++mi)
          for (int ni = 0; ni < NI; ++ni) {
            double Am[16][16], Bm[16][8];
            for (int l = 0; l < 32; ++l) {
              const int g = l / 4, t = l % 4;
              const float* a = &af[(l * MI + mi) * 8];
              for (int e = 0; e < 2; ++e) {
                Am[g][2 * t + e] = a[0 * 2 + e];
                Am[g + 8][2 * t + e] = a[1 * 2 + e];
                Am[g][2 * t + 8 + e] = a[2 * 2 + e];
                Am[g + 8][2 * t + 8 + e] = a[3 * 2 + e];
              }
              const float* b = &bf[(l * NI + ni) * 4];
              for (int e = 0; e < 2; ++e) {
                Bm[2 * t + e][g] = b[0 * 2 + e];
                Bm[2 * t + 8 + e][g] = b[1 * 2 + e];
              }
            }
            for (int l = 0; l < 32; ++l) {
              const int g = l / 4, t = l % 4;
              for (int e = 0; e < 4; ++e) {
                const int row = g + (e >> 1) * 8, c = 2 * t + (e & 1);
                double s = 0;
                for (int kk = 0; kk < 16; ++kk) s += Am[row][kk] * Bm[kk][c];
                A(w, l, mi, ni, e) += s;
              }
            }
          }
      }
    };
    load_store(0, 0, true, true);
    for (int kt = 0; kt < n_k; ++kt) {
      const int buf = kt & 1;
      for (int ks = 0; ks < BK; ks += 16) {
        mma_phase(buf, ks);
        if (split && ks == 0 && kt + 1 < n_k) load_store(kt + 1, buf ^ 1, true, false);
      }
      if (kt + 1 < n_k) load_store(kt + 1, buf ^ 1, !split, true);
    }
    for (int w = 0; w < 8; ++w)
      for (int l = 0; l < 32; ++l)
        for (int mi = 0; mi < MI; ++mi)
          for (int h = 0; h < 2; ++h) {
            const int64_t t = m0 + (w >> 2) * WM + mi * 16 + (l >> 2) + h * 8;
            if (t >= n) continue;
            for (int ni = 0; ni < NI; ++ni) {
              const int64_t r = n0 + (w & 3) * WN + ni * 8 + (l & 3) * 2;
              if (r < rows) out[t * rows + r] = A(w, l, mi, ni, 2 * h);
              if (r + 1 < rows) out[t * rows + r + 1] = A(w, l, mi, ni, 2 * h + 1);
            }
          }
  }
  long bad = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t k = 0; k < cols; ++k) s += double(x[t * cols + k]) * W[r * cols + k];
      if (!(out[t * rows + r] == s)) ++bad;
    }
  std::printf("BM %d BN %d BK %d split %d: n %lld rows %lld cols %lld tile %d: %ld bad\n", BM, BN, BK, split, (long long)n,
              (long long)rows, (long long)cols, tile, bad);
  return bad;
}

long check_tiled_split() {
  long bad = 0, n = 0;
  for (int tile : {8, 16, 32}) {
    const int S = 4096 / tile;
    for (int64_t row_bytes : {int64_t(S), int64_t(2 * S), int64_t(5120), int64_t(17408), int64_t(2560), int64_t(8704)}) {
      if (row_bytes % S) continue;
      for (int64_t row = 0; row < 300; ++row)
        for (int64_t b = 0; b < row_bytes; ++b) {
          ++n;
          if (tiled_offset(row, b, row_bytes, tile) != gemm::tiled_row_part(row, row_bytes, tile) + gemm::tiled_col_part(b, tile)) ++bad;
          if (row + 64 < 300 && gemm::tiled_row_part(row + 64, row_bytes, tile) != gemm::tiled_row_part(row, row_bytes, tile) + 64 * row_bytes) ++bad;
        }
    }
  }
  std::printf("tile layout split: %ld offsets, %ld bad\n", n, bad);
  return bad;
}

int main() {
  long bad = check_tiled_split();
  bad += run<128, 256, 32>(300, 520, 256, 32, false);
  bad += run<128, 256, 32>(130, 300, 1024, 16, false);
  bad += run<128, 256, 32>(129, 260, 256, 0, true);
  bad += run<64, 256, 32>(70, 300, 512, 8, false);
  bad += run<128, 128, 32>(200, 300, 256, 32, false);
  bad += run<256, 128, 32>(300, 140, 256, 0, false);
  bad += run<128, 256, 64>(150, 270, 384, 32, false);
  std::printf("%s\n", bad ? "SIM FAILED" : "sim ok");
  return bad != 0;
}
