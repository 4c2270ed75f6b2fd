// The tensor-core ceiling of each mma.sync shape the library's kernels use, on the GPU it runs on:
// back-to-back independent mma.sync (fp16 in, fp32 accumulate) from every warp of a full grid, no
// memory traffic. m16n8k8 is the only fp16 shape sm_75 has (the first users' RTX 2080 Ti, and what
// an sm_75 build runs on an H100 / H200 by PTX JIT); m16n8k16 is sm_80+. Their rates on an H100 /
// H200 bound what any sm_75-built GEMM can reach there (issue 42's "35 % of the matmul rate").
//   nvcc -O3 -gencode arch=compute_75,code=compute_75 -gencode arch=compute_90,code=sm_90 \
//     -o mma_rate_lab mma_rate_lab.cu && ./mma_rate_lab
// The compute_75 PTX runs on sm_90 only when no sm_90 code is embedded: build a second binary with
// the first -gencode alone for the PTX JIT figure.
#include <cstdio>

#include <cuda_runtime.h>

constexpr int kChains = 8;     // independent accumulators per warp (latency hiding)
constexpr int kIters = 4096;

template <int K>
__global__ void mma_loop(float* out, unsigned seed) {
  unsigned a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = 0x3c003c00u ^ (seed + threadIdx.x + i);  // ~1.0 halves
  for (int i = 0; i < 2; ++i) b[i] = 0x3c003c00u ^ (seed * 7 + threadIdx.x + i);
  float c[kChains][4] = {};
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int j = 0; j < kChains; ++j) {
      if (K == 8) {
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
            : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
            : "r"(a[0]), "r"(a[1]), "r"(b[0]));
      } else {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
      }
    }
  }
  float s = 0.f;
  for (int j = 0; j < kChains; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

template <int K>
double rate(int sms, int ptx_arch) {
  if (K == 16 && ptx_arch < 80) return 0.0;  // not in this binary's code
  const int warps = 8, blocks = sms * 4;
  float* out;
  cudaMalloc(&out, sizeof(float) * blocks * warps * 32);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  mma_loop<K><<<blocks, warps * 32>>>(out, 1);
  cudaEventRecord(e0);
  for (int r = 0; r < 5; ++r) mma_loop<K><<<blocks, warps * 32>>>(out, r);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(out);
  const double flops = 5.0 * blocks * warps * double(kIters) * kChains * (2.0 * 16 * 8 * K);
  return flops / (ms * 1e-3) / 1e12;
}

int main() {
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  cudaFuncAttributes fa;
  cudaFuncGetAttributes(&fa, mma_loop<8>);
  std::printf("%s, %d SMs; this binary's code for mma_loop: ptx %d, binary %d\n", p.name, p.multiProcessorCount,
              fa.ptxVersion * 10, fa.binaryVersion * 10);
  const int arch = fa.ptxVersion * 10;  // the m16n8k16 loop exists only in sm_80+ PTX
  const double k8 = rate<8>(p.multiProcessorCount, arch), k16 = rate<16>(p.multiProcessorCount, arch);
  std::printf("mma.sync m16n8k8  f16 -> f32: %.1f TFLOP/s\n", k8);
  if (k16 > 0) std::printf("mma.sync m16n8k16 f16 -> f32: %.1f TFLOP/s\n", k16);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) std::printf("error: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
