// Raw bytes on a device (host memory or CUDA device memory), owned and freed with the object.
//
// Design: every long-lived allocation of the engine (weights, KV pages, GDN slots, the forward
// workspace) is a Buffer made once at start-up; nothing on the step path allocates. The CUDA side
// goes through core/cuda_device.h so this header needs no CUDA include, and a build without CUDA
// fails with a clear message when a CUDA buffer is asked for.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pe {

enum class Device : int32_t { CPU = 0, CUDA = 1 };

class Buffer {
 public:
  Buffer() = default;
  Buffer(Device d, size_t bytes);  // zero-filled
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }
  Device device() const { return dev_; }
  void reset();

 private:
  Device dev_ = Device::CPU;
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Memory primitives on a device. CUDA calls are queued on the engine's stream (ordered with the
// kernels); copies that involve host memory return once the host side may be reused.
void mem_zero(Device d, void* p, size_t bytes);
void mem_copy(Device d, void* dst, const void* src, size_t bytes);     // within device d
void mem_upload(Device d, void* dst, const void* host, size_t bytes);  // host -> d
void mem_download(Device d, void* host, const void* src, size_t bytes);  // d -> host
// Bytes in use on the device (CUDA: total - free as the driver reports; CPU: 0).
int64_t device_bytes_in_use(Device d);
void device_memory_info(Device d, int64_t* free_bytes, int64_t* total_bytes);  // CPU: 0, 0
bool device_usable(Device d);

}  // namespace pe
