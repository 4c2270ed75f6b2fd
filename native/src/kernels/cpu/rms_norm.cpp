// Row normalizations (one pass for the sum of squares, one for the scaled write; x may alias out):
//   rms_norm:        y = x * rsqrt(mean(x^2) + eps) * (offset ? 1 + w : w)       rows of dim
//   rms_norm_gated:  y = x * rsqrt(mean(x^2) + eps) * w * silu(z)  (GDN output norm, fused gate)
//   l2_norm:         y = x / sqrt(sum(x^2) + eps) * scale          (GDN q/k, fused q scale)
//   add_rms_norm:    x += r, then rms_norm of x              (residual add + the next layer norm)
// Parallel over rows; small calls (decode) run inline.
#include <algorithm>
#include <cmath>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {
namespace {

// Rows per parallel chunk: ~16K elements, so per-head norms of a decode step stay inline.
int64_t row_grain(int64_t dim) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(dim, 1)); }

}  // namespace

void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
              float* out) {
  parallel_for(
      n_rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* xr = x + r * dim;
          float* yr = out + r * dim;
          const float inv = 1.0f / std::sqrt(sum_squares(xr, dim) / static_cast<float>(dim) + eps);
          if (offset) {
            for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * inv * (1.0f + w[j]);
          } else {
            for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * inv * w[j];
          }
        }
      },
      row_grain(dim));
}

void add_rms_norm(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps,
                  bool offset, float* out) {
  parallel_for(
      n_rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          float* xr = x + i * dim;
          const float* rr = r + i * dim;
          for (int64_t j = 0; j < dim; ++j) xr[j] = xr[j] + rr[j];
        }
      },
      row_grain(dim));
  rms_norm(x, w, n_rows, dim, eps, offset, out);
}

void rms_norm_gated(const float* x, const float* z, const float* w, int64_t n_rows, int64_t dim,
                    float eps, float* out, int64_t z_heads, int64_t z_stride) {
  if (z_heads <= 0) z_heads = 1;
  if (z_stride == 0) z_stride = z_heads * dim;
  parallel_for(
      n_rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* xr = x + r * dim;
          const float* zr = z + (r / z_heads) * z_stride + (r % z_heads) * dim;
          float* yr = out + r * dim;
          const float inv = 1.0f / std::sqrt(sum_squares(xr, dim) / static_cast<float>(dim) + eps);
          for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * inv * w[j] * silu(zr[j]);
        }
      },
      row_grain(dim));
}

void l2_norm(float* x, int64_t n_rows, int64_t dim, float eps, float scale) {
  parallel_for(
      n_rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          float* xr = x + r * dim;
          const float f = scale / std::sqrt(sum_squares(xr, dim) + eps);
          for (int64_t j = 0; j < dim; ++j) xr[j] *= f;
        }
      },
      row_grain(dim));
}

}  // namespace cpu
}  // namespace pe
