// Lab of the W8A8 FP8 prefill GEMM on sm_90a (fp8_gemm_sm90.h): the 27B prefill projections with
// FP8 weights (128 x 128 block scales), random data made on the device, x with 1 column in 64 eight
// times larger (outlier channels: what per-token group scales must absorb).
//
// Per shape: every GEMM variant on the same quantized x, checked against a double-accumulating
// reference on the dequantized operands (xq * xs and W * block_scale: only summation order and the
// tensor cores' accumulation inside a 128-k block differ) -> "err dq"; the whole linear (quantize +
// GEMM, kAuto) against the reference on the unquantized x -> "err x" (what W8A8 costs); the
// library's pe::cuda::linear_gemm (this tree's, compiled in; weights in the model's 32-row GEMV
// tile layout, x converted to fp16 inside) against the same -> "err pe". Errors are relative
// Frobenius norms ||y - ref|| / ||ref|| over the checked tokens (every 8th at n = 32768).
// Times: CUDA events, median of --reps (default 20) after 3 warm-up calls, host launch work included.
//
// Build: tools/gpu/lab/fp8_gemm/build.sh DEST; run: fp8_gemm_lab [--reps R] [--quick] [--no-pe]
// [--variants 1,3]: only those GEMM variants (fp8_gemm_sm90.h), "linear" on the first of them
// instead of kAuto; --quick: gate|up at n = 4096 only.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "fp8_gemm_sm90.h"
#ifndef PE_LAB_NO_BASELINE
#include "kernels/cuda/linear_common.cuh"  // tiled_offset (the model's weight layout)
namespace pe {
namespace cuda {
struct GemmWorkspace;  // cuda_ops.h: the sm_90 FP8 path's, not compiled into the baseline here
void linear_gemm(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream,
                 const GemmWorkspace* workspace);  // linear_gemm.cu
}
}  // namespace pe
#endif

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

using namespace pe;
namespace f8 = pe::cuda::fp8sm90;

namespace {

__host__ __device__ inline uint32_t hash(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}
__device__ inline float unit(uint64_t i, uint32_t seed) { return (hash(i, seed) >> 8) * (1.0f / (1 << 24)); }  // [0, 1)

__global__ void init_x(float* x, int64_t n, int64_t cols, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * cols; i += int64_t(gridDim.x) * blockDim.x) {
    const bool outlier = hash(i % cols, seed ^ 0x55u) % 64 == 0;
    x[i] = (2.0f * unit(i, seed) - 1.0f) * (outlier ? 8.0f : 1.0f);
  }
}

// W = e4m3(100 g), g ~ roughly N(0, 1) (sum of three uniforms), so |W| <= 300; scales 2e-5 .. 2e-4.
__global__ void init_w(uint8_t* w, int64_t count, float* scales, int64_t n_scales, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = 2.0f * (unit(3 * i, seed) + unit(3 * i + 1, seed) + unit(3 * i + 2, seed) - 1.5f);
    w[i] = __nv_cvt_float_to_fp8(100.0f * g, __NV_SATFINITE, __NV_E4M3);
    if (i < n_scales) scales[i] = 2e-5f + 1.8e-4f * unit(i, seed ^ 0xabcu);
  }
}

__device__ inline float e4m3(uint8_t b) {
  __nv_fp8_e4m3 v;
  v.__x = b;
  return static_cast<float>(v);
}

// xdq[i, k] = xq[i * tstep, k] * xs[k / 128][i * tstep]: the GEMM's activation operand, dequantized.
__global__ void dequant_x(const uint8_t* xq, const float* xs, int64_t ld, int64_t m, int64_t tstep, int64_t cols,
                          float* xdq) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * cols; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, k = i % cols, t = r * tstep;
    xdq[i] = e4m3(xq[t * cols + k]) * xs[(k / 128) * ld + t];
  }
}

// y[m, rows] = a[m, cols] (row stride lda) * dequant(W)^T, products and sums in double. 64 x 64
// outputs a block, 4 x 4 a thread.
__global__ void __launch_bounds__(256) ref_gemm(const float* a, int64_t lda, int64_t m, const uint8_t* w,
                                                const float* wscale, int64_t rows, int64_t cols, float* y) {
  __shared__ float sa[16][65], sw[16][65];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t m0 = blockIdx.y * 64ll, r0 = blockIdx.x * 64ll, kb = (cols + 127) / 128;
  double acc[4][4] = {};
  for (int64_t k0 = 0; k0 < cols; k0 += 16) {
    for (int i = threadIdx.x; i < 64 * 16; i += 256) {
      const int rr = i / 16, kk = i % 16;
      const int64_t k = k0 + kk, t = m0 + rr, r = r0 + rr;
      sa[kk][rr] = t < m && k < cols ? a[t * lda + k] : 0.0f;
      sw[kk][rr] = r < rows && k < cols ? e4m3(w[r * cols + k]) * wscale[(r / 128) * kb + k / 128] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += double(sa[kk][ty + 16 * i]) * double(sw[kk][tx + 16 * j]);
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const int64_t t = m0 + ty + 16 * i, r = r0 + tx + 16 * j;
      if (t < m && r < rows) y[t * rows + r] = static_cast<float>(acc[i][j]);
    }
}

__global__ void err_kernel(const float* out, int64_t tstep, const float* ref, int64_t m, int64_t rows, double* sums) {
  double num = 0, den = 0, bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * rows; i += int64_t(gridDim.x) * blockDim.x) {
    const float o = out[(i / rows) * tstep * rows + i % rows];
    const double d = double(o) - ref[i];
    bad += !isfinite(o);
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  atomicAdd(sums, num);
  atomicAdd(sums + 1, den);
  atomicAdd(sums + 2, bad);
}

// ||out rows 0, tstep, 2 tstep, .. - ref|| / ||ref||; NaN where out holds a non-finite value.
double rel_err(const float* out, int64_t tstep, const float* ref, int64_t m, int64_t rows) {
  double* d;
  CK(cudaMalloc(&d, 3 * sizeof(double)));
  CK(cudaMemset(d, 0, 3 * sizeof(double)));
  err_kernel<<<1024, 256>>>(out, tstep, ref, m, rows, d);
  double h[3];
  CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  return h[2] > 0 ? NAN : std::sqrt(h[0] / std::max(h[1], 1e-300));
}

float time_ms(const std::function<void()>& fn, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
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
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

unsigned grid(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 132 * 32)); }

#ifndef PE_LAB_NO_BASELINE
__global__ void tile32_kernel(const uint4* src, uint4* dst, int64_t rows, int64_t row_bytes) {
  const int64_t chunks = row_bytes / 16;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * chunks; i += int64_t(gridDim.x) * blockDim.x)
    dst[cuda::tiled_offset(i / chunks, (i % chunks) * 16, row_bytes, 32) / 16] = src[i];
}
#endif

struct Shape {
  int64_t rows, cols;
  const char* what;
};

struct Opts {
  int reps = 20;
  bool quick = false, pe = true, sweep = false;
  unsigned variants = ~0u;     // bit v: run variant v
  int32_t lin_variant = f8::kAuto;  // the variant "linear" runs (--variants: the first listed)
};

const double kTolDq = 2e-3, kTolX = 0.1, kTolPe = 1e-2;

// One shape at n tokens: returns failures; adds the fp8 linear's and pe's ms to the sums.
int run_shape(const Shape& s, int64_t n, const Opts& o, bool print_variants, double* sum_fp8, double* sum_pe) {
  const int64_t rows = s.rows, cols = s.cols, kb = (cols + 127) / 128, nb = (rows + 127) / 128;
  const int64_t tstep = n > 4096 ? 8 : 1, m = (n + tstep - 1) / tstep;  // tokens checked
  float *x, *out, *ref_dq, *ref_x, *xdq, *wscale;
  uint8_t* w;
  void* ws;
  const size_t ws_bytes = f8::workspace_bytes(n, rows, cols);
  CK(cudaMalloc(&x, n * cols * 4));
  CK(cudaMalloc(&out, n * rows * 4));
  CK(cudaMalloc(&ref_dq, m * rows * 4));
  CK(cudaMalloc(&ref_x, m * rows * 4));
  CK(cudaMalloc(&xdq, m * cols * 4));
  CK(cudaMalloc(&w, rows * cols));
  CK(cudaMalloc(&wscale, nb * kb * 4));
  CK(cudaMalloc(&ws, ws_bytes));
  init_x<<<grid(n * cols), 256>>>(x, n, cols, 1234u + uint32_t(rows));
  init_w<<<grid(rows * cols), 256>>>(w, rows * cols, wscale, nb * kb, 777u + uint32_t(rows));
  WeightView wv;
  wv.dtype = DType::FP8_E4M3;
  wv.rows = rows;
  wv.cols = cols;
  wv.data = w;
  wv.block_scale = wscale;
  wv.block = 128;
  // The workspace's quantized x, as linear lays it out (fp8_gemm_sm90.cu, linear).
  auto al = [](size_t b) { return (b + 255) / 256 * 256; };
  uint8_t* xq = static_cast<uint8_t*>(ws);
  float* xs = reinterpret_cast<float*>(xq + al(size_t(n) * cols));
  void* gws = reinterpret_cast<uint8_t*>(xs) + al(size_t(kb) * f8::scale_ld(n) * 4);
  CK(cudaMemset(out, 0xff, n * rows * 4));  // NaN poison
  const int32_t lin_rc = f8::linear(x, n, wv, out, ws, ws_bytes, o.lin_variant, nullptr);
  CK(cudaDeviceSynchronize());
  int bad = lin_rc != 0;  // the variants below still run (xq, xs are there unless quantize_x failed)
  const unsigned by = static_cast<unsigned>((m + 63) / 64), bx = static_cast<unsigned>((rows + 63) / 64);
  dequant_x<<<grid(m * cols), 256>>>(xq, xs, f8::scale_ld(n), m, tstep, cols, xdq);
  ref_gemm<<<dim3(bx, by), 256>>>(xdq, cols, m, w, wscale, rows, cols, ref_dq);
  ref_gemm<<<dim3(bx, by), 256>>>(x, tstep * cols, m, w, wscale, rows, cols, ref_x);
  CK(cudaDeviceSynchronize());
  const double flops = 2.0 * n * rows * cols;
  auto tf = [&](float ms) { return flops / (ms * 1e-3) / 1e12; };
  const double err_x = rel_err(out, tstep, ref_x, m, rows);
  const float quant_ms = time_ms([&] { f8::quantize_x(x, n, cols, xq, xs, nullptr); }, o.reps);
  const float lin_ms = time_ms([&] { f8::linear(x, n, wv, out, ws, ws_bytes, o.lin_variant, nullptr); }, o.reps);
  bad += !(err_x <= kTolX);
  // Every variant on the same xq / xs; the last one run leaves out for err dq.
  char vbuf[512] = "";
  if (lin_rc) std::snprintf(vbuf, sizeof vbuf, " linear rc=%d |", lin_rc);
  double err_dq = 0;
  for (int32_t v = f8::kCoop128; v < f8::kNumVariants; ++v) {
    if (!(o.variants >> v & 1)) continue;
    CK(cudaMemset(out, 0xff, n * rows * 4));
    const int32_t rc = f8::gemm(xq, xs, n, wv, out, gws, v, nullptr);
    CK(cudaDeviceSynchronize());
    if (rc) {
      std::snprintf(vbuf + std::strlen(vbuf), sizeof vbuf - std::strlen(vbuf), " %s rc=%d |", f8::variant_name(v), rc);
      ++bad;
      continue;
    }
    const double e = rel_err(out, tstep, ref_dq, m, rows);
    err_dq = std::isnan(e) || std::isnan(err_dq) ? NAN : std::max(err_dq, e);
    const float ms = time_ms([&] { f8::gemm(xq, xs, n, wv, out, gws, v, nullptr); }, o.reps);
    if (print_variants)
      std::snprintf(vbuf + std::strlen(vbuf), sizeof vbuf - std::strlen(vbuf), " %s %.3f %.0f |", f8::variant_name(v),
                    ms, tf(ms));
  }
  bad += !(err_dq <= kTolDq);
  float pe_ms = NAN;
  double err_pe = NAN;
#ifndef PE_LAB_NO_BASELINE
  if (o.pe && n > 8) {  // the library's GEMM takes n > 8 (the GEMV below)
    uint8_t* wt = nullptr;
    WeightView wtv = wv;
    if (cols % 128 == 0) {  // the 32-row tile layout needs rows of a multiple of 4096 / 32 bytes
      const int64_t rows32 = (rows + 31) / 32 * 32;
      CK(cudaMalloc(&wt, rows32 * cols));
      CK(cudaMemset(wt, 0, rows32 * cols));
      tile32_kernel<<<grid(rows * cols / 16), 256>>>(reinterpret_cast<const uint4*>(w), reinterpret_cast<uint4*>(wt),
                                                     rows, cols);
      wtv.data = wt;
      wtv.tile = 32;
    }
    CK(cudaMemset(out, 0xff, n * rows * 4));
    cuda::linear_gemm(x, n, wtv, out, nullptr, nullptr);
    CK(cudaDeviceSynchronize());
    err_pe = rel_err(out, tstep, ref_x, m, rows);
    bad += !(err_pe <= kTolPe);
    pe_ms = time_ms([&] { cuda::linear_gemm(x, n, wtv, out, nullptr, nullptr); }, o.reps);
    if (wt) CK(cudaFree(wt));
  }
#endif
  *sum_fp8 += lin_ms;
  *sum_pe += pe_ms;
  std::printf("%-8s n=%-5lld %5lldx%-5lld | quant %.3f |%s linear %.3f ms %.0f TF | pe %.3f ms %.0f TF | x%.2f | "
              "err dq %.1e x %.1e pe %.1e %s\n",
              s.what, (long long)n, (long long)rows, (long long)cols, quant_ms, vbuf, lin_ms, tf(lin_ms), pe_ms,
              tf(pe_ms), pe_ms / lin_ms, err_dq, err_x, err_pe, bad ? "FAIL" : "ok");
  std::fflush(stdout);
  for (void* p : {(void*)x, (void*)out, (void*)ref_dq, (void*)ref_x, (void*)xdq, (void*)w, (void*)wscale, ws})
    CK(cudaFree(p));
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) o.reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--quick")) o.quick = true;
    else if (!std::strcmp(argv[i], "--no-pe")) o.pe = false;
    else if (!std::strcmp(argv[i], "--sweep")) o.sweep = true;
    else if (!std::strcmp(argv[i], "--variants") && i + 1 < argc) {  // e.g. 2,4
      o.variants = 0;
      for (const char* p = argv[++i]; *p; ++p)
        if (*p >= '1' && *p < '0' + f8::kNumVariants) {
          if (!o.variants) o.lin_variant = *p - '0';
          o.variants |= 1u << (*p - '0');
        }
    } else {
      std::printf("usage: fp8_gemm_lab [--reps R] [--quick] [--no-pe] [--sweep] [--variants 1,2,..]\n");
      return 2;
    }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s (sm_%d%d), %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("needs sm_90 (the kernels are sm_90a)\n");
    return 2;
  }
  std::printf("columns: shape n=tokens rows x cols | quant ms | per GEMM variant: ms TFLOP/s | linear (quant + auto "
              "GEMM) | pe::cuda::linear_gemm | pe ms / linear ms | rel. Frobenius errors\n");
  int bad = 0;
  double s8 = 0, spe = 0;
  // Small shapes: partial row / k blocks, n not a multiple of 4 (scale padding), the 64-token tile.
  const Shape small[] = {{96, 1040, "check"}, {300, 256, "check"}, {520, 2048, "check"}, {128, 128, "check"}};
  const int64_t small_n[] = {9, 130, 257, 1};
  for (int i = 0; i < 4 && !o.quick; ++i) bad += run_shape(small[i], small_n[i], o, false, &s8, &spe);
  // The 27B prefill projections (linear_gemm_lab.cu): GDN in (qkv|z|a|b), attention q|k|v, mlp
  // gate|up, GDN out / attention o, mlp down.
  const Shape bigs[] = {{34816, 5120, "gate|up"}, {16480, 5120, "gdn in"}, {5120, 17408, "down"},
                        {5120, 6144, "out / o"},  {14336, 5120, "q|k|v"}};
  // --sweep: the step sizes of a paced prefill (a slice beside decode rows): where the 128-token
  // tiles' staircase falls and which variant runs small n best; one layer's projections per n.
  if (o.sweep) {
    for (int64_t n : {128, 136, 192, 256, 264, 320, 384, 392, 448, 512, 520}) {
      s8 = spe = 0;
      for (const Shape& s : bigs) bad += run_shape(s, n, o, true, &s8, &spe);
      std::printf("n=%lld, one layer: fp8 linear %.3f ms\n", (long long)n, s8);
    }
    std::printf("%s: %d failures\n", bad ? "FAILED" : "lab ok", bad);
    return bad ? 1 : 0;
  }
  s8 = spe = 0;
  for (const Shape& s : bigs) {
    bad += run_shape(s, 4096, o, true, &s8, &spe);
    if (o.quick) break;
  }
  const double s8_4k = s8, spe_4k = spe;
  if (!o.quick)
    for (int64_t n : {int64_t(512), int64_t(32768)}) bad += run_shape(bigs[0], n, o, true, &s8, &spe);
  std::printf("n=4096, one layer of each projection above: fp8 linear %.3f ms, pe %.3f ms (x%.2f)\n", s8_4k, spe_4k,
              spe_4k / s8_4k);
  std::printf("%s: %d failures\n", bad ? "FAILED" : "lab ok", bad);
  return bad ? 1 : 0;
}
