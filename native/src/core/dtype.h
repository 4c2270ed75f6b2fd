// Element types of weights, activations and caches, and scalar conversions between them.
// Values of DType are part of the C API (PE_DTYPE_* in pyengine.h): keep them in sync.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pe {

enum class DType : int32_t {
  F32 = 0,
  F16 = 1,
  BF16 = 2,
  FP8_E4M3 = 3,  // OCP e4m3fn: bias 7, no infinities, 0x7f/0xff are NaN, max 448
  I8 = 4,
  I32 = 5,
  NVFP4 = 6,  // e2m1 values, two per byte (low nibble first)
};

// Bytes per element; NVFP4 reports 0 (use dtype_bytes_for).
size_t dtype_size(DType t);
// Bytes for n elements (rounds NVFP4 up to whole bytes).
size_t dtype_bytes_for(DType t, int64_t n);
const char* dtype_name(DType t);
bool dtype_valid(int32_t t);

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);    // round to nearest even, overflow to inf
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);   // round to nearest even, NaN kept NaN
float fp8e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8e4m3(float f); // round to nearest even, saturates at +-448
float fp4e2m1_to_f32(uint8_t nibble);
uint8_t f32_to_fp4e2m1(float f); // nearest of {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating

// Converts n elements of `src` (type t) to fp32.
void to_f32(DType t, const void* src, int64_t n, float* dst);

}  // namespace pe
