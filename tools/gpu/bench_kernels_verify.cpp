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
