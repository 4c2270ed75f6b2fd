// Device memory fills for dummy weights and tests (device_memory.cu), on top of the stream and
// memory of core/cuda_device.h.
#pragma once
#include <cstdint>

#include "core/cuda_device.h"
#include "core/dtype.h"

namespace pe {
namespace cuda {

// Fills n values of `dtype` (F32, F16, BF16, FP8_E4M3) with uniform random numbers in
// [-scale, scale) from a counter-based hash of (seed, index): the same seed gives the same
// tensor on every GPU. For `load_format="dummy"` weights.
void fill_random(void* dst, DType dtype, int64_t n, uint64_t seed, float scale);
void fill_f32(float* dst, int64_t n, float value);

}  // namespace cuda
}  // namespace pe
