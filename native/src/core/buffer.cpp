#include "core/buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/error.h"
#ifdef PE_WITH_CUDA
#include "core/cuda_device.h"
#endif

namespace pe {

#ifndef PE_WITH_CUDA
[[noreturn]] static void no_cuda() {
  fail(PE_ERR_UNSUPPORTED, "this build of pyengine has no CUDA backend (built without nvcc)");
}
#endif

Buffer::Buffer(Device d, size_t bytes) : dev_(d), n_(bytes) {
  if (bytes == 0) return;
  if (d == Device::CPU) {
    p_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p_) fail(PE_ERR_OUT_OF_MEMORY, "cannot allocate ", bytes, " bytes of host memory");
    std::memset(p_, 0, bytes);
    return;
  }
#ifdef PE_WITH_CUDA
  p_ = cuda::device_alloc(bytes);
  cuda::device_memset(p_, 0, bytes);
#else
  no_cuda();
#endif
}

void Buffer::reset() {
  if (p_) {
    if (dev_ == Device::CPU) std::free(p_);
#ifdef PE_WITH_CUDA
    else cuda::device_free(p_);
#endif
  }
  p_ = nullptr;
  n_ = 0;
}

Buffer::~Buffer() { reset(); }

Buffer::Buffer(Buffer&& o) noexcept : dev_(o.dev_), p_(o.p_), n_(o.n_) {
  o.p_ = nullptr;
  o.n_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    dev_ = o.dev_;
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

void mem_zero(Device d, void* p, size_t bytes) {
  if (bytes == 0) return;
  if (d == Device::CPU) return void(std::memset(p, 0, bytes));
#ifdef PE_WITH_CUDA
  cuda::device_memset(p, 0, bytes);
#else
  no_cuda();
#endif
}

void mem_copy(Device d, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (d == Device::CPU) return void(std::memcpy(dst, src, bytes));
#ifdef PE_WITH_CUDA
  cuda::device_copy(dst, src, bytes);
#else
  no_cuda();
#endif
}

void mem_upload(Device d, void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return;
  if (d == Device::CPU) return void(std::memcpy(dst, host, bytes));
#ifdef PE_WITH_CUDA
  cuda::copy_to_device(dst, host, bytes);
#else
  no_cuda();
#endif
}

void mem_download(Device d, void* host, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (d == Device::CPU) return void(std::memcpy(host, src, bytes));
#ifdef PE_WITH_CUDA
  cuda::copy_to_host(host, src, bytes);
#else
  no_cuda();
#endif
}

int64_t device_bytes_in_use(Device d) {
  if (d == Device::CPU) return 0;
#ifdef PE_WITH_CUDA
  size_t free_b = 0, total_b = 0;
  cuda::mem_info(&free_b, &total_b);
  return static_cast<int64_t>(total_b - free_b);
#else
  return 0;
#endif
}

void device_memory_info(Device d, int64_t* free_bytes, int64_t* total_bytes) {
  *free_bytes = *total_bytes = 0;
  if (d == Device::CPU) return;
#ifdef PE_WITH_CUDA
  size_t f = 0, t = 0;
  cuda::mem_info(&f, &t);
  *free_bytes = static_cast<int64_t>(f);
  *total_bytes = static_cast<int64_t>(t);
#endif
}

bool device_usable(Device d) {
  if (d == Device::CPU) return true;
#ifdef PE_WITH_CUDA
  return cuda::device_available();
#else
  return false;
#endif
}

}  // namespace pe
