// On-load quantizer (model/quantize.h): F32/F16/BF16 -> I8 (row scales), FP8 e4m3 (128x128 block
// scales), NVFP4 (e4m3 group scales + fp32 global scale).
//
// Each parallel task decodes its rows to fp32 once (a few KB of scratch per row, per task) and
// quantizes from there, so the source is read once per pass (NVFP4 takes two passes: the global
// absmax, then the groups). The e2m1 and e4m3 roundings are branch-free inline copies of
// dtype.cpp's (same codes, ties to even; the test checks them against dtype.cpp), so the inner
// loops vectorize.
#include "model/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/threadpool.h"

namespace pe {
namespace {

constexpr int64_t kFp8Block = 128;
constexpr float kI8Max = 127.0f, kFp8Max = 448.0f, kFp4Max = 6.0f;

// Rows [row0, row0 + nr) of src as fp32 into dst.
void decode_rows(const WeightView& src, int64_t row0, int64_t nr, float* dst) {
  const size_t es = dtype_size(src.dtype);
  to_f32(src.dtype, static_cast<const char*>(src.data) + static_cast<size_t>(row0 * src.cols) * es,
         nr * src.cols, dst);
}

// max |v| over n values; throws on NaN / inf (a scale computed from them would poison the row).
float absmax(const float* v, int64_t n) {
  float m = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    finite &= a <= FLT_MAX;
    m = a > m ? a : m;
  }
  if (!finite) throw std::invalid_argument("quantize_matrix: the source holds a NaN or inf");
  return m;
}

inline float scale_for(float amax, float qmax) { return amax > 0.0f ? amax / qmax : 1.0f; }

// e2m1 code of v (already divided by its scale): nearest of {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to
// the even code, saturating; same result as f32_to_fp4e2m1 for finite v.
inline uint8_t fp4_code(float v) {
  const float a = std::fabs(v);
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                   (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>(code | (std::signbit(v) ? 8 : 0));
}

// f32_to_fp8e4m3 for finite v (the sources are checked), inline and branch-free so the block
// loop vectorizes: nearest even on the bits for normals, on v * 2^9 for subnormals, saturating.
inline uint8_t fp8_code(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  const uint32_t normal = std::min<uint32_t>(((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3), 0x7eu);
  const uint32_t sub = static_cast<uint32_t>(std::nearbyint(std::fabs(v) * 512.0f));
  const uint32_t code = a >= 0x43e00000u ? 0x7eu : a >= 0x3c800000u ? normal : sub;
  return static_cast<uint8_t>(sign | code);
}

// Rows per parallel chunk so that a chunk carries ~64K values.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(cols, 1)); }

void quantize_i8(const WeightView& src, QuantizedMatrix& q) {
  const int64_t cols = q.cols;
  q.data.resize(static_cast<size_t>(q.rows * cols));
  q.scales.resize(static_cast<size_t>(q.rows));
  parallel_for(
      q.rows,
      [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = begin; r < end; ++r) {
          decode_rows(src, r, 1, row.data());
          const float s = scale_for(absmax(row.data(), cols), kI8Max);
          q.scales[r] = s;
          int8_t* d = reinterpret_cast<int8_t*>(q.data.data()) + r * cols;
          for (int64_t j = 0; j < cols; ++j) {
            const float v = std::nearbyint(row[j] / s);  // |v| <= 127 by construction
            d[j] = static_cast<int8_t>(std::min(kI8Max, std::max(-kI8Max, v)));
          }
        }
      },
      row_grain(cols));
}

void quantize_fp8(const WeightView& src, QuantizedMatrix& q) {
  const int64_t rows = q.rows, cols = q.cols, B = q.block;
  const int64_t row_blocks = (rows + B - 1) / B, col_blocks = (cols + B - 1) / B;
  q.data.resize(static_cast<size_t>(rows * cols));
  q.scales.resize(static_cast<size_t>(row_blocks * col_blocks));
  parallel_for(row_blocks, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(static_cast<size_t>(B * cols));
    for (int64_t rb = begin; rb < end; ++rb) {
      const int64_t row0 = rb * B, nr = std::min(B, rows - row0);
      decode_rows(src, row0, nr, buf.data());
      for (int64_t cb = 0; cb < col_blocks; ++cb) {
        const int64_t c0 = cb * B, nc = std::min(B, cols - c0);
        float m = 0.0f;
        for (int64_t r = 0; r < nr; ++r) m = std::max(m, absmax(buf.data() + r * cols + c0, nc));
        const float s = scale_for(m, kFp8Max);
        q.scales[rb * col_blocks + cb] = s;
        for (int64_t r = 0; r < nr; ++r) {
          const float* v = buf.data() + r * cols + c0;
          uint8_t* d = q.data.data() + (row0 + r) * cols + c0;
          for (int64_t j = 0; j < nc; ++j) d[j] = fp8_code(v[j] / s);
        }
      }
    }
  });
}

void quantize_nvfp4(const WeightView& src, QuantizedMatrix& q) {
  const int64_t rows = q.rows, cols = q.cols, groups = cols / 16;
  // Pass 1: the global absmax (per-row maxima, then their max: deterministic).
  std::vector<float> row_max(static_cast<size_t>(rows));
  parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = begin; r < end; ++r) {
          decode_rows(src, r, 1, row.data());
          row_max[r] = absmax(row.data(), cols);
        }
      },
      row_grain(cols));
  const float amax = *std::max_element(row_max.begin(), row_max.end());
  const float global = scale_for(amax, kFp8Max * kFp4Max);
  q.global_scale = global;
  q.data.assign(static_cast<size_t>(rows * cols / 2), 0);
  q.group_scale.resize(static_cast<size_t>(rows * groups));
  // Pass 2: group scales and codes.
  parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = begin; r < end; ++r) {
          decode_rows(src, r, 1, row.data());
          uint8_t* d = q.data.data() + r * (cols / 2);
          for (int64_t g = 0; g < groups; ++g) {
            const float* v = row.data() + 16 * g;
            const uint8_t gs = f32_to_fp8e4m3(absmax(v, 16) / kFp4Max / global);
            q.group_scale[r * groups + g] = gs;
            const float s = fp8e4m3_to_f32(gs) * global;
            if (s == 0.0f) continue;  // the group underflows the e4m3 scale: all codes 0
            for (int j = 0; j < 16; j += 2)
              d[8 * g + j / 2] = static_cast<uint8_t>(fp4_code(v[j] / s) |
                                                      (fp4_code(v[j + 1] / s) << 4));
          }
        }
      },
      row_grain(cols));
}

}  // namespace

WeightView QuantizedMatrix::view() const {
  WeightView w;
  w.dtype = dtype;
  w.rows = rows;
  w.cols = cols;
  w.data = data.data();
  w.block = block;
  if (dtype == DType::FP8_E4M3) w.block_scale = scales.data();
  if (dtype == DType::I8) w.row_scale = scales.data();
  if (dtype == DType::NVFP4) {
    w.group_scale = group_scale.data();
    w.global_scale = global_scale;
  }
  return w;
}

QuantizedMatrix quantize_matrix(const WeightView& src, DType target) {
  const std::string where = std::string("quantize_matrix(") + dtype_name(src.dtype) + " -> " +
                            dtype_name(target) + "): ";
  if (src.dtype != DType::F32 && src.dtype != DType::F16 && src.dtype != DType::BF16)
    throw std::invalid_argument(where + "the source must be f32, f16 or bf16");
  if (target != DType::I8 && target != DType::FP8_E4M3 && target != DType::NVFP4)
    throw std::invalid_argument(where + "the target must be i8, fp8_e4m3 or nvfp4");
  if (src.rows < 0 || src.cols < 0) throw std::invalid_argument(where + "negative shape");
  if (!src.data && src.rows * src.cols > 0) throw std::invalid_argument(where + "null data");
  if (target == DType::NVFP4 && src.cols % 16 != 0)
    throw std::invalid_argument(where + "nvfp4 needs cols % 16 == 0, got cols = " +
                                std::to_string(src.cols));
  QuantizedMatrix q;
  q.dtype = target;
  q.rows = src.rows;
  q.cols = src.cols;
  q.block = kFp8Block;
  if (q.rows == 0 || q.cols == 0) return q;
  if (target == DType::I8) quantize_i8(src, q);
  else if (target == DType::FP8_E4M3) quantize_fp8(src, q);
  else quantize_nvfp4(src, q);
  return q;
}

}  // namespace pe
