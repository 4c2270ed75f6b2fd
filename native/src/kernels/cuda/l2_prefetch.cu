// L2 prefetch of a weight the stream reads soon, issued while latency-bound kernels leave the
// memory idle (cuda_ops.h l2_prefetch). A link of the stream's PDL chain: it lets its successor
// start at once and completes only after its predecessor, so the order of the kernels around it
// holds as if it were not there.
#include <algorithm>

#include "core/env.h"
#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kLinesPerThread = 8;

// after_wait: the prefetches go out once the previous kernel has completed (they would compete
// with its loads, and it could evict them), else at once.
__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(L2Lines r, bool after_wait) {
  pdl_trigger();  // the next kernel may start now: nothing it reads is written here
  if (after_wait) pdl_wait();
  prefetch_lines(r, blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x, static_cast<int64_t>(gridDim.x) * kThreads);
  pdl_wait();  // complete only after the previous kernel: the next one's pdl_wait covers it too
}

}  // namespace

int l2_prefetch_pct() {
  static const int pct = std::clamp(env_int("PYENGINE_L2_PREFETCH_PCT", kL2PrefetchPct), 0, 100);
  return pct;
}

int l2_prefetch_mode() {
  static const int mode = std::clamp(env_int("PYENGINE_L2_PREFETCH_MODE", kL2PrefetchMode), 0, 2);
  return mode;
}

L2Lines l2_lines(const void* p, size_t bytes) {
  const int pct = l2_prefetch_pct();
  if (!p || bytes == 0 || pct == 0 || !pdl_enabled()) return {};
  const size_t cap = static_cast<size_t>(l2_cache_bytes()) / 100 * static_cast<size_t>(pct);
  // Whole lines from the one holding p, none past the last byte of [p, p + min(bytes, cap)).
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / kL2Line * kL2Line;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + std::min(bytes, cap);
  return {reinterpret_cast<const char*>(first), static_cast<int64_t>((end - first + kL2Line - 1) / kL2Line)};
}

void l2_prefetch(const void* p, size_t bytes, cudaStream_t stream) {
  const L2Lines r = l2_lines(p, bytes);
  if (r.lines == 0) return;
  const int64_t per_block = static_cast<int64_t>(kThreads) * kLinesPerThread;
  const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>((r.lines + per_block - 1) / per_block, 1, sm_count()));
  launch_ex(true, l2_prefetch_kernel, dim3(grid), dim3(kThreads), 0, stream, r, l2_prefetch_mode() != 0);
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
