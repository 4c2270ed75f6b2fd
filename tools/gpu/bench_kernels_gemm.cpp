// Section 3 of the kernel micro-benchmark (bench_kernels.h): the prefill GEMM, every weight
// format on gate|up at 512 and 4096 tokens, then the 27B prefill projections with FP8 weights as
// the model holds them.
#include <cstdio>

#include "bench_kernels.h"
#include "kernels/cuda/cuda_ops.h"

using namespace pe;

void bench_prefill_gemm(const float* x, void* pool, const float* scale, const void* gscale) {
  struct Shape { const char* name; int64_t rows, cols; };
  float* out = static_cast<float*>(dalloc(size_t(4096) * 34816 * 4, 6));
  // Every weight format on gate|up; at n >= 128 both token tiles (128 = the default, 64 forced
  // through the tuning hook) for the A/B of the tile size.
  for (DType dt : {DType::FP8_E4M3, DType::BF16, DType::F16, DType::I8, DType::NVFP4})
    for (int n : {512, 4096})
      for (int tile : {128, 64}) {
        const WeightView w = bench_weight(dt, 17408, 5120, pool, scale, gscale);
        cuda::linear_gemm_set_big_tile_tokens(tile == 128 ? 128 : (int64_t(1) << 40));
        const float ms = time_ms([&](int) { cuda::linear(x, n, w, out, nullptr); });
        cuda::linear_gemm_set_big_tile_tokens(128);
        char name[96];
        std::snprintf(name, sizeof name, "gemm %s 17408x5120 n=%d tile %d", dtype_name(dt), n, tile);
        const size_t wb = dtype_bytes_for(dt, w.rows * w.cols);
        report(name, ms, double(wb) + 4.0 * n * (w.cols + w.rows), 2.0 * n * w.rows * w.cols);
      }
  // The 27B prefill projections at a 4K chunk with FP8 weights as the model holds them (GEMV tiles
  // of 32 rows, tile_weight): one weight each, bytes = weights + x + out once. On compute
  // capability 9.0 builds with CUTLASS, also the W8A8 wgmma path (cuda_ops.h linear with a
  // workspace: untiling + quantization + GEMM) at 512 and 4096 tokens, both variants, against the
  // mma.sync GEMM at 512 (linear_gemm_set_fp8_sm90 is the A/B hook).
  {
    const bool fp8_sm90 = cuda::linear_fp8_sm90_available();
    const size_t fp8_ws_bytes = size_t(512) << 20;  // >= linear_workspace_bytes(4096, any shape below)
    cuda::GemmWorkspace fp8_ws;
    if (fp8_sm90) fp8_ws = {dalloc(fp8_ws_bytes, 0), fp8_ws_bytes};
    const Shape pshapes[] = {{"gate|up 34816x5120", 34816, 5120}, {"gdn in 16480x5120", 16480, 5120},
                             {"q|k|v 14336x5120", 14336, 5120},   {"down 5120x17408", 5120, 17408},
                             {"out|o 5120x6144", 5120, 6144}};
    for (const Shape& s : pshapes) {
      WeightView w = bench_weight(DType::FP8_E4M3, s.rows, s.cols, pool, scale, nullptr);
      w = cuda::tile_weight(w, static_cast<char*>(pool) + (size_t(3) << 30), 32, nullptr);
      const int n = 4096;
      const float ms = time_ms([&](int) { cuda::linear(x, n, w, out, nullptr); });
      char name[96];
      std::snprintf(name, sizeof name, "gemm fp8 tiled %s n=%d", s.name, n);
      report(name, ms, double(s.rows * s.cols) + 4.0 * n * (s.cols + s.rows), 2.0 * n * s.rows * s.cols);
      if (!fp8_sm90) continue;
      for (int nn : {512, 4096})
        for (int v : {0, 1, 2}) {  // 0: the mma.sync GEMM at 512 for the A/B (4096 is the row above)
          if (v == 0 && nn != 512) continue;
          if (cuda::linear_workspace_bytes(nn, w) > fp8_ws_bytes) break;
          cuda::linear_gemm_set_fp8_sm90(v);
          const float wms = time_ms([&](int) { cuda::linear(x, nn, w, out, nullptr, nullptr, &fp8_ws); });
          cuda::linear_gemm_set_fp8_sm90(1);
          std::snprintf(name, sizeof name, "gemm fp8 %s %s n=%d", v == 0 ? "mma.sync" : v == 1 ? "w8a8 1x1" : "w8a8 1x2",
                        s.name, nn);
          report(name, wms, double(s.rows * s.cols) + 4.0 * nn * (s.cols + s.rows), 2.0 * nn * s.rows * s.cols);
        }
    }
    if (fp8_sm90) CK(cudaFree(fp8_ws.data));
  }
  CK(cudaFree(out));
}
