#include "core/cuda_device.h"

#include "core/cuda_check.cuh"

namespace pe {
namespace cuda {

bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

cudaStream_t stream() {
  static cudaStream_t s = [] {
    cudaStream_t st = nullptr;
    PE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    return st;
  }();
  return s;
}

void stream_sync() { PE_CUDA_CHECK(cudaStreamSynchronize(stream())); }

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail(PE_ERR_OUT_OF_MEMORY, "cannot allocate ", bytes, " bytes of device memory (", free_b, " of ", total_b,
         " bytes free): ", cudaGetErrorString(e));
  }
  return p;
}

void device_free(void* p) {
  // Pending work may still use p: order the free after it.
  cudaStreamSynchronize(stream());
  cudaFree(p);
}

void device_memset(void* p, int value, size_t bytes) {
  PE_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, stream()));
}

void device_copy(void* dst, const void* src, size_t bytes) {
  PE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void device_copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width_bytes, size_t height) {
  if (height == 0 || width_bytes == 0) return;
  PE_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width_bytes, height, cudaMemcpyDeviceToDevice, stream()));
}

void copy_to_device(void* dst, const void* host, size_t bytes) {
  // From pageable memory the call returns once `host` may be reused.
  PE_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream()));
}

void copy_to_host(void* host, const void* src, size_t bytes) {
  PE_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream()));
  PE_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void mem_info(size_t* free_bytes, size_t* total_bytes) {
  PE_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

PinnedBuffer::PinnedBuffer(size_t bytes) : n_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaHostAlloc(&p_, bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    p_ = nullptr;
    n_ = 0;
    fail(PE_ERR_OUT_OF_MEMORY, "cannot allocate ", bytes, " bytes of page-locked host memory: ", cudaGetErrorString(e));
  }
}

PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
  o.p_ = nullptr;
  o.n_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFreeHost(p_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

void upload_async(void* dst, const PinnedBuffer& host, size_t bytes) {
  if (bytes > host.size()) fail(PE_ERR_INTERNAL, "upload_async: ", bytes, " bytes from a pinned buffer of ", host.size());
  PE_CUDA_CHECK(cudaMemcpyAsync(dst, host.data(), bytes, cudaMemcpyHostToDevice, stream()));
}

void download_async(PinnedBuffer& host, const void* src, size_t bytes) {
  if (bytes > host.size())
    fail(PE_ERR_INTERNAL, "download_async: ", bytes, " bytes into a pinned buffer of ", host.size());
  PE_CUDA_CHECK(cudaMemcpyAsync(host.data(), src, bytes, cudaMemcpyDeviceToHost, stream()));
}

StreamEvent::~StreamEvent() {
  if (ev_) cudaEventDestroy(static_cast<cudaEvent_t>(ev_));
}

void StreamEvent::record() {
  if (!ev_) {
    cudaEvent_t e = nullptr;
    PE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ev_ = e;
  }
  PE_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev_), stream()));
  pending_ = true;
}

void StreamEvent::wait() {
  if (!pending_) return;
  pending_ = false;
  PE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(ev_)));
}

}  // namespace cuda
}  // namespace pe
