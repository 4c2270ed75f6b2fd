// The Qwen3.5 forward, once for every backend (MODEL_SPEC §3): the step's indices, the embedding,
// the decoder layers (GDN or gated attention mixer, MLP), the final norm, the logit rows and the
// lm_head; the MTP head through the same decoder layer. Every op is a Backend call; the
// activations live in one workspace (act_: x, h, mix, then the mixer's or the MLP's buffers, each
// 256-byte aligned).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/qwen35.h"

namespace pe {
namespace {

// Bump allocator over the workspace after x, h and mix, reset per mixer / MLP.
struct Carve {
  float* p;
  float* take(int64_t n) {
    float* r = p;
    p += aligned_floats(n);
    return r;
  }
};

int64_t n_tokens(const Batch& b) { return static_cast<int64_t>(b.tokens.size()); }

}  // namespace

Residual Qwen35Model::residual() const {
  float* x = act_.as<float>();
  const int64_t stride = aligned_floats(cap_tokens_ * cfg_.hidden);
  return {x, x + stride, x + 2 * stride, cfg_.hidden, cfg_.eps, true};
}

float* Qwen35Model::scratch() const { return act_.as<float>() + 3 * aligned_floats(cap_tokens_ * cfg_.hidden); }

void Qwen35Model::check_pools(const KvPool& kv, const GdnPool* gdn) const {
  if (!ready_) fail(PE_ERR_STATE, "the model is not finalized");
  if (kv.device() != device() || (gdn && gdn->device() != device()))
    fail(PE_ERR_INVALID_ARGUMENT, device() == Device::CPU ? "the CPU model needs KV and GDN pools in host memory"
                                                          : "the CUDA model needs KV and GDN pools in device memory");
}

// Validates the batch and uploads its indices in one copy: tokens [T] | positions [T] | page
// tables | GDN slot per sequence | KV cache row per token [T] | fed-token sources [T] (fed steps).
void Qwen35Model::prepare_step(const Batch& b, int64_t ps, int64_t logit_rows) {
  const int64_t T = n_tokens(b);
  const bool fed = !b.token_from_sample.empty();
  if (fed && static_cast<int64_t>(b.token_from_sample.size()) != T)
    fail(PE_ERR_INTERNAL, "batch has ", T, " tokens but ", b.token_from_sample.size(), " token_from_sample entries");
  for (int64_t i = 0; i < T; ++i) {
    const int32_t from = fed ? b.token_from_sample[i] : -1;
    if (from >= be_->last_sample_jobs())
      fail(PE_ERR_INTERNAL, "token_from_sample: row ", i, " takes job ", from, " of a launch with ",
           be_->last_sample_jobs(), " jobs");
    if (from < 0 && (b.tokens[i] < 0 || b.tokens[i] >= cfg_.vocab))
      fail(PE_ERR_INVALID_ARGUMENT, "token id ", b.tokens[i], " outside the vocabulary");
  }
  host_ints_.assign(b.tokens.begin(), b.tokens.end());
  for (const SeqChunk& s : b.seqs)
    for (int64_t i = 0; i < s.n_new; ++i) host_ints_.push_back(static_cast<int32_t>(s.n_past + i));
  if (static_cast<int64_t>(host_ints_.size()) != 2 * T)
    fail(PE_ERR_INTERNAL, "batch has ", T, " tokens but its chunks cover ", host_ints_.size() - T);
  step_.page_off.clear();
  for (const SeqChunk& s : b.seqs) {
    step_.page_off.push_back(static_cast<int64_t>(host_ints_.size()) - 2 * T);
    host_ints_.insert(host_ints_.end(), s.page_table, s.page_table + (s.n_past + s.n_new + ps - 1) / ps);
  }
  const int64_t slots_off = static_cast<int64_t>(host_ints_.size());
  for (const SeqChunk& s : b.seqs) host_ints_.push_back(s.gdn_slot);
  const int64_t rows_off = static_cast<int64_t>(host_ints_.size());
  for (const SeqChunk& s : b.seqs)
    for (int64_t t = s.n_past; t < s.n_past + s.n_new; ++t)
      host_ints_.push_back(static_cast<int32_t>(static_cast<int64_t>(s.page_table[t / ps]) * ps + t % ps));
  const int64_t from_off = static_cast<int64_t>(host_ints_.size());
  if (fed) host_ints_.insert(host_ints_.end(), b.token_from_sample.begin(), b.token_from_sample.end());
  const int64_t chain_off = static_cast<int64_t>(host_ints_.size());
  plan_chain(b);
  size_t scratch = 0;
  for (const SeqChunk& s : b.seqs) scratch = std::max(scratch, be_->attention_scratch_bytes(s.n_new, s.n_past, cfg_));
  // Every buffer the step uses exists before its launches (a captured step must not allocate).
  ensure_workspace(T, logit_rows, static_cast<int64_t>(host_ints_.size()), scratch);
  int32_t* d = be_->upload_ints(host_ints_);
  if (fed) be_->feed_tokens(d, d + from_off, T);
  step_.T = T;
  step_.tokens = d;
  step_.pos = d + T;
  step_.pages = d + 2 * T;
  step_.slots = d + slots_off;
  step_.cache_rows = d + rows_off;
  step_.chain = d + chain_off;
}

// Design decision: a verify chunk's GDN tokens run as chained decode steps (Backend::gdn_chain),
// each reading the state the last left and writing its own position slot, instead of the chunked
// rule cut into 1-token pieces with a state copy after each (2 launches + 2 copies per token and
// sequence). One op covers every verify sequence of the step and the decode rows beside them, so
// a layer costs two launches on CUDA (the conv, then the recurrent steps with the state in
// registers: read once, written once per position) whatever the batch and draft length; the
// slots' copies come for free. The math is plain decode's.
// A sequence runs chained when it is a decode row (one token, no snapshot inside) or a verify-shaped
// chunk (at most kChainMax tokens, a snapshot at every position inside it: the first at an offset
// is written by the chain, any further one there, a prefix-cache snapshot at a block boundary, is
// copied from it after the layers); the step chains when one verify-shaped chunk is in it. The
// rest of the step (prefill chunks) runs in pieces.
void Qwen35Model::plan_chain(const Batch& b) {
  constexpr int64_t kChainMax = 16;
  const size_t n = b.seqs.size();
  step_.chain_seq.assign(n, 0);
  step_.chain_copies.clear();
  step_.chain_n = 0;
  step_.chain_all = false;
  bool verify = false;
  std::vector<std::vector<int32_t>> written(n);  // per chained sequence: the slot of each inside offset
  for (size_t i = 0; i < n; ++i) {
    const SeqChunk& s = b.seqs[i];
    if (s.n_new < 1 || s.n_new > kChainMax) continue;
    // Snapshots come in offset order: a verify-shaped chunk has offsets 1 .. n_new - 1 inside,
    // each at least once.
    std::vector<int32_t>& w = written[i];
    std::vector<std::pair<int32_t, int32_t>> further;  // (its slot, the chain's slot at that offset)
    bool shaped = true;
    for (const auto& [offset, slot] : s.snapshots) {
      if (offset >= s.n_new) continue;
      if (offset == static_cast<int64_t>(w.size()) + 1)
        w.push_back(slot);
      else if (offset > 0 && offset == static_cast<int64_t>(w.size()))
        further.emplace_back(slot, w.back());
      else
        shaped = false;
    }
    if (!shaped || static_cast<int64_t>(w.size()) + 1 != s.n_new) {
      w.clear();
      continue;
    }
    step_.chain_copies.insert(step_.chain_copies.end(), further.begin(), further.end());
    step_.chain_seq[i] = 1;
    verify = verify || s.n_new > 1;
  }
  if (!verify) {
    step_.chain_seq.assign(n, 0);
    step_.chain_copies.clear();
    return;
  }
  // Per chained sequence, in batch order: first token row | tokens | first position | live slot |
  // its first out slot's index, then the out slots (snapshot j after the chunk's first j tokens,
  // j = 1 .. n_new - 1, then the live slot at its last token).
  std::vector<int32_t> row0, n_tok, pos0, live, out_off, out;
  int64_t r0 = 0;
  for (size_t i = 0; i < n; ++i) {
    const SeqChunk& s = b.seqs[i];
    if (step_.chain_seq[i]) {
      row0.push_back(static_cast<int32_t>(r0));
      n_tok.push_back(static_cast<int32_t>(s.n_new));
      pos0.push_back(static_cast<int32_t>(s.n_past));
      live.push_back(s.gdn_slot);
      out_off.push_back(static_cast<int32_t>(out.size()));
      out.insert(out.end(), written[i].begin(), written[i].end());
      out.push_back(s.gdn_slot);
    }
    r0 += s.n_new;
  }
  step_.chain_n = static_cast<int64_t>(row0.size());
  step_.chain_all = std::all_of(step_.chain_seq.begin(), step_.chain_seq.end(), [](char x) { return x != 0; });
  for (const auto* v : {&row0, &n_tok, &pos0, &live, &out_off, &out})
    host_ints_.insert(host_ints_.end(), v->begin(), v->end());
}

void Qwen35Model::forward(const Batch& b, KvPool& kv, GdnPool& gdn, ForwardResult& res) {
  std::lock_guard<std::mutex> lock(mu_);
  check_pools(kv, &gdn);
  const int64_t T = n_tokens(b);
  int64_t n_rows = 0;
  res.logit_row_begin.clear();
  for (const SeqChunk& s : b.seqs) {
    res.logit_row_begin.push_back(n_rows);
    n_rows += s.n_new - s.first_logit_row();
  }
  prepare_step(b, kv.page_size(), b.host_outputs ? 1 : std::max<int64_t>(n_rows, 1));
  // Kept rows: in kept_ for the engine's steps; a keep_for_host forward (another thread's, maybe)
  // keeps into a buffer of its own, so it never overwrites a step's rows before its drafter read them.
  Buffer host_capture;
  keep_into_ = nullptr;
  res.kept.clear();
  if (!b.keep_hidden.empty()) {
    for (int32_t l : b.keep_hidden)
      if (l < -1 || l >= cfg_.n_layers) fail(PE_ERR_INVALID_ARGUMENT, "kept hidden layer ", l, " outside -1 .. ", cfg_.n_layers - 1);
    const int64_t n_keep = static_cast<int64_t>(b.keep_hidden.size());
    if (b.keep_for_host) {
      host_capture = Buffer(device(), sizeof(float) * std::max<int64_t>(T, 1) * n_keep * cfg_.hidden);
      keep_into_ = host_capture.as<float>();
    } else {
      ensure_kept(n_keep, T);
      keep_into_ = kept_.as<float>();
    }
  }
  float* logits = be_->logits_buffer(n_rows, cfg_.vocab, b.host_outputs, res);
  // A decode-only step may replay a graph of its shape (tokens, logit rows).
  bool decode_only = b.cuda_graph && !b.host_outputs && T > 0 && !tp_data_ && b.keep_hidden.empty();
  for (const SeqChunk& s : b.seqs) decode_only = decode_only && s.n_new == 1 && !s.snapshot_inside();
  be_->run_step(decode_only ? (T << 32) | n_rows : -1, [&] { step_launches(b, kv, gdn, n_rows, logits); });
  if (!b.keep_hidden.empty() && !b.keep_for_host) {
    kept_layers_ = b.keep_hidden;
    kept_rows_ = T;
  }
  // A chained chunk's further snapshots inside it (plan_chain), then the snapshots at a chunk's end
  // (of the state it ends with): one whole-slot copy each.
  for (const auto& [dst, src] : step_.chain_copies) gdn.copy(dst, src);
  for (const SeqChunk& s : b.seqs)
    for (const auto& [offset, slot] : s.snapshots)
      if (offset == s.n_new) gdn.copy(slot, s.gdn_slot);
  be_->finish_step(logits, n_rows, cfg_.vocab, residual().h, T, cfg_.hidden, b.host_outputs, res);
  if (b.keep_for_host && keep_into_) {
    res.kept.resize(static_cast<size_t>(T * cfg_.hidden) * b.keep_hidden.size());
    mem_download(device(), res.kept.data(), keep_into_, sizeof(float) * res.kept.size());
  }
  keep_into_ = nullptr;
}

// The step's device work after the upload: launches only (no allocation, sync or host copy).
void Qwen35Model::step_launches(const Batch& b, KvPool& kv, GdnPool& gdn, int64_t n_rows, float* logits) {
  const int64_t T = step_.T;
  const Residual r = residual();
  NormState s = be_->embed_norm(embed_.view, step_.tokens, T, r, layers_[0].input_norm, &layers_[0].in);
  int64_t gi = 0, ai = 0;
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& L = layers_[li];
    const bool last = li + 1 == layers_.size();
    s = decoder_layer(L, L.full ? ai++ : gi++, b, kv, &gdn, s, last ? final_norm_ : layers_[li + 1].input_norm,
                      last ? nullptr : &layers_[li + 1].in);
    keep_rows(b.keep_hidden, static_cast<int32_t>(li), r.x);
  }
  keep_rows(b.keep_hidden, -1, r.h);
  if (n_rows > 0) project_logits(logit_rows(b, r.h, r.mix), n_rows, logits);
}

// The rows of h [T, H] that need logits, in chunk order: h itself when they are its leading rows
// in order (every decode step), else gathered into `gather`.
const float* Qwen35Model::logit_rows(const Batch& b, const float* h, float* gather) const {
  const int64_t H = cfg_.hidden;
  int64_t row = 0, r0 = 0;
  bool in_place = true;
  for (const SeqChunk& sc : b.seqs) {
    const int64_t first = sc.first_logit_row();
    in_place = in_place && (sc.n_new == first || row == r0 + first);
    row += sc.n_new - first;
    r0 += sc.n_new;
  }
  if (in_place) return h;
  row = r0 = 0;
  for (const SeqChunk& sc : b.seqs) {
    const int64_t first = sc.first_logit_row(), n = sc.n_new - first;
    if (n > 0) mem_copy(device(), gather + row * H, h + (r0 + first) * H, sizeof(float) * n * H);
    row += n;
    r0 += sc.n_new;
  }
  return gather;
}

// logits [n, V] of n final-normed rows. Tensor parallel (vocab-parallel lm_head): this rank holds
// rows [vocab_begin, vocab_begin + vocab_rows) (of a tied embedding: that slice of the table); each
// rank's part, padded to vocab_padded rows, is gathered, then copied back in vocabulary order.
void Qwen35Model::project_logits(const float* rows, int64_t n, float* logits) {
  if (!tp_data_) return be_->linear(rows, n, lm_head(), logits, {});
  const int64_t V = cfg_.vocab, mine = cfg_.vocab_rows, padded = cfg_.vocab_padded, size = tp_data_->size();
  WeightView head = lm_head();
  if (cfg_.tied_embeddings) {
    head.data = static_cast<const uint8_t*>(head.data) + cfg_.vocab_begin * dtype_bytes_for(head.dtype, head.cols);
    head.rows = mine;
  }
  ensure_tp_logits(n);  // TP steps run eagerly (no graph), so the space may grow here
  float* part = tp_logits_.as<float>();  // [n, padded], then every rank's part
  float* all = part + n * padded;
  be_->linear(rows, n, head, all, {});  // [n, mine] first, in the gather's space
  be_->copy_rows(part, padded, all, mine, mine, n);
  tp_data_->all_gather(part, n * padded, all);
  for (int64_t r = 0; r < size; ++r) {
    const int64_t v0 = r * padded, nv = std::min(padded, V - v0);
    if (nv > 0) be_->copy_rows(logits + v0, V, all + r * n * padded, padded, nv, n);
  }
}

// x += mixer(norm(x)); x += mlp(norm(x)). On entry h holds norm(x) (or s pends on it), on exit
// next_norm(x), for next_in, the projection that reads it.
NormState Qwen35Model::decoder_layer(const Layer& L, int64_t index, const Batch& b, KvPool& kv, GdnPool* gdn,
                                     NormState s, const float* next_norm, const Projection* next_in) {
  const int64_t T = n_tokens(b);
  const float* o = L.full ? mixer_attention(L, index, b, kv, s) : mixer_gdn(L, index, b, *gdn, s);
  s = residual_add(o, L.out, L.post_norm, &L.gate_up);
  Carve w{scratch()};
  float* act = w.take(T * cfg_.intermediate);
  be_->project_swiglu(residual().h, T, L.gate_up, cfg_.intermediate, act, s, w.p);
  return residual_add(act, L.down, next_norm, next_in);
}

// x += in W_producer^T, then h = norm(x). Tensor parallel: the producer's output is a partial sum
// per rank; it is all-reduced here, between the projection and the add, so the add cannot be
// fused into the producer's GEMV there (project then all-reduce then add_rms_norm).
NormState Qwen35Model::residual_add(const float* in, const Projection& producer, const float* norm,
                                    const Projection* consumer) {
  const Residual r = residual();
  if (!tp_data_) return be_->project_add_norm(in, step_.T, producer, r, norm, consumer);
  be_->project(in, step_.T, producer, r.mix, {});
  tp_data_->all_reduce_sum(r.mix, step_.T * r.dim);
  be_->add_rms_norm(r.x, r.mix, norm, step_.T, r.dim, r.eps, r.offset, r.h);
  return {};
}

// Returns o [T, Hv * dv], the gated-normed GDN output (in the workspace).
const float* Qwen35Model::mixer_gdn(const Layer& L, int64_t gi, const Batch& b, GdnPool& gdn, NormState s) {
  const ModelConfig& c = cfg_;
  const int64_t T = n_tokens(b);
  const int64_t C = c.conv_dim(), Hk = c.gdn_k_heads, Hv = c.gdn_v_heads, dk = c.gdn_k_dim, dv = c.gdn_v_dim;
  Carve w{scratch()};
  float* proj = w.take(T * L.in.width);
  float* y = w.take(T * C);
  float* o = w.take(T * Hv * dv);
  float* g = w.take(T * Hv);
  float* beta = w.take(T * Hv);
  float* ab = w.take(2 * T * Hv);
  be_->project(residual().h, T, L.in, proj, s);
  const Projection::Part u = L.in.part(0, proj, T), zp = L.in.part(1, proj, T), ap = L.in.part(2, proj, T),
                         bp = L.in.part(3, proj, T);
  bool all_decode = T == static_cast<int64_t>(b.seqs.size());
  for (const SeqChunk& sc : b.seqs) all_decode = all_decode && !sc.snapshot_inside();
  // The gates read a and b with one stride, the decode op dense rows: copied where needed. A
  // single row's stride is never read (gdn_gates, gdn_decode and conv1d index row 0 only).
  const bool one_row = T == 1;
  const float *a_ptr = ap.ptr, *b_ptr = bp.ptr;
  int64_t ab_stride = ap.stride;
  if (!one_row && (ap.stride != bp.stride || (all_decode && ap.stride != Hv))) {
    be_->copy_rows(ab, Hv, ap.ptr, ap.stride, Hv, T);
    be_->copy_rows(ab + T * Hv, Hv, bp.ptr, bp.stride, Hv, T);
    a_ptr = ab;
    b_ptr = ab + T * Hv;
    ab_stride = Hv;
  }
  if (all_decode) {
    // One token per sequence: conv step, norms, gates, the delta rule and the gated norm for every
    // sequence in one op; y holds dense qkv rows where needed. Row i is sequence i's token.
    const float* qkv = u.ptr;
    if (u.stride != C && !one_row) {
      be_->copy_rows(y, C, u.ptr, u.stride, C, T);
      qkv = y;
    }
    cpu::GdnDecodeArgs d{T, qkv, a_ptr, b_ptr, L.conv, L.A_log, L.dt_bias, step_.slots, step_.pos,
                         gdn.conv_state(0, gi), gdn.slot_floats(), gdn.recurrent_state(0, gi), gdn.slot_floats(),
                         Hk, Hv, dk, dv, c.conv_kernel, o};
    d.z = zp.ptr;
    d.z_stride = zp.stride;  // one token: sequence 0's z only, the stride is never applied
    d.norm_w = L.norm;
    d.norm_eps = c.eps;
    be_->gdn_decode(d);
    return o;
  }
  if (step_.chain_n > 0) gdn_chain(L, gi, gdn, u, a_ptr, b_ptr, ab_stride, y, o);
  gdn_pieces(L, gi, b, gdn, u, a_ptr, b_ptr, ab_stride, y, g, beta, o);
  be_->rms_norm_gated(o, zp.ptr, L.norm, T * Hv, dv, c.eps, o, Hv, zp.stride);
  return o;
}

// The chained sequences' GDN core (plan_chain) in one op; o rows before the gated norm (the
// caller's, over every row); y: conv output scratch [T, C].
void Qwen35Model::gdn_chain(const Layer& L, int64_t gi, GdnPool& gdn, const Projection::Part& u, const float* a,
                            const float* bb, int64_t ab_stride, float* y, float* o) {
  const ModelConfig& c = cfg_;
  const int64_t n = step_.chain_n;
  const int32_t* d = step_.chain;
  cpu::GdnChainArgs args{n, u.ptr, u.stride, a, bb, ab_stride, L.conv, L.A_log, L.dt_bias, d, d + n, d + 2 * n,
                         d + 3 * n, d + 4 * n, d + 5 * n, gdn.conv_state(0, gi), gdn.slot_floats(),
                         gdn.recurrent_state(0, gi), gdn.slot_floats(), c.gdn_k_heads, c.gdn_v_heads, c.gdn_k_dim,
                         c.gdn_v_dim, c.conv_kernel, o, y};
  be_->gdn_chain(args);
}

// Prefill chunks (and mixed batches): per sequence, the conv and the delta rule cut at its
// snapshot points (each piece continues from the state the last left, at the position after it:
// the conv ring is indexed by absolute position); the state at a cut is copied to its snapshot slot.
void Qwen35Model::gdn_pieces(const Layer& L, int64_t gi, const Batch& b, GdnPool& gdn, const Projection::Part& u,
                             const float* a, const float* bb, int64_t ab_stride, float* y, float* g, float* beta,
                             float* o) {
  const ModelConfig& c = cfg_;
  const int64_t T = n_tokens(b);
  const int64_t C = c.conv_dim(), Hk = c.gdn_k_heads, Hv = c.gdn_v_heads, dk = c.gdn_k_dim, dv = c.gdn_v_dim;
  if (step_.chain_all) return;  // gdn_chain ran every sequence
  be_->gdn_gates(a, bb, ab_stride, T, Hv, L.A_log, L.dt_bias, g, beta);
  // piece(s, begin, n): rows begin .. begin + n of sequence s's chunk; state(slot): its state.
  auto pieces = [&](const std::function<void(const SeqChunk&, int64_t, int64_t, int64_t)>& piece,
                    const std::function<float*(int32_t)>& state, int64_t floats) {
    int64_t r0 = 0;
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      const SeqChunk& s = b.seqs[i];
      if (step_.chain_seq[i]) {
        r0 += s.n_new;
        continue;
      }
      int64_t done = 0;
      for (const auto& [offset, slot] : s.snapshots) {
        if (offset == s.n_new) continue;  // after the layers (forward)
        if (offset > done) piece(s, r0, done, offset - done);
        done = std::max(done, offset);
        mem_copy(device(), state(slot), state(s.gdn_slot), sizeof(float) * floats);
      }
      if (s.n_new > done) piece(s, r0, done, s.n_new - done);
      r0 += s.n_new;
    }
  };
  pieces(
      [&](const SeqChunk& s, int64_t r0, int64_t done, int64_t n) {
        be_->conv1d_causal(u.ptr + (r0 + done) * u.stride, n, u.stride, C, L.conv, c.conv_kernel, s.n_past + done,
                           gdn.conv_state(s.gdn_slot, gi), y + (r0 + done) * C);
      },
      [&](int32_t slot) { return gdn.conv_state(slot, gi); }, gdn.conv_floats());
  be_->l2_norm_heads(y, T, C, Hk, dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(dk)));
  be_->l2_norm_heads(y + Hk * dk, T, C, Hk, dk, 1e-6f, 1.0f);
  pieces(
      [&](const SeqChunk& s, int64_t r0, int64_t done, int64_t n) {
        const int64_t p0 = r0 + done;
        be_->gdn_rule({y + p0 * C, y + p0 * C + Hk * dk, C, y + p0 * C + 2 * Hk * dk, C, g + p0 * Hv, beta + p0 * Hv, n,
                       Hk, Hv, dk, dv, gdn.recurrent_state(s.gdn_slot, gi), o + p0 * Hv * dv});
      },
      [&](int32_t slot) { return gdn.recurrent_state(slot, gi); }, gdn.rec_floats());
}

// Returns o [T, Hq * D], the gated attention output (in the workspace).
const float* Qwen35Model::mixer_attention(const Layer& L, int64_t ai, const Batch& b, KvPool& kv, NormState s) {
  const ModelConfig& c = cfg_;
  const int64_t T = n_tokens(b);
  const int64_t Hq = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim;
  Carve w{scratch()};
  float* proj = w.take(T * L.in.width);
  float* q = w.take(T * Hq * D);
  float* gate = w.take(T * Hq * D);
  float* o = w.take(T * Hq * D);
  float* kb = w.take(T * Hkv * D);
  float* vb = w.take(T * Hkv * D);
  be_->project(residual().h, T, L.in, proj, s);
  const Projection::Part qp = L.in.part(0, proj, T), kp = L.in.part(1, proj, T), vp = L.in.part(2, proj, T);
  // q_proj rows per head: D query rows then D gate rows. q and k are normed and rotated; k and v
  // go to the cache.
  const cpu::PagedKV layer = kv.layer(ai);
  be_->attention_inputs({qp.ptr, qp.stride, kp.ptr, kp.stride, vp.ptr, vp.stride, L.q_norm, L.k_norm, step_.pos, T, Hq,
                         Hkv, D, c.rot_dim, c.eps, c.rope_theta, q, gate, kb, vb},
                        layer, step_.cache_rows);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  int64_t r0 = 0;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const SeqChunk& sc = b.seqs[i];
    be_->attention_paged(q + r0 * Hq * D, sc.n_new, sc.n_past, Hq, layer, step_.pages + step_.page_off[i], scale,
                         gate + r0 * Hq * D, o + r0 * Hq * D);
    r0 += sc.n_new;
  }
  return o;
}

}  // namespace pe
