#include "model/qwen35.h"
#include "model/qwen35_parts.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"

namespace pe {

Qwen35Model::Qwen35Model(const ModelConfig& cfg) : Model(cfg), ws_(new Workspace) {}
Qwen35Model::~Qwen35Model() = default;

void Qwen35Model::finalize() {
  weights_.finalize();
  if (weight_quant_ != DType::F32) weights_.quantize(weight_quant_);
  layers_.clear();
  for (int64_t i = 0; i < cfg_.n_layers; ++i)
    layers_.push_back(layer_views("layers." + std::to_string(i) + ".", cfg_.is_full_attention[i]));
  if (weights_.has_mtp()) mtp_layer_ = std::make_unique<LayerViews>(layer_views("mtp.layers.0.", true));
}

Qwen35Model::LayerViews Qwen35Model::layer_views(const std::string& p, bool full) const {
  LayerViews L;
  L.full = full;
  L.input_norm = weights_.vec(p + "input_layernorm.weight");
  L.post_norm = weights_.vec(p + "post_attention_layernorm.weight");
  L.gate = weights_.matrix(p + "mlp.gate_proj.weight");
  L.up = weights_.matrix(p + "mlp.up_proj.weight");
  L.down = weights_.matrix(p + "mlp.down_proj.weight");
  if (full) {
    const std::string a = p + "self_attn.";
    L.q = weights_.matrix(a + "q_proj.weight");
    L.k = weights_.matrix(a + "k_proj.weight");
    L.v = weights_.matrix(a + "v_proj.weight");
    L.o = weights_.matrix(a + "o_proj.weight");
    L.q_norm = weights_.vec(a + "q_norm.weight");
    L.k_norm = weights_.vec(a + "k_norm.weight");
  } else {
    const std::string g = p + "linear_attn.";
    L.qkv = weights_.matrix(g + "in_proj_qkv.weight");
    L.z = weights_.matrix(g + "in_proj_z.weight");
    L.b = weights_.matrix(g + "in_proj_b.weight");
    L.a = weights_.matrix(g + "in_proj_a.weight");
    L.out = weights_.matrix(g + "out_proj.weight");
    L.conv = weights_.vec(g + "conv1d.weight");
    L.dt_bias = weights_.vec(g + "dt_bias");
    L.A_log = weights_.vec(g + "A_log");
    L.norm = weights_.vec(g + "norm.weight");
  }
  return L;
}

void Qwen35Model::mixer_gdn(const LayerViews& L, int64_t gi, const Batch& b, GdnPool& gdn,
                            const float* x, float* out, Workspace& ws) {
  const ModelConfig& c = cfg_;
  const int64_t T = static_cast<int64_t>(b.tokens.size());
  const int64_t C = c.conv_dim(), Hk = c.gdn_k_heads, Hv = c.gdn_v_heads, dk = c.gdn_k_dim, dv = c.gdn_v_dim;
  float* u = Workspace::get(ws.t0, T * C);       // in_proj_qkv, raw (pre-conv)
  float* y = Workspace::get(ws.t1, T * C);       // after conv + SiLU: q | k | v
  float* z = Workspace::get(ws.t2, T * Hv * dv);
  float* ab = Workspace::get(ws.t3, T * Hv * 4);  // a | b | g | beta, each [T, Hv]
  float* a = ab;
  float* bb = ab + T * Hv;
  float* g = ab + 2 * T * Hv;
  float* beta = ab + 3 * T * Hv;
  float* o = Workspace::get(ws.t4, T * Hv * dv);
  cpu::linear(x, T, L.qkv, u);
  cpu::linear(x, T, L.z, z);
  cpu::linear(x, T, L.a, a);
  cpu::linear(x, T, L.b, bb);
  bool all_decode = T == static_cast<int64_t>(b.seqs.size());
  for (const SeqChunk& s : b.seqs) all_decode = all_decode && !s.snapshot_inside();
  if (all_decode) {
    // One token per sequence: the batched step, parallel over (sequence, value head). Row i is
    // sequence i's token, so ws.pos (set_positions) holds the positions per sequence.
    ws.slots.clear();
    for (const SeqChunk& s : b.seqs) ws.slots.push_back(s.gdn_slot);
    cpu::GdnDecodeArgs d{T, u, a, bb, L.conv, L.A_log, L.dt_bias, ws.slots.data(), ws.pos.data(),
                         gdn.conv_state(0, gi), gdn.slot_floats(), gdn.recurrent_state(0, gi), gdn.slot_floats(),
                         Hk, Hv, dk, dv, c.conv_kernel, o};
    cpu::gdn_decode(d);
    cpu::rms_norm_gated(o, z, L.norm, T * Hv, dv, c.eps, o);
    cpu::linear(o, T, L.out, out);
    all_reduce(out, T * c.hidden);
    return;
  }
  cpu::gdn_gates(a, bb, Hv, T, Hv, L.A_log, L.dt_bias, g, beta);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  int64_t r0 = 0;
  for (const SeqChunk& s : b.seqs) {
    // Split the chunk at snapshot points; each piece continues from the state the last left, at
    // the position after it (the conv ring is indexed by absolute position).
    int64_t done = 0;
    auto run_piece = [&](int64_t n) {
      if (n <= 0) return;
      const int64_t p0 = r0 + done;
      cpu::conv1d_causal(u + p0 * C, n, C, C, L.conv, c.conv_kernel, s.n_past + done, gdn.conv_state(s.gdn_slot, gi),
                         y + p0 * C);
      for (int64_t t = p0; t < p0 + n; ++t) {
        cpu::l2_norm(y + t * C, Hk, dk, 1e-6f, q_scale);
        cpu::l2_norm(y + t * C + Hk * dk, Hk, dk, 1e-6f, 1.0f);
      }
      cpu::GdnArgs args{y + p0 * C,  y + p0 * C + Hk * dk, C,  y + p0 * C + 2 * Hk * dk, C,
                        g + p0 * Hv, beta + p0 * Hv,        n,  Hk, Hv, dk, dv,
                        gdn.recurrent_state(s.gdn_slot, gi), o + p0 * Hv * dv};
      if (n > 1)
        cpu::gdn_chunked(args);
      else
        cpu::gdn_recurrent(args);
      done += n;
    };
    for (const auto& [offset, slot] : s.snapshots) {
      if (offset == s.n_new) continue;  // take_end_snapshots, after the layers
      run_piece(offset - done);
      std::memcpy(gdn.conv_state(slot, gi), gdn.conv_state(s.gdn_slot, gi), sizeof(float) * gdn.conv_floats());
      std::memcpy(gdn.recurrent_state(slot, gi), gdn.recurrent_state(s.gdn_slot, gi),
                  sizeof(float) * gdn.rec_floats());
    }
    run_piece(s.n_new - done);
    r0 += s.n_new;
  }
  cpu::rms_norm_gated(o, z, L.norm, T * Hv, dv, c.eps, o);
  cpu::linear(o, T, L.out, out);
  all_reduce(out, T * c.hidden);
}

void Qwen35Model::mixer_attention(const LayerViews& L, int64_t ai, const Batch& b, KvPool& kv,
                                  const float* x, float* out, Workspace& ws) {
  const ModelConfig& c = cfg_;
  const int64_t T = static_cast<int64_t>(b.tokens.size());
  const int64_t Hq = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim;
  float* qg = Workspace::get(ws.t0, T * Hq * 2 * D);
  float* q = Workspace::get(ws.t1, T * Hq * D);
  float* gate = Workspace::get(ws.t2, T * Hq * D);
  float* kb = Workspace::get(ws.t3, T * Hkv * D * 2);
  float* vb = kb + T * Hkv * D;
  float* o = Workspace::get(ws.t4, T * Hq * D);
  cpu::linear(x, T, L.q, qg);
  cpu::linear(x, T, L.k, kb);
  cpu::linear(x, T, L.v, vb);
  // q_proj rows per head: D query rows then D gate rows; q and k normed and rotated, k in place.
  cpu::attention_inputs({qg, Hq * 2 * D, kb, Hkv * D, vb, Hkv * D, L.q_norm, L.k_norm, ws.pos.data(), T, Hq, Hkv, D,
                         c.rot_dim, c.eps, c.rope_theta, q, gate, kb, vb});
  cpu::PagedKV layer = kv.layer(ai);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  int64_t r0 = 0;
  for (const SeqChunk& s : b.seqs) {
    cpu::kv_write(layer, s.page_table, s.n_past, s.n_new, kb + r0 * Hkv * D, vb + r0 * Hkv * D);
    cpu::attention_paged(q + r0 * Hq * D, s.n_new, s.n_past, Hq, layer, s.page_table, scale,
                         gate + r0 * Hq * D, o + r0 * Hq * D);
    r0 += s.n_new;
  }
  cpu::linear(o, T, L.o, out);
  all_reduce(out, T * c.hidden);
}

void Qwen35Model::mlp(const LayerViews& L, int64_t n, const float* x, float* out, Workspace& ws) {
  const int64_t I = cfg_.intermediate;
  float* gu = Workspace::get(ws.t0, n * 2 * I);
  float* gate = Workspace::get(ws.t1, n * I);
  float* up = Workspace::get(ws.t2, n * I);
  cpu::linear(x, n, L.gate, gate);
  cpu::linear(x, n, L.up, up);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(gu + t * 2 * I, gate + t * I, sizeof(float) * I);
    std::memcpy(gu + t * 2 * I + I, up + t * I, sizeof(float) * I);
  }
  float* act = Workspace::get(ws.t3, n * I);
  cpu::swiglu(gu, n, I, act);
  cpu::linear(act, n, L.down, out);
  all_reduce(out, n * cfg_.hidden);
}

// h = x + mixer(norm(x)); x = h + mlp(norm(h)), in place on x [n_tokens, H].
void Qwen35Model::decoder_layer(const LayerViews& L, int64_t index, const Batch& b, KvPool& kv, GdnPool* gdn,
                                float* x, Workspace& ws) {
  const int64_t T = static_cast<int64_t>(b.tokens.size()), H = cfg_.hidden;
  float* h = Workspace::get(ws.h, T * H);
  float* mix = Workspace::get(ws.mix, T * H);
  cpu::rms_norm(x, L.input_norm, T, H, cfg_.eps, true, h);
  if (L.full)
    mixer_attention(L, index, b, kv, h, mix, ws);
  else
    mixer_gdn(L, index, b, *gdn, h, mix, ws);
  cpu::add_rms_norm(x, mix, L.post_norm, T, H, cfg_.eps, true, h);
  mlp(L, T, h, mix, ws);
  cpu::add(x, mix, T * H, x);
}

void Qwen35Model::set_positions(const Batch& b, Workspace& ws) {
  int64_t total = 0;
  ws.pos.resize(b.tokens.size());
  for (const SeqChunk& s : b.seqs) {
    for (int64_t i = 0; i < s.n_new; ++i) ws.pos[total + i] = static_cast<int32_t>(s.n_past + i);
    total += s.n_new;
  }
  if (total != static_cast<int64_t>(b.tokens.size()))
    fail(PE_ERR_INTERNAL, "batch has ", b.tokens.size(), " tokens but its chunks cover ", total);
}

void Qwen35Model::forward(const Batch& b, KvPool& kv, GdnPool& gdn, ForwardResult& res) {
  std::lock_guard<std::mutex> lock(forward_mu_);
  if (kv.device() != Device::CPU || gdn.device() != Device::CPU)
    fail(PE_ERR_INVALID_ARGUMENT, "the CPU model needs KV and GDN pools in host memory");
  const ModelConfig& c = cfg_;
  Workspace& ws = *ws_;
  const int64_t T = static_cast<int64_t>(b.tokens.size());
  const int64_t H = c.hidden;
  set_positions(b, ws);
  const std::vector<int32_t>& tokens = host_tokens(b);
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab) fail(PE_ERR_INVALID_ARGUMENT, "token id ", t, " outside the vocabulary");

  float* x = Workspace::get(ws.x, T * H);
  cpu::embedding(weights_.matrix("embed_tokens.weight"), tokens.data(), T, x);
  int64_t gi = 0, ai = 0;
  for (const LayerViews& L : layers_) decoder_layer(L, L.full ? ai++ : gi++, b, kv, &gdn, x, ws);
  take_end_snapshots(b, gdn);
  res.hidden.resize(T * H);
  cpu::rms_norm(x, weights_.vec("norm.weight"), T, H, c.eps, true, res.hidden.data());

  // Gather the rows that need logits, then one lm_head matmul over them.
  res.logit_row_begin.clear();
  int64_t n_rows = 0, r0 = 0;
  float* sel = Workspace::get(ws.t5, T * H);
  for (const SeqChunk& s : b.seqs) {
    res.logit_row_begin.push_back(n_rows);
    for (int64_t i = s.first_logit_row(); i < s.n_new; ++i, ++n_rows)
      std::memcpy(sel + n_rows * H, res.hidden.data() + (r0 + i) * H, sizeof(float) * H);
    r0 += s.n_new;
  }
  res.logits.resize(n_rows * c.vocab);
  if (n_rows > 0) lm_head(sel, n_rows, res.logits.data());
}

void Qwen35Model::lm_head(const float* x, int64_t n, float* logits) {
  WeightView head = cfg_.tied_embeddings ? weights_.matrix("embed_tokens.weight") : weights_.matrix("lm_head.weight");
  if (!tp_data_) return cpu::linear(x, n, head, logits);
  // Vocab-parallel: this rank's rows (of the tied embedding: its slice), every rank's part padded
  // to vocab_padded, gathered, then put back in vocabulary order.
  const int64_t V = cfg_.vocab, rows = cfg_.vocab_rows, padded = cfg_.vocab_padded, size = tp_data_->size();
  if (cfg_.tied_embeddings) {
    const size_t row_bytes = dtype_bytes_for(head.dtype, head.cols);
    head.data = static_cast<const uint8_t*>(head.data) + cfg_.vocab_begin * row_bytes;
    head.rows = rows;
  }
  std::vector<float> part(static_cast<size_t>(n * padded), 0.0f), all(static_cast<size_t>(size * n * padded));
  std::vector<float> mine(static_cast<size_t>(n * rows));
  cpu::linear(x, n, head, mine.data());
  for (int64_t t = 0; t < n; ++t) std::memcpy(&part[t * padded], &mine[t * rows], sizeof(float) * rows);
  tp_data_->all_gather(part.data(), n * padded, all.data());
  for (int64_t r = 0; r < size; ++r) {
    const int64_t v0 = r * padded, nv = std::min(padded, V - v0);
    for (int64_t t = 0; t < n && nv > 0; ++t)
      std::memcpy(logits + t * V + v0, &all[(r * n + t) * padded], sizeof(float) * nv);
  }
}

void Qwen35Model::all_reduce(float* x, int64_t n) {
  if (tp_data_) tp_data_->all_reduce_sum(x, n);
}

}  // namespace pe
