// Shared by the test_cuda_*.cpp executables: device buffers, NaN poisoning, the error report and
// a main() that prints "SKIP: no CUDA device" and exits 0 where no GPU is present.
// Every test compares a CUDA op with its CPU twin (kernels/cpu) on the same inputs.
#pragma once
#define PE_TEST_NO_MAIN
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/cuda/cuda_ops.h"

namespace pe_test {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Waits for the device and surfaces asynchronous kernel errors.
inline void sync() { cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

// A device array of n T's; poison() fills every byte with 0xff (NaN for floats, -1 for ints).
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) {
    cuda_ok(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    poison();
  }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { if (p) cudaFree(p); }
  void upload(const std::vector<T>& h) {
    cuda_ok(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  void poison() { cuda_ok(cudaMemset(p, 0xff, std::max<size_t>(n, 1) * sizeof(T)), "poison"); }
  std::vector<T> download() const {
    sync();
    std::vector<T> h(n);
    cuda_ok(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

// Bytes of a host buffer copied to the device (weights, caches).
struct DevBytes {
  DevBuf<uint8_t> b;
  explicit DevBytes(const void* src, size_t n) : b(n) {
    cuda_ok(cudaMemcpy(b.p, src, n, cudaMemcpyHostToDevice), "upload bytes");
  }
};

inline int64_t count_nan(const std::vector<float>& v) {
  int64_t c = 0;
  for (float x : v) c += std::isnan(x) ? 1 : 0;
  return c;
}

// Compares gpu with the CPU reference: every element written (no poison NaN left), normalized
// error within tol. Prints one line per case so the device logs show the numbers.
inline void expect_close(const char* op, const std::string& cfg, const std::vector<float>& gpu,
                         const std::vector<float>& cpu, double tol, const char* file, int line) {
  const int64_t n = static_cast<int64_t>(cpu.size());
  const int64_t bad = count_nan(gpu) - count_nan(cpu);
  const Error e = compare(gpu.data(), cpu.data(), n);
  const bool ok = bad == 0 && gpu.size() == cpu.size() && e.rel <= tol;
  std::printf("  %-16s %-44s rel %.2e  max_abs %.2e  %s\n", op, cfg.c_str(), e.rel, e.max_abs,
              ok ? "ok" : "FAIL");
  if (!ok) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s %s: rel %.3g > %.3g or %lld unwritten", op, cfg.c_str(),
                  e.rel, tol, static_cast<long long>(bad));
    fail(file, line, buf);
  }
}

}  // namespace pe_test

#define EXPECT_CLOSE(op, cfg, gpu, cpu, tol) \
  pe_test::expect_close(op, cfg, gpu, cpu, tol, __FILE__, __LINE__)

// Small sizes only (PE_TEST_SMALL=1): the compute-sanitizer runs.
inline bool small_only() {
  const char* e = std::getenv("PE_TEST_SMALL");
  return e && *e && *e != '0';
}

inline std::string cfgs(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string cfgs(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

int main(int argc, char** argv) {
  if (!pe::cuda::device_available()) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  return pe_test::run_all(argc, argv);
}
