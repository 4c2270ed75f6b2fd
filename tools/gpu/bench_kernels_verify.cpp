// Section 2b of the kernel micro-benchmark (bench_kernels.h, part of --only gemv): speculative
// decoding's verify step, 16 and 32 token rows (8 sequences x (1 + k)), on the 27B layer shapes
// with quantized weights in the model's GEMV tile layout: the quantized GEMV of 9..32 tokens
// (linear_gemv_q_wide.cu, "gemv") against the mma.sync GEMM that took them before
// (linear_gemv_set_max_tokens(8), "gemm"), each from a CUDA graph, weights rotating over the pool
// (> L2). Bytes = weights + their scales + x + out; the line's "% of copy" is the A/B's number
// (the GEMV aims at the decode step's, n = 8 above). At 32 tokens the GEMV also at both register
// budgets ("mb1" / "mb2": GemvTuning::wide_min_blocks; the default's line has none).
#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench_kernels.h"
#include "kernels/cuda/cuda_ops.h"

using namespace pe;

void bench_verify_gemv(const float* x, float* out, void* pool, size_t pool_bytes, const float* scale,
                       const void* gscale, const char* filter) {
  struct Shape { const char* name; int64_t rows, cols; };
  const Shape shapes[] = {{"mlp gate|up 34816x5120", 34816, 5120},
                          {"gdn in_proj qkv|z|a|b 16480x5120", 16480, 5120},
                          {"attn q|k|v 14336x5120", 14336, 5120},
                          {"mlp down 5120x17408", 5120, 17408},
                          {"gdn out_proj|o_proj 5120x6144", 5120, 6144}};
  for (DType dt : {DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (const Shape& s : shapes)
      for (int n : {16, 32})
        for (int variant = 0; variant < (n > 16 ? 4 : 2); ++variant) {
          const int max_tokens = variant == 1 ? 8 : cuda::kGemvMaxTokens;
          cuda::GemvTuning tn;
          tn.wide_min_blocks = variant == 2 ? 1 : variant == 3 ? 2 : 0;
          char name[112];
          std::snprintf(name, sizeof name, "verify %s %s n=%d %s", dtype_name(dt), s.name, n,
                        variant == 1 ? "gemm" : variant == 2 ? "gemv mb1" : variant == 3 ? "gemv mb2" : "gemv");
          if (!name_selected(name, filter)) continue;
          const size_t wbytes = dtype_bytes_for(dt, s.rows * s.cols);
          const double sbytes = dt == DType::FP8_E4M3 ? 4.0 * ((s.rows + 127) / 128) * ((s.cols + 127) / 128)
                                : dt == DType::I8     ? 4.0 * s.rows
                                                      : s.rows * s.cols / 16.0;
          const int copies = static_cast<int>(std::max<size_t>(1, std::min<size_t>(pool_bytes / wbytes, 8)));
          WeightView w = bench_weight(dt, s.rows, s.cols, nullptr, scale, gscale);
          w.tile = cuda::gemv_tile_rows(w);  // the model's layout (random bytes either way)
          if (w.tile && s.rows % w.tile != 0) w.tile = 0;
          cuda::linear_gemv_set_max_tokens(max_tokens);
          cuda::linear_gemv_set_tuning(tn);
          const float ms = graph_ms([&](int i, cudaStream_t st) {
            w.data = static_cast<char*>(pool) + (i % copies) * wbytes;
            cuda::linear(x, n, w, out, st);
          }, 16);
          cuda::linear_gemv_set_max_tokens(cuda::kGemvMaxTokens);
          cuda::linear_gemv_set_tuning(cuda::GemvTuning{});
          report(name, ms, double(wbytes) + sbytes + 4.0 * n * (s.cols + s.rows));
        }
}

void bench_verify_gdn() {
  const int64_t Hk = 16, Hv = 48, dk = 128, dv = 128, K = 4, C = 2 * Hk * dk + Hv * dv;
  const int64_t conv_slot = K * C, rec_slot = Hv * dk * dv;
  for (int64_t S : {1, 8})
    for (int n : {4, 8}) {
      // Sequence i: live slot i, its snapshots S + i * n + j; tokens in rows i * n + t.
      const int64_t slots = S + S * n, T = S * n;
      float* conv = static_cast<float*>(dalloc(sizeof(float) * slots * conv_slot, 3));
      float* rec = static_cast<float*>(dalloc(sizeof(float) * slots * rec_slot, 4));
      float* qkv = static_cast<float*>(dalloc(sizeof(float) * T * C, 5));
      float* ab = static_cast<float*>(dalloc(sizeof(float) * 2 * T * Hv, 6));
      float* w = static_cast<float*>(dalloc(sizeof(float) * (C * K + 2 * Hv), 7));
      float *o = nullptr, *y = nullptr;
      CK(cudaMalloc(&o, sizeof(float) * T * Hv * dv));
      CK(cudaMalloc(&y, sizeof(float) * T * C));
      // chain arrays (row0 | n_tok | pos0 | slots | out_off | out slots), then per call t: rows | in | out | pos
      std::vector<int32_t> h;
      for (int64_t i = 0; i < S; ++i) h.push_back(static_cast<int32_t>(i * n));
      h.insert(h.end(), S, n);
      for (int64_t i = 0; i < S; ++i) h.push_back(static_cast<int32_t>(100 + i));
      for (int64_t i = 0; i < S; ++i) h.push_back(static_cast<int32_t>(i));
      for (int64_t i = 0; i < S; ++i) h.push_back(static_cast<int32_t>(i * n));
      auto out_slot = [&](int64_t i, int t) { return static_cast<int32_t>(t + 1 == n ? i : S + i * n + t); };
      for (int64_t i = 0; i < S; ++i)
        for (int t = 0; t < n; ++t) h.push_back(out_slot(i, t));
      const size_t calls0 = h.size();
      for (int t = 0; t < n; ++t)
        for (int part = 0; part < 4; ++part)
          for (int64_t i = 0; i < S; ++i)
            h.push_back(part == 0   ? static_cast<int32_t>(i * n + t)
                        : part == 1 ? (t == 0 ? static_cast<int32_t>(i) : out_slot(i, t - 1))
                        : part == 2 ? out_slot(i, t)
                                    : static_cast<int32_t>(100 + i + t));
      int32_t* d = nullptr;
      CK(cudaMalloc(&d, sizeof(int32_t) * h.size()));
      CK(cudaMemcpy(d, h.data(), sizeof(int32_t) * h.size(), cudaMemcpyHostToDevice));
      const float *A_log = w + C * K, *dt = A_log + Hv;
      cpu::GdnChainArgs ca{S, qkv, C, ab, ab + T * Hv, Hv, w, A_log, dt, d, d + S, d + 2 * S, d + 3 * S, d + 4 * S,
                           d + 5 * S, conv, conv_slot, rec, rec_slot, Hk, Hv, dk, dv, K, o, y};
      const float chain_ms = graph_ms([&](int, cudaStream_t st) { cuda::gdn_chain(ca, st); }, 8);
      const float calls_ms = graph_ms([&](int, cudaStream_t st) {
        for (int t = 0; t < n; ++t) {
          const int32_t* c = d + calls0 + static_cast<size_t>(t) * 4 * S;
          cpu::GdnDecodeArgs a{S, qkv, ab, ab + T * Hv, w, A_log, dt, c + S, c + 3 * S, conv, conv_slot, rec, rec_slot,
                               Hk, Hv, dk, dv, K, o};
          a.rows = c, a.out_slots = c + 2 * S, a.qkv_stride = C, a.ab_stride = Hv, a.chained = t > 0;
          cuda::gdn_decode(a, st);
        }
      }, 8);
      const double state = 4.0 * rec_slot * S;
      char name[112];
      std::snprintf(name, sizeof name, "verify gdn S=%lld n=%d chain", static_cast<long long>(S), n);
      report(name, chain_ms, state * (1 + n));
      std::snprintf(name, sizeof name, "verify gdn S=%lld n=%d %d calls", static_cast<long long>(S), n, n);
      report(name, calls_ms, state * 2 * n);
      for (void* p : {static_cast<void*>(conv), static_cast<void*>(rec), static_cast<void*>(qkv), static_cast<void*>(ab),
                      static_cast<void*>(w), static_cast<void*>(o), static_cast<void*>(y), static_cast<void*>(d)})
        CK(cudaFree(p));
    }
}
