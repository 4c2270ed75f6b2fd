// Device memory and the engine's CUDA stream (host-callable; no CUDA headers needed).
//
// One stream per process carries every kernel, copy and memset of the engine, so work is ordered
// without events; host-side reads (downloads) synchronize it. It is a non-blocking stream so it
// can be captured into CUDA graphs.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

typedef struct CUstream_st* cudaStream_t;

namespace pe {
namespace cuda {

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

// Fills n values of `dtype` (F32, F16, BF16, FP8_E4M3) with uniform random numbers in
// [-scale, scale) from a counter-based hash of (seed, index): the same seed gives the same
// tensor on every GPU. For `load_format="dummy"` weights.
void fill_random(void* dst, DType dtype, int64_t n, uint64_t seed, float scale);
void fill_f32(float* dst, int64_t n, float value);

}  // namespace cuda
}  // namespace pe
