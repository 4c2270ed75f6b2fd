// Shared by the kernel micro-benchmark's files (bench_kernels.cpp, bench_kernels_gemm.cpp,
// bench_kernels_attn.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "kernels/ops.h"

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

extern int g_reps;         // timed runs a case (--quick: 5)
extern double g_copy_gbs;  // the copy bandwidth measured first, GB/s (read + written)
// Median milliseconds of fn() over g_reps runs (3 warm-ups first).
float time_ms(const std::function<void(int)>& fn);
// Milliseconds per call of fn(i, stream) from a CUDA graph of k calls (device time).
float graph_ms(const std::function<void(int, cudaStream_t)>& fn, int k);
// Whether name holds one of the '|'-separated parts of filter (all names without one).
bool name_selected(const char* name, const char* filter);
// A weight of any format over `data` (random bytes), its scales from `scale` (FP8 block / I8 row)
// and `gscale` (NVFP4 groups, global scale 0.01).
inline pe::WeightView bench_weight(pe::DType dt, int64_t rows, int64_t cols, void* data, const float* scale,
                                   const void* gscale) {
  pe::WeightView w;
  w.dtype = dt;
  w.rows = rows;
  w.cols = cols;
  w.data = data;
  w.block_scale = scale;
  w.row_scale = scale;
  w.group_scale = static_cast<const uint8_t*>(gscale);
  w.global_scale = 0.01f;
  return w;
}
// Device memory filled with a finite byte pattern (METHOD.md: not zeros).
void* dalloc(size_t bytes, uint8_t fill_seed);
// One line: time, bytes moved, GB/s, share of the copy bandwidth, TFLOP/s where flops > 0.
void report(const char* name, float ms, double bytes, double flops = 0);
// Section 3, the prefill GEMM (bench_kernels_gemm.cpp): x [4096, 17408] fp32, pool (>= 3 GiB + the
// tiled weights) of weight bytes, scale / gscale the block / group scales.
void bench_prefill_gemm(const float* x, void* pool, const float* scale, const void* gscale);
// Section 6, the prefill attention (bench_kernels_attn.cpp): attention_prefill_mma's variants on the
// 27B shape, whole prompts and chunks at the end of 4K / 32K contexts; with_tiled: also the SIMT
// kernel behind attention_paged on the whole prompts.
void bench_prefill_attention(bool quick, bool with_tiled);
// Section 2b, the verify step's GEMV (bench_kernels_verify.cpp): 16 and 32 tokens on the 27B
// shapes, the quantized GEMV against the GEMM (linear_gemv_set_max_tokens), names filtered as
// PE_BENCH_GEMV_FILTER.
void bench_verify_gemv(const float* x, float* out, void* pool, size_t pool_bytes, const float* scale,
                       const void* gscale, const char* filter);
// The verify step's GDN core (bench_kernels_verify.cpp): one GDN layer of the 27B shape over S
// sequences of n tokens each, cuda::gdn_chain against the n chained cuda::gdn_decode calls.
void bench_verify_gdn();
