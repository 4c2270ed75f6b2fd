// The CUDA device as the engine uses it, host-callable without CUDA headers: its one stream,
// device memory, copies, page-locked host buffers, stream events, and whether a device is usable.
//
// One stream per process carries every kernel, copy and memset of the engine, so work is ordered
// without events; host-side reads (downloads) synchronize it. It is a non-blocking stream so it
// can be captured into CUDA graphs. Implemented in core/cuda_device.cu (CUDA builds only): core
// owns the device's memory, kernels/ only launch on it.
#pragma once
#include <cstddef>
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace pe {
namespace cuda {

// True when a CUDA device is usable (tests skip otherwise). Never throws.
bool device_available();

cudaStream_t stream();  // the engine's stream (created on first use)
void stream_sync();

void* device_alloc(size_t bytes);  // throws PE_ERR_OUT_OF_MEMORY naming the size and free memory
void device_free(void* p);
void device_memset(void* p, int value, size_t bytes);
void device_copy(void* dst, const void* src, size_t bytes);
// height rows of width_bytes, rows dpitch / spitch bytes apart (device to device).
void device_copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width_bytes, size_t height);
void copy_to_device(void* dst, const void* host, size_t bytes);
void copy_to_host(void* host, const void* src, size_t bytes);  // waits for the stream
void mem_info(size_t* free_bytes, size_t* total_bytes);

// Page-locked host memory: copies between it and the device run asynchronously on the stream, so
// the host never waits for the stream to reach them (pageable copies may). The owner must not
// rewrite or free it while a queued copy still reads or writes it (StreamEvent says when).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};
void upload_async(void* dst, const PinnedBuffer& host, size_t bytes);    // queued on the stream
void download_async(PinnedBuffer& host, const void* src, size_t bytes);  // queued on the stream

// A point in the stream: record() marks the work queued so far, wait() blocks the host until it
// is done (at once when nothing was recorded).
class StreamEvent {
 public:
  StreamEvent() = default;
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  void record();
  void wait();

 private:
  void* ev_ = nullptr;  // cudaEvent_t, made on first record
  bool pending_ = false;
};

}  // namespace cuda
}  // namespace pe
