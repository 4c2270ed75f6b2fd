// The fused ops of backend.h as compositions of the plain ops: what the CPU backend runs, and what
// a faster backend falls back to where its fused kernel does not take the shape.
#include "model/backend.h"

#include "core/error.h"

namespace pe {

Matrix Backend::place_dummy(const WeightStore&, const std::vector<RunPart>&, DType, uint64_t) {
  fail(PE_ERR_INTERNAL, "this backend generates dummy weights on the host");
}

const float* Backend::place_dummy_vector(const WeightStore&, const std::string&, uint64_t) {
  fail(PE_ERR_INTERNAL, "this backend generates dummy weights on the host");
}

void Backend::project(const float* x, int64_t n, const Projection& p, float* out, NormState norm) {
  for (size_t r = 0; r < p.runs.size(); ++r) linear(x, n, p.runs[r].view, out + n * p.run_offset[r], norm);
}

int64_t Backend::project_swiglu_scratch(int64_t n, const Projection& gate_up, int64_t I) {
  return aligned_floats(n * gate_up.width) + (gate_up.side_by_side(I) ? 0 : aligned_floats(n * 2 * I));
}

void Backend::project_swiglu(const float* x, int64_t n, const Projection& gate_up, int64_t I, float* act,
                             NormState norm, float* scratch) {
  float* proj = scratch;
  project(x, n, gate_up, proj, norm);
  const float* gu = proj;
  if (!gate_up.side_by_side(I)) {  // gate and up in separate runs or apart in one: side by side for swiglu
    float* dense = scratch + aligned_floats(n * gate_up.width);
    const Projection::Part g = gate_up.part(0, proj, n), u = gate_up.part(1, proj, n);
    copy_rows(dense, 2 * I, g.ptr, g.stride, I, n);
    copy_rows(dense + I, 2 * I, u.ptr, u.stride, I, n);
    gu = dense;
  }
  swiglu(gu, n, I, act);
}

NormState Backend::project_add_norm(const float* in, int64_t n, const Projection& producer, const Residual& r,
                                    const float* w, const Projection* consumer) {
  project(in, n, producer, r.mix, NormState{});
  add_rms_norm(r.x, r.mix, w, n, r.dim, r.eps, r.offset, r.h);
  return {};
}

NormState Backend::embed_norm(const WeightView& table, const int32_t* ids, int64_t n, const Residual& r,
                              const float* w, const Projection* consumer) {
  embedding(table, ids, n, r.x);
  rms_norm(r.x, w, n, r.dim, r.eps, r.offset, r.h);
  return {};
}

void Backend::gdn_rule(const cpu::GdnArgs& a, float* states_out) {
  if (!states_out) return a.n > 1 ? gdn_chunked(a) : gdn_recurrent(a);
  const int64_t state_floats = a.Hv * a.dk * a.dv;
  for (int64_t t = 0; t < a.n; ++t) {
    cpu::GdnArgs one = a;
    one.q += t * a.qk_stride;
    one.k += t * a.qk_stride;
    one.v += t * a.v_stride;
    one.g += t * a.Hv;
    one.beta += t * a.Hv;
    one.out += t * a.Hv * a.dv;
    one.n = 1;
    gdn_recurrent(one);
    mem_copy(device(), states_out + t * state_floats, a.state, sizeof(float) * state_floats);
  }
}

}  // namespace pe
