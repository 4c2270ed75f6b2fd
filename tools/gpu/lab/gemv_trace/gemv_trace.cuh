// Per-block timestamps of the quantized GEMV (tools/gpu/lab/gemv_trace: build.sh copies this
// header to native/src/kernels/cuda/linear_gemv_q_trace.cuh of a copy of the tree and applies
// gemv_trace.patch, which puts the stamps into linear_gemv_q.cu). Every block records %globaltimer
// at its start, after pdl_wait, once x is staged, once its warps' step loops are done and at its
// end, so a decode step shows where each launch's time goes (the previous kernel's release, x
// staging, the loop's tail across blocks, the epilogue). Records are written at a block's end (a
// dependent's blocks end after every block of the launch it waits for), so a launch's records are
// consecutive. gemv_trace.py reads them through pe_debug_gemv_trace_dump.
#pragma once
#include <cstdint>
#include <cstdio>
#include <vector>

namespace pe {
namespace cuda {
namespace gemv_q {

struct GemvTraceRec {  // 64 bytes; gemv_trace.py reads them in this layout
  unsigned long long t[5];
  int smid, grid, block, rows, cols;
  int parts;  // the block's row blocks, + 65536 if its first starts mid-row, + 131072 if its last ends mid-row
};
constexpr unsigned kGemvTraceCap = 1u << 20;
__device__ GemvTraceRec g_gemv_trace[kGemvTraceCap];
__device__ unsigned g_gemv_trace_n;

__device__ __forceinline__ unsigned long long gemv_trace_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace gemv_q
}  // namespace cuda
}  // namespace pe

// Copies the records since the last call to `path` (raw GemvTraceRec) and restarts; the count.
extern "C" long long pe_debug_gemv_trace_dump(const char* path) {
  using namespace pe::cuda::gemv_q;
  if (cudaDeviceSynchronize() != cudaSuccess) return -1;
  unsigned n = 0;
  if (cudaMemcpyFromSymbol(&n, g_gemv_trace_n, sizeof(n)) != cudaSuccess) return -1;
  std::vector<GemvTraceRec> host(n < kGemvTraceCap ? n : kGemvTraceCap);
  const bool ok = cudaMemcpyFromSymbol(host.data(), g_gemv_trace, host.size() * sizeof(GemvTraceRec)) == cudaSuccess;
  FILE* f = ok && path && *path ? std::fopen(path, "wb") : nullptr;
  if (f) {
    std::fwrite(host.data(), sizeof(GemvTraceRec), host.size(), f);
    std::fclose(f);
  }
  const unsigned zero = 0;
  cudaMemcpyToSymbol(g_gemv_trace_n, &zero, sizeof(zero));
  return ok ? static_cast<long long>(host.size()) : -1;
}

#define PE_GEMV_TRACE_DECL __shared__ unsigned long long pe_trace_t[4]
#define PE_GEMV_STAMP(i) \
  if (threadIdx.x == 0) pe_trace_t[i] = gemv_trace_now()
#define PE_GEMV_TRACE_END(rows_, cols_, parts_)                                    \
  if (threadIdx.x == 0) {                                                          \
    const unsigned k = atomicAdd(&g_gemv_trace_n, 1u);                             \
    if (k < kGemvTraceCap) {                                                       \
      GemvTraceRec& rec = g_gemv_trace[k];                                         \
      for (int i = 0; i < 4; ++i) rec.t[i] = pe_trace_t[i];                        \
      rec.t[4] = gemv_trace_now();                                                 \
      unsigned sm;                                                                 \
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));                              \
      rec.smid = static_cast<int>(sm);                                             \
      rec.grid = static_cast<int>(gridDim.x);                                      \
      rec.block = static_cast<int>(blockIdx.x);                                    \
      rec.rows = static_cast<int>(rows_);                                          \
      rec.cols = static_cast<int>(cols_);                                          \
      rec.parts = (parts_);                                                        \
    }                                                                              \
  }
