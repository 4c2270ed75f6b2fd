// Lab of the prefill GEMM (native/src/kernels/cuda/linear_gemm.cuh): the kernel before it (v0,
// linear_gemm_v0.cuh) and the new kernel at several tile shapes, on the 27B prefill projections
// with FP8 weights in the model's layout (GEMV tiles of 32 rows, 128 x 128 block scales) and on a
// BF16 weight. Each variant is checked against the CPU reference (cpu::linear) on small awkward
// shapes and against v0 on the big ones (the same fp16 operands: only the fp32 summation order
// differs), then timed (median of --reps, CUDA events).
//
//   v0  128 x 128 x 32 (64 x 128 below 128 tokens), the library's kernel before
//   t1  128 x 256 x 32, 1 block / SM          = the library's tile from 128 tokens
//   t2  128 x 128 x 32, 2 blocks / SM
//   t3   64 x 256 x 32, 1 block / SM          = the library's tile below 128 tokens
//   t4  256 x 128 x 32, 1 block / SM
//   t5  128 x 256 x 64, 1 block / SM (110,592 bytes of shared memory: not for sm_75)
//   t6  t1 with the next x tile stored after the first 16-k products (Tile::SPLIT)
//
// Build: tools/gpu/lab/build.sh (ARCH=75 for the sm_75 path through PTX JIT on a newer GPU);
// run: build/lab/bin/linear_gemm_lab [--tokens 4096] [--reps 10] [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/linear_gemm.cuh"
#include "kernels/ops.h"
#include "linear_gemm_v0.cuh"

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

using namespace pe;
using LaunchFn = void (*)(const float*, int64_t, const WeightView&, float*, cudaStream_t);

namespace {

template <DType DT, class T>
void tile_launch(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t s) {
  cuda::gemm::launch<DT, true, T>(x, n, w, out, s);
}
template <DType DT>
void v0_launch(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t s) {
  cuda::gemm_v0::launch<DT>(true, 128, x, n, w, out, s);
}

struct Variant {
  const char* name;
  LaunchFn fp8, bf16;
};

template <class T>
Variant tile_variant(const char* name) {
  return {name, tile_launch<DType::FP8_E4M3, T>, tile_launch<DType::BF16, T>};
}

const Variant kVariants[] = {
    {"v0", v0_launch<DType::FP8_E4M3>, v0_launch<DType::BF16>},
    tile_variant<cuda::gemm::Tile<128, 256, 32, 1>>("t1 128x256x32"),
    tile_variant<cuda::gemm::Tile<128, 128, 32, 2>>("t2 128x128x32/2"),
    tile_variant<cuda::gemm::Tile<64, 256, 32, 1>>("t3 64x256x32"),
    tile_variant<cuda::gemm::Tile<256, 128, 32, 1>>("t4 256x128x32"),
    tile_variant<cuda::gemm::Tile<128, 256, 64, 1>>("t5 128x256x64"),
    tile_variant<cuda::gemm::Tile<128, 256, 32, 1, true>>("t6 128x256x32 split"),
};

uint64_t g_rng = 0x9E3779B97F4A7C15ull;
uint32_t next_u32() {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return static_cast<uint32_t>(g_rng >> 16);
}
float uniform(float lo, float hi) { return lo + (hi - lo) * (next_u32() & 0xffffff) / float(1 << 24); }

// A host weight (row-major, with its scales) and its device copy in the model's layout.
struct Weight {
  WeightView host, dev;
  std::vector<uint8_t> data;
  std::vector<float> scales;
  void* d_raw = nullptr;
  void* d_tiled = nullptr;
  float* d_scales = nullptr;
};

Weight make_weight(DType dt, int64_t rows, int64_t cols) {
  Weight w;
  const size_t bytes = dtype_bytes_for(dt, rows * cols);
  w.data.resize(bytes);
  if (dt == DType::BF16) {
    for (size_t i = 0; i < bytes / 2; ++i) {
      const float f = uniform(-0.05f, 0.05f);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      w.data[2 * i] = static_cast<uint8_t>(u >> 16);
      w.data[2 * i + 1] = static_cast<uint8_t>(u >> 24);
    }
  } else {
    for (size_t i = 0; i < bytes; ++i) w.data[i] = static_cast<uint8_t>(next_u32()) & 0xbf;  // finite e4m3
  }
  const int64_t nb = ((rows + 127) / 128) * ((cols + 127) / 128);
  w.scales.resize(nb);
  for (auto& s : w.scales) s = uniform(2e-5f, 2e-4f);
  w.host.dtype = dt;
  w.host.rows = rows;
  w.host.cols = cols;
  w.host.data = w.data.data();
  w.host.block_scale = dt == DType::FP8_E4M3 ? w.scales.data() : nullptr;
  CK(cudaMalloc(&w.d_raw, bytes));
  CK(cudaMemcpy(w.d_raw, w.data.data(), bytes, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&w.d_scales, nb * 4));
  CK(cudaMemcpy(w.d_scales, w.scales.data(), nb * 4, cudaMemcpyHostToDevice));
  w.dev = w.host;
  w.dev.data = w.d_raw;
  w.dev.block_scale = dt == DType::FP8_E4M3 ? w.d_scales : nullptr;
  if (dt == DType::FP8_E4M3 && cuda::tile_fits(w.dev, 32)) {  // the model's layout
    CK(cudaMalloc(&w.d_tiled, cuda::tiled_weight_bytes(w.dev, 32)));
    w.dev = cuda::tile_weight(w.dev, w.d_tiled, 32, nullptr);
  }
  return w;
}

void free_weight(Weight& w) {
  CK(cudaFree(w.d_raw));
  if (w.d_tiled) CK(cudaFree(w.d_tiled));
  CK(cudaFree(w.d_scales));
}

std::vector<float> download(const float* d, size_t n) {
  std::vector<float> h(n);
  CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
  return h;
}

// ||a - b|| / ||b||; NaN when a holds a NaN or the poison was left.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return NAN;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

__global__ void err_kernel(const float* a, const float* b, int64_t n, double* sums) {
  double num = 0, den = 0, bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double d = double(a[i]) - b[i];
    bad += !isfinite(a[i]);
    num += d * d;
    den += double(b[i]) * b[i];
  }
  atomicAdd(sums, num);
  atomicAdd(sums + 1, den);
  atomicAdd(sums + 2, bad);
}

// rel_err on the device (the big outputs): NaN where a holds a non-finite value.
double rel_err_dev(const float* a, const float* b, int64_t n) {
  double* d;
  CK(cudaMalloc(&d, 3 * sizeof(double)));
  CK(cudaMemset(d, 0, 3 * sizeof(double)));
  err_kernel<<<1024, 256>>>(a, b, n, d);
  double h[3];
  CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  return h[2] > 0 ? NAN : std::sqrt(h[0] / std::max(h[1], 1e-30));
}

float time_ms(const std::function<void()>& fn, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  fn();
  fn();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    fn();
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

bool fits(const Variant& v) {
  int dev = 0, optin = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return std::strncmp(v.name, "t5", 2) != 0 || optin >= cuda::gemm::Tile<128, 256, 64, 1>::kSmemBytes;
}

// Small shapes against the CPU: every variant, partial tiles on both sides.
int check_small() {
  int bad = 0;
  struct Shape { int64_t n, rows, cols; } shapes[] = {{9, 96, 128}, {130, 300, 256}, {300, 520, 1024}, {257, 64, 2048}};
  for (DType dt : {DType::FP8_E4M3, DType::BF16})
    for (const Shape& s : shapes) {
      Weight w = make_weight(dt, s.rows, s.cols);
      std::vector<float> x(s.n * s.cols), ref(s.n * s.rows);
      for (auto& v : x) v = uniform(-2.0f, 2.0f);
      cpu::linear(x.data(), s.n, w.host, ref.data());
      float *dx, *dout;
      CK(cudaMalloc(&dx, x.size() * 4));
      CK(cudaMalloc(&dout, ref.size() * 4));
      CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
      for (const Variant& v : kVariants) {
        if (!fits(v)) continue;
        CK(cudaMemset(dout, 0xff, ref.size() * 4));  // NaN poison
        (dt == DType::FP8_E4M3 ? v.fp8 : v.bf16)(dx, s.n, w.dev, dout, nullptr);
        CK(cudaDeviceSynchronize());
        const double e = rel_err(download(dout, ref.size()), ref);
        const bool ok = e <= 3e-3;
        bad += !ok;
        std::printf("check %-5s n=%-4lld %5lldx%-5lld%s %-18s err %.2e %s\n", dt == DType::BF16 ? "bf16" : "fp8",
                    (long long)s.n, (long long)s.rows, (long long)s.cols, w.dev.tile ? " tile32" : "       ", v.name, e,
                    ok ? "ok" : "FAIL");
      }
      CK(cudaFree(dx));
      CK(cudaFree(dout));
      free_weight(w);
    }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 4096;
  int reps = 10;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else { std::printf("usage: linear_gemm_lab [--tokens N] [--reps R] [--quick]\n"); return 2; }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, %zu KB shared memory opt-in\n", prop.name, prop.multiProcessorCount,
              prop.sharedMemPerBlockOptin / 1024);
  int bad = check_small();
  // The 27B prefill projections (MODEL_SPEC §1): GDN in (qkv|z|a|b), attention q|k|v, mlp gate|up,
  // GDN out / attention o, mlp down; BF16 once for the mma rate without the FP8 decode.
  struct Big { DType dt; int64_t rows, cols; const char* what; } bigs[] = {
      {DType::FP8_E4M3, 34816, 5120, "gate|up"}, {DType::FP8_E4M3, 16480, 5120, "gdn in"},
      {DType::FP8_E4M3, 5120, 17408, "down"},    {DType::FP8_E4M3, 5120, 6144, "out / o"},
      {DType::FP8_E4M3, 14336, 5120, "q|k|v"},   {DType::BF16, 17408, 5120, "bf16"}};
  std::vector<double> sum_ms(sizeof kVariants / sizeof kVariants[0], 0.0);
  for (const Big& b : bigs) {
    if (quick && b.rows != 34816) continue;
    Weight w = make_weight(b.dt, b.rows, b.cols);
    for (int64_t n : {tokens, int64_t(512)}) {
      std::vector<float> x(n * b.cols);
      for (auto& v : x) v = uniform(-2.0f, 2.0f);
      float *dx, *dout, *dref;
      CK(cudaMalloc(&dx, x.size() * 4));
      CK(cudaMalloc(&dout, n * b.rows * 4));
      CK(cudaMalloc(&dref, n * b.rows * 4));
      CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
      const LaunchFn v0 = b.dt == DType::BF16 ? kVariants[0].bf16 : kVariants[0].fp8;
      v0(dx, n, w.dev, dref, nullptr);
      CK(cudaDeviceSynchronize());
      const double flops = 2.0 * n * b.rows * b.cols;
      for (size_t vi = 0; vi < sizeof kVariants / sizeof kVariants[0]; ++vi) {
        const Variant& v = kVariants[vi];
        if (!fits(v)) continue;
        const LaunchFn fn = b.dt == DType::BF16 ? v.bf16 : v.fp8;
        CK(cudaMemset(dout, 0xff, n * b.rows * 4));
        fn(dx, n, w.dev, dout, nullptr);
        CK(cudaDeviceSynchronize());
        const double e = rel_err_dev(dout, dref, n * b.rows);
        const float ms = time_ms([&] { fn(dx, n, w.dev, dout, nullptr); }, reps);
        if (n == tokens && b.dt == DType::FP8_E4M3) sum_ms[vi] += ms;
        const bool ok = e <= 1e-4;
        bad += !ok;
        std::printf("%-4s %-8s n=%-5lld %5lldx%-5lld %-18s %8.3f ms %7.1f TFLOP/s  vs v0 %.1e %s\n",
                    b.dt == DType::BF16 ? "bf16" : "fp8", b.what, (long long)n, (long long)b.rows,
                    (long long)b.cols, v.name, ms, flops / (ms * 1e-3) / 1e12, e, ok ? "" : "FAIL");
      }
      CK(cudaFree(dx));
      CK(cudaFree(dout));
      CK(cudaFree(dref));
    }
    free_weight(w);
  }
  std::printf("\nFP8 projections at n=%lld, one layer of each (ms summed):\n", (long long)tokens);
  for (size_t vi = 0; vi < sum_ms.size(); ++vi)
    if (sum_ms[vi] > 0) std::printf("  %-18s %8.3f ms\n", kVariants[vi].name, sum_ms[vi]);
  std::printf("%s: %d failures\n", bad ? "FAILED" : "lab ok", bad);
  return bad ? 1 : 0;
}
