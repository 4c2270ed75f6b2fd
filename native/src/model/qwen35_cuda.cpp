// CUDA model, forward pass: the same steps as Qwen35Model::forward (qwen35.cpp) on device
// buffers; comments there explain the math, comments here the device-side choices.
#ifdef PE_WITH_CUDA  // the CUDA model exists only in builds with the CUDA backend
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/model_glue.h"
#include "model/qwen35_cuda_parts.h"

namespace pe {
namespace {

constexpr size_t kAlign = 64;  // floats: 256-byte aligned sub-buffers

int64_t aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// gate | up as swiglu reads them: [n, 2I] rows, up right after gate (one run, no padding rows).
bool gate_up_side_by_side(const Projection& p, int64_t I) {
  return p.runs.size() == 1 && p.part_col.size() == 2 && p.part_col[1] == I && p.width == 2 * I;
}

// Floats of activation workspace one step of `T` tokens needs (x, h, mix + the largest mixer/MLP).
int64_t act_floats(const ModelConfig& c, const std::vector<DevLayer>& layers, int64_t T) {
  int64_t in_w = 0, gu_w = 0;
  bool split_gate_up = false;  // a layer whose gate and up could not be fused needs a copy of both
  for (const DevLayer& L : layers) {
    in_w = std::max(in_w, L.in.width);
    gu_w = std::max(gu_w, L.gate_up.width);
    split_gate_up = split_gate_up || !gate_up_side_by_side(L.gate_up, c.intermediate);
  }
  const int64_t gdn = aligned(T * in_w) + aligned(T * c.conv_dim()) + 2 * aligned(T * c.gdn_v_heads * c.gdn_v_dim) +
                      4 * aligned(T * c.gdn_v_heads);
  const int64_t att = aligned(T * in_w) + 3 * aligned(T * c.n_heads * c.head_dim) +
                      2 * aligned(T * c.n_kv_heads * c.head_dim);
  const int64_t mlp = aligned(T * gu_w) + (split_gate_up ? aligned(T * 2 * c.intermediate) : 0) +
                      aligned(T * c.intermediate);
  return 3 * aligned(T * c.hidden) + std::max({gdn, att, mlp});
}

// n rows of `width` floats, `src_stride` floats apart, to rows `dst_stride` apart (device).
void strided_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width, int64_t n) {
  cuda::device_copy_2d(dst, dst_stride * sizeof(float), src, src_stride * sizeof(float), width * sizeof(float), n);
}
void dense_rows(float* dst, const float* src, int64_t src_stride, int64_t width, int64_t n) {
  strided_rows(dst, width, src, src_stride, width, n);
}

// Bump allocator over one workspace buffer, reset per use.
struct Carve {
  float* p;
  float* take(int64_t n) {
    float* r = p;
    p += aligned(n);
    return r;
  }
};

}  // namespace

void CudaQwen35Model::ensure_workspace(int64_t tokens, int64_t rows, int64_t ints, size_t attn_scratch) {
  const ModelConfig& c = cfg_;
  if (tokens > cap_tokens_) {
    act_ = Buffer(Device::CUDA, static_cast<size_t>(act_floats(c, layers_, tokens)) * sizeof(float));
    gdn_scratch_ = Buffer(Device::CUDA, cuda::gdn_chunked_scratch_bytes(tokens, c.gdn_v_heads));
    cap_tokens_ = tokens;
  }
  if (rows > cap_rows_) {
    logits_ = Buffer(Device::CUDA, static_cast<size_t>(rows * c.vocab) * sizeof(float));
    cap_rows_ = rows;
    sample_out_ = Buffer(Device::CUDA, static_cast<size_t>(rows) * (2 + 2 * PE_MAX_TOP_LOGPROBS) * 4);
  }
  if (norm_partial_.size() == 0)  // two split norms of up to 8 tokens (step_launches), once
    norm_partial_ = Buffer(Device::CUDA, static_cast<size_t>(2 * 8 * cuda::split_norm_partial_floats(c.hidden)) * 4);
  if (ints > cap_ints_) {
    ints_ = Buffer(Device::CUDA, static_cast<size_t>(ints) * sizeof(int32_t));
    cap_ints_ = ints;
  }
  if (attn_scratch > attn_scratch_.size()) attn_scratch_ = Buffer(Device::CUDA, attn_scratch);
  const size_t ss = cuda::sample_scratch_bytes(c.vocab);
  if (sample_scratch_.size() < ss) {
    sample_scratch_ = Buffer(Device::CUDA, ss);
    penalty_row_ = Buffer(Device::CUDA, static_cast<size_t>(c.vocab) * sizeof(float));
  }
}

void CudaQwen35Model::reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) {
  std::lock_guard<std::mutex> lock(forward_mu_);
  const ModelConfig& c = cfg_;
  // Attention split-K scratch: the largest over chunk sizes at the deepest position (small
  // chunks split the most; long prefill chunks need none).
  size_t scratch = 0;
  for (int64_t n : {int64_t(1), int64_t(2), int64_t(4), int64_t(8), int64_t(16), int64_t(17), int64_t(32), int64_t(64),
                    int64_t(128), int64_t(256), int64_t(512), max_tokens})
    if (n <= max_tokens)
      scratch = std::max(scratch, cuda::attention_paged_scratch_bytes(n, std::max<int64_t>(0, max_context - n),
                                                                      c.n_heads, c.n_kv_heads, c.head_dim));
  // forward's ints: tokens, positions, cache rows and fed-token indices per token; pages (page
  // size >= 1) and the GDN slot per sequence.
  const int64_t pages_per_seq = max_context + 1;
  ensure_workspace(max_tokens, max_seqs, 4 * max_tokens + max_seqs * (pages_per_seq + 1), scratch);
}

void CudaQwen35Model::linear(const float* x, int64_t n, const Projection& p, float* out, const cuda::SplitNorm* norm) {
  for (size_t r = 0; r < p.runs.size(); ++r)
    cuda::linear(x, n, p.runs[r].view, out + n * p.run_offset[r], cuda::stream(), norm);
}

void CudaQwen35Model::project_out(const float* x, int64_t n, const Projection& p, float* out,
                                  cuda::SplitNorm* add_norm) {
  if (add_norm) return cuda::linear_add_norm(x, n, p.runs[0].view, *add_norm, cuda::stream());
  linear(x, n, p, out);
}

// Whether the norm between `producer` (an out projection or down, whose output is added to the
// residual) and `consumer` (the next projection reading the norm) can be split over their GEMVs.
// Every activation buffer is 256-byte aligned (Carve), as act_ is.
bool CudaQwen35Model::can_split_norm(const Projection& producer, const Projection& consumer, int64_t n) const {
  const float* any = act_.as<float>();
  if (producer.runs.size() != 1 || producer.runs[0].view.rows != cfg_.hidden ||
      !cuda::linear_split_norm_supported(any, n, producer.runs[0].view))
    return false;
  for (const DevMatrix& r : consumer.runs)
    if (!cuda::linear_split_norm_supported(any, n, r.view)) return false;
  return true;
}

// Prefill chunks (and mixed batches): per sequence, conv and delta rule cut at snapshot points.
void CudaQwen35Model::gdn_chunks(const DevLayer& L, int64_t gi, const Batch& b, GdnPool& gdn, const Projection::Part& u,
                                 const float* a_ptr, const float* b_ptr, int64_t ab_stride, float* y, float* g,
                                 float* beta, float* o) {
  const ModelConfig& c = cfg_;
  cudaStream_t st = cuda::stream();
  const int64_t T = static_cast<int64_t>(b.tokens.size());
  const int64_t C = c.conv_dim(), Hk = c.gdn_k_heads, Hv = c.gdn_v_heads, dk = c.gdn_k_dim, dv = c.gdn_v_dim;
  cuda::gdn_gates(a_ptr, b_ptr, ab_stride, T, Hv, L.A_log, L.dt_bias, g, beta, st);
  // Conv over each chunk, cut at snapshot points (the conv state at the cut is what is saved; a
  // piece starts at the position after the last one's, where the conv ring continues).
  int64_t r0 = 0;
  for (const SeqChunk& s : b.seqs) {
    int64_t done = 0;
    auto conv_piece = [&](int64_t n) {
      if (n <= 0) return;
      cuda::conv1d_causal(u.ptr + (r0 + done) * u.stride, n, u.stride, C, L.conv, c.conv_kernel, s.n_past + done,
                          gdn.conv_state(s.gdn_slot, gi), y + (r0 + done) * C, st);
      done += n;
    };
    for (const auto& [offset, slot] : s.snapshots) {
      if (offset == s.n_new) continue;  // take_end_snapshots, after the layers
      conv_piece(offset - done);
      mem_copy(Device::CUDA, gdn.conv_state(slot, gi), gdn.conv_state(s.gdn_slot, gi),
               sizeof(float) * gdn.conv_floats());
    }
    conv_piece(s.n_new - done);
    r0 += s.n_new;
  }
  cuda::l2_norm_heads(y, T, C, Hk, dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(dk)), st);
  cuda::l2_norm_heads(y + Hk * dk, T, C, Hk, dk, 1e-6f, 1.0f, st);
  r0 = 0;
  for (const SeqChunk& s : b.seqs) {
    int64_t done = 0;
    auto rule_piece = [&](int64_t n) {
      if (n <= 0) return;
      const int64_t p0 = r0 + done;
      cpu::GdnArgs args{y + p0 * C,  y + p0 * C + Hk * dk, C,  y + p0 * C + 2 * Hk * dk, C,
                        g + p0 * Hv, beta + p0 * Hv,        n,  Hk, Hv, dk, dv,
                        gdn.recurrent_state(s.gdn_slot, gi), o + p0 * Hv * dv};
      if (n > 1)
        cuda::gdn_chunked(args, gdn_scratch_.data(), gdn_scratch_.size(), st);
      else
        cuda::gdn_recurrent(args, st);
      done += n;
    };
    for (const auto& [offset, slot] : s.snapshots) {
      if (offset == s.n_new) continue;
      rule_piece(offset - done);
      mem_copy(Device::CUDA, gdn.recurrent_state(slot, gi), gdn.recurrent_state(s.gdn_slot, gi),
               sizeof(float) * gdn.rec_floats());
    }
    rule_piece(s.n_new - done);
    r0 += s.n_new;
  }
}

void CudaQwen35Model::mixer_gdn(const DevLayer& L, int64_t gi, const Batch& b, GdnPool& gdn, const float* x,
                                float* out, const cuda::SplitNorm* in_norm, cuda::SplitNorm* add_norm) {
  const ModelConfig& c = cfg_;
  cudaStream_t st = cuda::stream();
  const int64_t T = static_cast<int64_t>(b.tokens.size());
  const int64_t C = c.conv_dim(), Hk = c.gdn_k_heads, Hv = c.gdn_v_heads, dk = c.gdn_k_dim, dv = c.gdn_v_dim;
  Carve w{static_cast<float*>(act_.data()) + 3 * aligned(cap_tokens_ * c.hidden)};
  float* proj = w.take(T * L.in.width);
  float* y = w.take(T * C);
  float* z = w.take(T * Hv * dv);
  float* o = w.take(T * Hv * dv);
  float* g = w.take(T * Hv);
  float* beta = w.take(T * Hv);
  float* ab = w.take(2 * T * Hv);
  linear(x, T, L.in, proj, in_norm);
  const Projection::Part u = L.in.part(0, proj, T), zp = L.in.part(1, proj, T), ap = L.in.part(2, proj, T),
                         bp = L.in.part(3, proj, T);
  bool all_decode = T == static_cast<int64_t>(b.seqs.size());
  for (const SeqChunk& s : b.seqs) all_decode = all_decode && !s.snapshot_inside();
  // The gates read a and b with one stride, the decode op dense rows: copy them when needed. A
  // single row's stride is never read (gdn_gates, gdn_decode and conv1d index row 0 only).
  const bool one_row = T == 1;
  const float *a_ptr = ap.ptr, *b_ptr = bp.ptr;
  int64_t ab_stride = ap.stride;
  if (!one_row && (ap.stride != bp.stride || (all_decode && ap.stride != Hv))) {
    dense_rows(ab, ap.ptr, ap.stride, Hv, T);
    dense_rows(ab + T * Hv, bp.ptr, bp.stride, Hv, T);
    a_ptr = ab;
    b_ptr = ab + T * Hv;
    ab_stride = Hv;
  }
  if (all_decode) {
    // One token per sequence: the batched decode op (conv step, norms, gates and the delta rule
    // for every sequence in one launch) on dense rows; y holds the dense qkv rows here. Row i is
    // sequence i's token, so d_pos_ holds the positions per sequence.
    const float* qkv = u.ptr;
    if (u.stride != C && !one_row) {
      dense_rows(y, u.ptr, u.stride, C, T);
      qkv = y;
    }
    cpu::GdnDecodeArgs d{T, qkv, a_ptr, b_ptr, L.conv, L.A_log, L.dt_bias, d_slots_, d_pos_,
                         gdn.conv_state(0, gi), gdn.slot_floats(), gdn.recurrent_state(0, gi), gdn.slot_floats(),
                         Hk, Hv, dk, dv, c.conv_kernel, o};
    if (dv <= cuda::kGdnDecodeFusedNormMaxDv) {  // the gated norm in the same launch, z read in place
      d.z = zp.ptr;
      d.z_stride = one_row ? Hv * dv : zp.stride;
      d.norm_w = L.norm;
      d.norm_eps = c.eps;
    }
    cuda::gdn_decode(d, st);
    if (d.norm_w) return project_out(o, T, L.out, out, add_norm);
  } else {
    gdn_chunks(L, gi, b, gdn, u, a_ptr, b_ptr, ab_stride, y, g, beta, o);
  }
  const float* zd = zp.ptr;
  if (zp.stride != Hv * dv && !one_row) {  // rms_norm_gated reads z as [T * Hv, dv] rows
    dense_rows(z, zp.ptr, zp.stride, Hv * dv, T);
    zd = z;
  }
  cuda::rms_norm_gated(o, zd, L.norm, T * Hv, dv, c.eps, o, st);
  project_out(o, T, L.out, out, add_norm);
}

void CudaQwen35Model::mixer_attention(const DevLayer& L, int64_t ai, const Batch& b, KvPool& kv, const float* x,
                                      float* out, const cuda::SplitNorm* in_norm, cuda::SplitNorm* add_norm) {
  const ModelConfig& c = cfg_;
  cudaStream_t st = cuda::stream();
  const int64_t T = static_cast<int64_t>(b.tokens.size());
  const int64_t Hq = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim;
  Carve w{static_cast<float*>(act_.data()) + 3 * aligned(cap_tokens_ * c.hidden)};
  float* proj = w.take(T * L.in.width);
  float* q = w.take(T * Hq * D);
  float* gate = w.take(T * Hq * D);
  float* o = w.take(T * Hq * D);
  float* kb = w.take(T * Hkv * D);
  float* vb = w.take(T * Hkv * D);
  linear(x, T, L.in, proj, in_norm);
  const Projection::Part qp = L.in.part(0, proj, T), kp = L.in.part(1, proj, T), vp = L.in.part(2, proj, T);
  // q_proj rows per head: D query rows then D gate rows. One launch splits them, applies the q/k norms
  // and RoPE, and writes k and v into their cache rows.
  const cpu::PagedKV layer = kv.layer(ai);
  cuda::attention_inputs({qp.ptr, qp.stride, kp.ptr, kp.stride, vp.ptr, vp.stride, L.q_norm, L.k_norm, d_pos_, T, Hq,
                          Hkv, D, c.rot_dim, c.eps, c.rope_theta, q, gate, kb, vb},
                         st, &layer, d_cache_rows_);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  int64_t r0 = 0;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const SeqChunk& s = b.seqs[i];
    const int32_t* pt = d_pages_ + page_table_off_[i];
    cuda::attention_paged(q + r0 * Hq * D, s.n_new, s.n_past, Hq, layer, pt, scale, gate + r0 * Hq * D,
                          o + r0 * Hq * D, attn_scratch_.data(), attn_scratch_.size(), st);
    r0 += s.n_new;
  }
  project_out(o, T, L.out, out, add_norm);
}

void CudaQwen35Model::mlp(const DevLayer& L, int64_t n, const float* x, float* out, const cuda::SplitNorm* in_norm,
                          cuda::SplitNorm* add_norm) {
  const ModelConfig& c = cfg_;
  cudaStream_t st = cuda::stream();
  const int64_t I = c.intermediate;
  Carve w{static_cast<float*>(act_.data()) + 3 * aligned(cap_tokens_ * c.hidden)};
  float* act = w.take(n * I);
  // Decode: the swiglu in the gate | up GEMV's epilogue (cuda_ops.h linear_swiglu), where the gate
  // and up rows are one run.
  const Projection& gu_p = L.gate_up;
  if (gu_p.runs.size() == 1 && gu_p.part_col.size() == 2 && gu_p.part_col[0] == 0 &&
      cuda::linear_swiglu_supported(x, n, gu_p.runs[0].view, gu_p.part_col[1], I)) {
    cuda::linear_swiglu(x, n, gu_p.runs[0].view, gu_p.part_col[1], I, act, st, in_norm);
    return project_out(act, n, L.down, out, add_norm);
  }
  float* proj = w.take(n * L.gate_up.width);
  const bool side_by_side = gate_up_side_by_side(L.gate_up, I);
  float* gu = side_by_side ? nullptr : w.take(n * 2 * I);
  linear(x, n, L.gate_up, proj, in_norm);
  const float* gu_ptr = proj;
  if (!side_by_side) {  // gate and up in separate runs or apart in one: side by side for swiglu
    const Projection::Part gp = L.gate_up.part(0, proj, n), up = L.gate_up.part(1, proj, n);
    strided_rows(gu, 2 * I, gp.ptr, gp.stride, I, n);
    strided_rows(gu + I, 2 * I, up.ptr, up.stride, I, n);
    gu_ptr = gu;
  }
  cuda::swiglu(gu_ptr, n, I, act, st);
  project_out(act, n, L.down, out, add_norm);
}

void CudaQwen35Model::forward(const Batch& b, KvPool& kv, GdnPool& gdn, ForwardResult& res) {
  std::lock_guard<std::mutex> lock(forward_mu_);
  if (!ready_) fail(PE_ERR_STATE, "the model is not finalized");
  if (kv.device() != Device::CUDA || gdn.device() != Device::CUDA)
    fail(PE_ERR_INVALID_ARGUMENT, "the CUDA model needs KV and GDN pools in device memory");
  const ModelConfig& c = cfg_;
  const int64_t T = static_cast<int64_t>(b.tokens.size()), H = c.hidden;
  const bool fed = !b.token_from_sample.empty();
  if (fed && static_cast<int64_t>(b.token_from_sample.size()) != T)
    fail(PE_ERR_INTERNAL, "batch has ", T, " tokens but ", b.token_from_sample.size(), " token_from_sample entries");
  for (int64_t i = 0; i < T; ++i) {
    const int32_t from = fed ? b.token_from_sample[i] : -1;
    if (from >= last_sample_jobs_)
      fail(PE_ERR_INTERNAL, "token_from_sample: row ", i, " takes job ", from, " of a launch with ", last_sample_jobs_,
           " jobs");
    if (from < 0 && (b.tokens[i] < 0 || b.tokens[i] >= c.vocab))
      fail(PE_ERR_INVALID_ARGUMENT, "token id ", b.tokens[i], " outside the vocabulary");
  }

  // Token ids, positions and page tables go up in one copy.
  host_ints_.assign(b.tokens.begin(), b.tokens.end());
  for (const SeqChunk& s : b.seqs)
    for (int64_t i = 0; i < s.n_new; ++i) host_ints_.push_back(static_cast<int32_t>(s.n_past + i));
  if (static_cast<int64_t>(host_ints_.size()) != 2 * T)
    fail(PE_ERR_INTERNAL, "batch has ", T, " tokens but its chunks cover ", host_ints_.size() - T);
  page_table_off_.clear();
  int64_t n_rows = 0;
  for (const SeqChunk& s : b.seqs) {
    const int64_t n_pages = (s.n_past + s.n_new + kv.page_size() - 1) / kv.page_size();
    page_table_off_.push_back(static_cast<int64_t>(host_ints_.size()) - 2 * T);
    host_ints_.insert(host_ints_.end(), s.page_table, s.page_table + n_pages);
    n_rows += s.n_new - s.first_logit_row();
  }
  const int64_t slots_off = static_cast<int64_t>(host_ints_.size());
  for (const SeqChunk& s : b.seqs) host_ints_.push_back(s.gdn_slot);
  // Each new token's KV cache row (page * page_size + offset), where attention_inputs writes it.
  const int64_t rows_off = static_cast<int64_t>(host_ints_.size()), ps = kv.page_size();
  for (const SeqChunk& s : b.seqs)
    for (int64_t t = s.n_past; t < s.n_past + s.n_new; ++t)
      host_ints_.push_back(static_cast<int32_t>(static_cast<int64_t>(s.page_table[t / ps]) * ps + t % ps));
  const int64_t from_off = static_cast<int64_t>(host_ints_.size());
  if (fed) host_ints_.insert(host_ints_.end(), b.token_from_sample.begin(), b.token_from_sample.end());
  size_t scratch = 0;
  for (const SeqChunk& s : b.seqs)
    scratch = std::max(scratch, cuda::attention_paged_scratch_bytes(s.n_new, s.n_past, c.n_heads, c.n_kv_heads,
                                                                     c.head_dim));
  // Every buffer the step uses exists before its launches (a captured step must not allocate). Fed
  // tokens are read from sample_out_, which must not move (it would, were the rows to grow).
  const int64_t rows_needed = b.host_outputs ? 1 : std::max<int64_t>(n_rows, 1);
  if (fed && (b.host_outputs || rows_needed > cap_rows_))
    fail(PE_ERR_INTERNAL, "token_from_sample: a step of ", rows_needed, " logit rows after a sampling of ", cap_rows_);
  ensure_workspace(T, rows_needed, static_cast<int64_t>(host_ints_.size()), scratch);
  int32_t* d_ints = ints_.as<int32_t>();
  // ints_ itself is rewritten only in stream order; the host staging waits for its last upload.
  Staging& up = upload_[upload_turn_ ^= 1];
  const size_t ints_bytes = host_ints_.size() * sizeof(int32_t);
  up.consumed.wait();
  if (up.host.size() < ints_bytes) up.host = cuda::PinnedBuffer(std::max<size_t>(ints_bytes, 4096));
  std::memcpy(up.host.data(), host_ints_.data(), ints_bytes);
  cuda::upload_async(d_ints, up.host, ints_bytes);
  up.consumed.record();
  if (fed) cuda::feed_tokens(d_ints, d_ints + from_off, sample_out_.as<int32_t>(), T, cuda::stream());
  d_pos_ = d_ints + T;
  d_pages_ = d_ints + 2 * T;
  d_slots_ = d_ints + slots_off;
  d_cache_rows_ = d_ints + rows_off;

  // Engine steps keep their logits for sample(); a host-output forward (prompt logits on another
  // thread) writes elsewhere so it cannot overwrite them between an engine forward and sample.
  float* logits = logits_.as<float>();
  if (b.host_outputs) {
    const size_t need = static_cast<size_t>(std::max<int64_t>(n_rows, 1) * c.vocab) * sizeof(float);
    if (logits_host_.size() < need) logits_host_ = Buffer(Device::CUDA, need);
    logits = logits_host_.as<float>();
  }
  res.logit_row_begin.clear();
  int64_t row = 0;
  for (const SeqChunk& s : b.seqs) {
    res.logit_row_begin.push_back(row);
    row += s.n_new - s.first_logit_row();
  }

  // Decode-only steps may replay a CUDA graph (qwen35_cuda.h): everything after the upload above.
  auto launches = [&] { step_launches(b, kv, gdn, n_rows, logits); };
  bool decode_only = b.cuda_graph && !b.host_outputs && T > 0;
  for (const SeqChunk& s : b.seqs) decode_only = decode_only && s.n_new == 1 && !s.snapshot_inside();
  if (decode_only)
    graphs_.run((T << 32) | n_rows, launches);  // one graph per (tokens, logit rows)
  else
    launches();
  take_end_snapshots(b, gdn);

  if (!b.host_outputs) last_logits_ = logits;
  if (b.host_outputs) {
    const float* h = act_.as<float>() + aligned(cap_tokens_ * H);
    res.logits.resize(static_cast<size_t>(n_rows * c.vocab));
    res.hidden.resize(static_cast<size_t>(T * H));
    mem_download(Device::CUDA, res.logits.data(), logits, res.logits.size() * sizeof(float));
    mem_download(Device::CUDA, res.hidden.data(), h, res.hidden.size() * sizeof(float));
  } else {
    res.logits.clear();
    res.hidden.clear();
  }
}

// The device work of a step after the upload: embedding, layers, final norm and the lm_head over
// the rows that need logits. Launches only (no allocation, sync or host copy): it may be captured.
void CudaQwen35Model::step_launches(const Batch& b, KvPool& kv, GdnPool& gdn, int64_t n_rows, float* logits) {
  const ModelConfig& c = cfg_;
  cudaStream_t st = cuda::stream();
  const int64_t T = static_cast<int64_t>(b.tokens.size()), H = c.hidden;
  float* x = act_.as<float>();
  float* h = x + aligned(cap_tokens_ * H);
  float* mix = h + aligned(cap_tokens_ * H);
  // Each residual add runs fused with the norm that follows it (the next layer's input norm, the
  // post-attention norm, the final norm): x += mix; h = norm(x). In decode steps the add and the
  // norm are split over the GEMVs around them instead where both can take it (cuda_ops.h
  // SplitNorm: the out projection or down adds into x, the next projection applies the 1 / rms),
  // except around the first and the final norm.
  bool mix_pending = false;
  auto add_norm = [&](const float* w) {
    if (mix_pending)
      cuda::add_rms_norm(x, mix, w, T, H, c.eps, true, h, st);
    else
      cuda::rms_norm(x, w, T, H, c.eps, true, h, st);
    mix_pending = false;
  };
  cuda::SplitNorm splits[2];  // alternate: the one being consumed, the one being produced
  for (int i = 0; i < 2; ++i) {
    splits[i].x = x;
    splits[i].h = h;
    splits[i].eps = c.eps;
    splits[i].dim = H;
    splits[i].partial = norm_partial_.as<float>() + i * 8 * cuda::split_norm_partial_floats(H);
  }
  int n_split = 0;
  auto split = [&](const Projection& producer, const Projection& consumer, const float* w) -> cuda::SplitNorm* {
    if (!can_split_norm(producer, consumer, T)) return nullptr;
    cuda::SplitNorm* s = &splits[n_split++ % 2];
    s->w = w;
    return s;
  };
  const cuda::SplitNorm* in_norm = nullptr;  // the norm before the next projection, when split
  // The embedding (token ids first in ints_) is the first input norm's producer where the first in
  // projection can take it.
  bool first_split = !layers_.empty();
  if (first_split)
    for (const DevMatrix& r : layers_[0].in.runs)
      first_split = first_split && cuda::linear_split_norm_supported(x, T, r.view);
  if (first_split) {
    cuda::SplitNorm* s = &splits[n_split++ % 2];
    s->w = layers_[0].input_norm;
    cuda::embedding_norm(embed_.view, ints_.as<int32_t>(), T, *s, st);
    in_norm = s;
  } else {
    cuda::embedding(embed_.view, ints_.as<int32_t>(), T, x, st);
  }
  int64_t gi = 0, ai = 0;
  for (size_t li = 0; li < layers_.size(); ++li) {
    const DevLayer& L = layers_[li];
    if (!in_norm) add_norm(L.input_norm);
    cuda::SplitNorm* post = split(L.out, L.gate_up, L.post_norm);
    if (L.full)
      mixer_attention(L, ai++, b, kv, h, mix, in_norm, post);
    else
      mixer_gdn(L, gi++, b, gdn, h, mix, in_norm, post);
    in_norm = post;
    mix_pending = !post;
    if (!in_norm) add_norm(L.post_norm);
    cuda::SplitNorm* next =
        li + 1 < layers_.size() ? split(L.down, layers_[li + 1].in, layers_[li + 1].input_norm) : nullptr;
    mlp(L, T, h, mix, in_norm, next);
    in_norm = next;
    mix_pending = !next;
  }
  add_norm(final_norm_);  // h: final hidden states

  // Rows that need logits, then one lm_head matmul. They are read from h in place when they are
  // its leading rows in order (every decode step), else gathered into `mix`.
  const float* rows = h;
  int64_t row = 0, r0 = 0;
  bool in_place = true;
  for (const SeqChunk& s : b.seqs) {
    const int64_t first = s.first_logit_row();
    in_place = in_place && (s.n_new == first || row == r0 + first);
    row += s.n_new - first;
    r0 += s.n_new;
  }
  if (!in_place) {
    row = r0 = 0;
    for (const SeqChunk& s : b.seqs) {
      const int64_t first = s.first_logit_row();
      const int64_t n = s.n_new - first;
      if (n > 0) mem_copy(Device::CUDA, mix + row * H, h + (r0 + first) * H, sizeof(float) * n * H);
      row += n;
      r0 += s.n_new;
    }
    rows = mix;
  }
  if (n_rows > 0) cuda::linear(rows, n_rows, cfg_.tied_embeddings ? embed_.view : lm_head_.view, logits, st);
}

}  // namespace pe

#endif  // PE_WITH_CUDA
