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

namespace {

// An FP8 part joins a run at a block row of the run's scale grid: after rows that end inside a
// block row come zero rows up to the boundary (they take the last block row's scale and give
// zeros no part reads). So in_proj_b joins qkv | z | a (in_proj_a: Hv rows): one GEMV per GDN
// layer instead of two.
int64_t join_pad_rows(DType dtype, int64_t run_rows) {
  return dtype == DType::FP8_E4M3 && run_rows % 128 != 0 ? 128 - run_rows % 128 : 0;
}

}  // namespace

// Consecutive parts join a run (where the backend joins runs) while dtype, columns and the NVFP4
// global scale match. Tensor parallel shards each part before (rows of a rank's heads), so runs
// are formed of the shards.
Projection make_projection(const Backend& be, const WeightStore& w, const std::vector<std::string>& names,
                           const std::function<Matrix(const std::vector<RunPart>&)>& run) {
  auto tensor = [&](const std::string& n) -> const Tensor& { return w.tensors().at(n); };
  Projection p;
  std::vector<std::vector<RunPart>> runs;
  int64_t run_rows = 0;
  for (const std::string& n : names) {
    const Tensor& t = tensor(n);
    const Tensor* head = runs.empty() ? nullptr : &tensor(runs.back().front().name);
    const bool joins = head && be.joins_runs() && t.dtype == head->dtype && t.shape[1] == head->shape[1] &&
                       (t.dtype != DType::NVFP4 || t.global_scale == head->global_scale);
    if (!joins) {
      runs.emplace_back();
      run_rows = 0;
    }
    const int64_t pad = join_pad_rows(t.dtype, run_rows);
    run_rows += pad;
    p.part_run.push_back(static_cast<int32_t>(runs.size() - 1));
    p.part_col.push_back(run_rows);
    runs.back().push_back({n, pad});
    run_rows += t.shape[0];
  }
  for (const auto& r : runs) {
    p.run_offset.push_back(p.width);
    p.runs.push_back(run(r));
    p.width += p.runs.back().view.rows;
  }
  return p;
}

void Backend::attention_blocks(const float* q, int64_t n_blocks, int64_t n_q, const int64_t* starts, int64_t n_heads,
                               const cpu::PagedKV& kv, const int32_t* const* page_tables, const int32_t* perm,
                               float scale, float* out, float* scratch) {
  const int64_t D = kv.head_dim, Hkv = kv.n_kv_heads, rows = n_blocks * n_q * Hkv, block = n_q * n_heads * D;
  float* qp = scratch;
  float* op = scratch + aligned_floats(n_blocks * block);
  WeightView t;  // rows of group * D floats: (token, KV head) in q and out, (block, KV head, query) in qp, op
  t.rows = rows;
  t.cols = n_heads / Hkv * D;
  t.data = q;
  embedding(t, perm, rows, qp);
  for (int64_t b = 0; b < n_blocks; ++b)
    attention_paged(qp + b * block, 1, starts[b] + n_q - 1, n_q * n_heads, kv, page_tables[b], scale, nullptr,
                    op + b * block);
  t.data = op;
  embedding(t, perm + rows, rows, out);
}

void Backend::attention_blocks_perm(int64_t n_blocks, int64_t n_q, int64_t n_kv_heads, std::vector<int32_t>& out) {
  const int64_t rows = n_blocks * n_q * n_kv_heads;
  const size_t begin = out.size();
  out.resize(begin + static_cast<size_t>(2 * rows));
  int32_t* perm = out.data() + begin;
  for (int64_t b = 0; b < n_blocks; ++b)
    for (int64_t g = 0; g < n_kv_heads; ++g)
      for (int64_t i = 0; i < n_q; ++i) {
        const int64_t ordered = (b * n_kv_heads + g) * n_q + i, natural = (b * n_q + i) * n_kv_heads + g;
        perm[ordered] = static_cast<int32_t>(natural);
        perm[rows + natural] = static_cast<int32_t>(ordered);
      }
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
