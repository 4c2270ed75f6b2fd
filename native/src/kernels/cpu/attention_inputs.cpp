// The inputs of gated attention (ops.h): q and gate split out of the q_proj rows, k and v made
// dense, then q/k head norms and RoPE. Composed of the reference ops themselves (memcpy,
// rms_norm, rope_neox), so it is the same arithmetic as calling them one by one; the CUDA twin
// (kernels/cuda/model_glue.cu) does all of it in one launch.
#include <cstring>

#include "kernels/ops.h"

namespace pe {
namespace cpu {
namespace {

// Rows of `width` floats, src_stride apart, into dense rows (nothing to do in place).
void dense(float* dst, const float* src, int64_t src_stride, int64_t width, int64_t n) {
  if (dst == src && src_stride == width) return;
  for (int64_t t = 0; t < n; ++t) std::memmove(dst + t * width, src + t * src_stride, sizeof(float) * width);
}

}  // namespace

void attention_inputs(const AttnInputArgs& a) {
  const int64_t T = a.n_tokens, D = a.D;
  const int64_t head_floats = a.gated ? 2 * D : D;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < a.Hq; ++h) {
      const float* row = a.qg + t * a.qg_stride + h * head_floats;
      std::memcpy(a.q + (t * a.Hq + h) * D, row, sizeof(float) * D);
      if (a.gated) std::memcpy(a.gate + (t * a.Hq + h) * D, row + D, sizeof(float) * D);
    }
  dense(a.k, a.k_in, a.k_stride, a.Hkv * D, T);
  dense(a.v, a.v_in, a.v_stride, a.Hkv * D, T);
  if (a.Hq > 0) rms_norm(a.q, a.q_norm, T * a.Hq, D, a.eps, a.norm_offset, a.q);
  rms_norm(a.k, a.k_norm, T * a.Hkv, D, a.eps, a.norm_offset, a.k);
  if (a.Hq > 0) rope_neox(a.q, T, a.Hq * D, a.Hq, D, a.rot_dim, a.pos, a.theta);
  rope_neox(a.k, T, a.Hkv * D, a.Hkv, D, a.rot_dim, a.pos, a.theta);
}

}  // namespace cpu
}  // namespace pe
