// Micro-benchmark of the CUDA decode/prefill kernels on the 27B shape (MODEL_SPEC §1), against
// the device-to-device copy bandwidth measured in the same run (METHOD.md: the two numbers).
// Prints one line per case: time (median of 20, CUDA events, after warm-up), bytes moved, GB/s
// and the fraction of the copy bandwidth (memory-bound kernels) or TFLOP/s (GEMM).
// Weights are random bytes (fp8 kept finite), rotated over copies larger than L2.
// Build: see tools/gpu/run_all.sh. Usage: bench_kernels [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cuda/cuda_ops.h"

using namespace pe;

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

int g_reps = 20;

// Median milliseconds of fn() over g_reps runs (3 warm-ups first).
float time_ms(const std::function<void(int)>& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn(i);
  std::vector<float> t;
  for (int i = 0; i < g_reps; ++i) {
    CK(cudaEventRecord(a));
    fn(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void* dalloc(size_t bytes, uint8_t fill_seed) {
  void* p;
  CK(cudaMalloc(&p, bytes));
  // Not zeros (METHOD.md): a byte pattern; for fp8 0x00..0x7e/0x80..0xfe are finite values.
  std::vector<uint8_t> h(1 << 20);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint8_t>((i * 131 + fill_seed) % 251) & 0xbf;
  for (size_t off = 0; off < bytes; off += h.size())
    CK(cudaMemcpy(static_cast<char*>(p) + off, h.data(), std::min(h.size(), bytes - off), cudaMemcpyHostToDevice));
  return p;
}

double g_copy_gbs = 0;

void report(const char* name, float ms, double bytes, double flops = 0) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-44s %9.4f ms %10.1f MB %8.0f GB/s %6.1f%% of copy", name, ms, bytes / 1e6, gbs,
              100.0 * gbs / g_copy_gbs);
  if (flops > 0) std::printf("  %7.1f TFLOP/s", flops / (ms * 1e-3) / 1e12);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (quick) g_reps = 5;
  if (!cuda::device_available()) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s sm_%d%d, %d SMs, L2 %d MB\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);
  // 1. Copy bandwidth (bytes read + written).
  const size_t copy_bytes = size_t(2) << 30;
  void* src = dalloc(copy_bytes, 1);
  void* dst = dalloc(copy_bytes, 2);
  const float copy_ms = time_ms([&](int) { CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); });
  g_copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  std::printf("%-44s %9.4f ms  copy bandwidth %.0f GB/s (read + write)\n", "d2d copy 2 GiB", copy_ms, g_copy_gbs);
  CK(cudaFree(dst));
  const size_t pool_bytes = size_t(6) << 30;  // weight copies rotate through it (L2 is ~50 MB)
  void* pool = dalloc(pool_bytes, 9);

  // 2. Decode GEMV on the 27B layer shapes; weights rotate over a 2 GiB pool (> L2).
  struct Shape { const char* name; int64_t rows, cols; };
  const Shape shapes[] = {{"gdn in_proj_qkv 10240x5120", 10240, 5120}, {"gdn in_proj_z 6144x5120", 6144, 5120},
                          {"gdn out_proj 5120x6144", 5120, 6144},      {"mlp gate|up 34816x5120", 34816, 5120},
                          {"mlp down 5120x17408", 5120, 17408},        {"attn q_proj 12288x5120", 12288, 5120},
                          {"lm_head 248320x5120 (bf16)", 248320, 5120}};
  float* x = static_cast<float*>(dalloc(size_t(4096) * 17408 * 4, 3));
  CK(cudaMemset(x, 0, 16));
  // x as small finite floats: overwrite with a pattern through a host copy
  {
    std::vector<float> hx(size_t(4096) * 17408);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
    CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  }
  float* out = static_cast<float*>(dalloc(size_t(4096) * 248320 * 4 / 8, 4));
  std::vector<float> hscale(size_t(2000) * 136, 0.01f);
  float* scale;
  CK(cudaMalloc(&scale, hscale.size() * 4));
  CK(cudaMemcpy(scale, hscale.data(), hscale.size() * 4, cudaMemcpyHostToDevice));
  for (DType dt : {DType::FP8_E4M3, DType::BF16}) {
    for (const Shape& s : shapes) {
      const bool lm = s.rows == 248320;
      if (lm && dt != DType::BF16) continue;
      const size_t wbytes = size_t(s.rows) * s.cols * (dt == DType::BF16 ? 2 : 1);
      const int copies = static_cast<int>(std::max<size_t>(1, std::min<size_t>(pool_bytes / wbytes, 8)));
      for (int n : {1, 2, 4, 8}) {
        if (quick && n == 2) continue;
        WeightView w;
        w.dtype = dt;
        w.rows = s.rows;
        w.cols = s.cols;
        w.block_scale = scale;
        const float ms = time_ms([&](int i) {
          w.data = static_cast<char*>(pool) + (i % copies) * wbytes;
          cuda::linear(x, n, w, out, nullptr);
        });
        char name[96];
        std::snprintf(name, sizeof name, "gemv %s %s n=%d", dt == DType::BF16 ? "bf16" : "fp8", s.name, n);
        report(name, ms, double(wbytes) + 4.0 * n * (s.cols + s.rows));
      }
    }
  }
  // 3. Prefill GEMM.
  for (DType dt : {DType::FP8_E4M3, DType::BF16, DType::F16})
    for (int n : {512, 4096}) {
      WeightView w;
      w.dtype = dt;
      w.rows = 17408;
      w.cols = 5120;
      w.block_scale = scale;
      w.data = pool;
      const float ms = time_ms([&](int) { cuda::linear(x, n, w, out, nullptr); });
      char name[96];
      std::snprintf(name, sizeof name, "gemm %s 17408x5120 n=%d", dtype_name(dt), n);
      const size_t wb = size_t(w.rows) * w.cols * dtype_size(dt);
      report(name, ms, double(wb) + 4.0 * n * (w.cols + w.rows), 2.0 * n * w.rows * w.cols);
    }
  // 4. Attention decode at depth (27B: 24 q heads, 4 kv heads, D 256), F16 and F32 cache.
  for (DType kvt : {DType::F16, DType::F32})
    for (int64_t depth : {1024, 8192, 32768}) {
      const int64_t page = 16, n_pages = (depth + 1 + page - 1) / page;
      const size_t es = dtype_size(kvt), cache = size_t(n_pages) * page * 4 * 256 * es;
      void* kc = dalloc(cache, 5);
      void* vc = dalloc(cache, 6);
      if (kvt == DType::F32) {  // finite floats
        CK(cudaMemset(kc, 0x3c, cache));
        CK(cudaMemset(vc, 0x3c, cache));
      }
      std::vector<int32_t> hpt(n_pages);
      for (int64_t i = 0; i < n_pages; ++i) hpt[i] = static_cast<int32_t>((i * 7) % n_pages);
      int32_t* pt;
      CK(cudaMalloc(&pt, n_pages * 4));
      CK(cudaMemcpy(pt, hpt.data(), n_pages * 4, cudaMemcpyHostToDevice));
      cpu::PagedKV kv{kvt, kc, vc, nullptr, nullptr, page, 4, 256};
      const size_t sb = cuda::attention_paged_scratch_bytes(1, depth, 24, 4, 256);
      void* scr;
      CK(cudaMalloc(&scr, std::max<size_t>(sb, 1)));
      const float ms = time_ms([&](int) {
        cuda::attention_paged(x, 1, depth, 24, kv, pt, 0.0625f, x + 8192, out, scr, sb, nullptr);
      });
      char name[96];
      std::snprintf(name, sizeof name, "attn decode %s depth=%lld", dtype_name(kvt), (long long)depth);
      report(name, ms, 2.0 * (depth + 1) * 4 * 256 * es);
      CK(cudaFree(kc)); CK(cudaFree(vc)); CK(cudaFree(pt)); CK(cudaFree(scr));
    }
  // 5. GDN: decode step (state read + written) and chunked prefill of 4096 tokens, 27B shape.
  {
    const int64_t Hk = 16, Hv = 48, dk = 128, dv = 128;
    float* state;
    CK(cudaMalloc(&state, Hv * dk * dv * 4));
    CK(cudaMemset(state, 0, Hv * dk * dv * 4));
    float* gb;  // g, beta: small negative g, beta 0.5
    const int64_t n = quick ? 1024 : 4096;
    std::vector<float> hgb(2 * n * Hv);
    for (int64_t i = 0; i < n * Hv; ++i) { hgb[i] = -0.05f; hgb[n * Hv + i] = 0.5f; }
    CK(cudaMalloc(&gb, hgb.size() * 4));
    CK(cudaMemcpy(gb, hgb.data(), hgb.size() * 4, cudaMemcpyHostToDevice));
    const int64_t qk_stride = 2 * Hk * dk + Hv * dv;  // q | k | v slices of the conv output
    cpu::GdnArgs a{x, x + Hk * dk, qk_stride, x + 2 * Hk * dk, qk_stride, gb, gb + n * Hv, 1, Hk, Hv, dk, dv, state, out};
    float ms = time_ms([&](int) { cuda::gdn_recurrent(a, nullptr); });
    report("gdn_recurrent decode 27B (state r+w)", ms, 2.0 * Hv * dk * dv * 4);
    a.n = n;
    ms = time_ms([&](int) { cuda::gdn_chunked(a, nullptr); });
    char name[96];
    std::snprintf(name, sizeof name, "gdn_chunked n=%lld 27B (%.0f tok/s/layer)", (long long)n, n / (ms * 1e-3));
    report(name, ms, 4.0 * n * (qk_stride + Hv * dv));
    CK(cudaFree(state)); CK(cudaFree(gb));
  }
  // 6. Attention prefill 4096 tokens (27B, F16 cache).
  {
    const int64_t n = quick ? 1024 : 4096, page = 16, n_pages = n / page;
    void* kc = dalloc(n * 4 * 256 * 2, 7);
    void* vc = dalloc(n * 4 * 256 * 2, 8);
    std::vector<int32_t> hpt(n_pages);
    for (int64_t i = 0; i < n_pages; ++i) hpt[i] = static_cast<int32_t>(i);
    int32_t* pt;
    CK(cudaMalloc(&pt, n_pages * 4));
    CK(cudaMemcpy(pt, hpt.data(), n_pages * 4, cudaMemcpyHostToDevice));
    cpu::PagedKV kv{DType::F16, kc, vc, nullptr, nullptr, page, 4, 256};
    const size_t sb = cuda::attention_paged_scratch_bytes(n, 0, 24, 4, 256);
    void* scr;
    CK(cudaMalloc(&scr, std::max<size_t>(sb, 1)));
    const float ms = time_ms([&](int) { cuda::attention_paged(x, n, 0, 24, kv, pt, 0.0625f, nullptr, out, scr, sb, nullptr); });
    char name[96];
    std::snprintf(name, sizeof name, "attn prefill F16 n=%lld (%.0f tok/s/layer)", (long long)n, n / (ms * 1e-3));
    report(name, ms, 2.0 * n * 4 * 256 * 2 + 8.0 * n * 24 * 256, 4.0 * n * n / 2 * 24 * 256);
  }
  CK(cudaDeviceSynchronize());
  std::printf("bench done\n");
  return 0;
}
