// The DFlash draft's forward, once for every backend (dflash.h has the math): the step's indices,
// the new context rows into the draft's KV cache, then the blocks through the draft layers and the
// target's lm_head. Activations live in one workspace, bump-allocated per step (256-byte aligned).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "model/dflash.h"

namespace pe {
namespace {

int64_t n_new_total(const std::vector<DraftSeq>& seqs) {
  int64_t n = 0;
  for (const DraftSeq& s : seqs) n += s.n_new;
  return n;
}

// The sequence whose features are the step's whole context, token-major as the fc projection
// reads them (none: they are gathered), or -1.
int64_t sole_context(const std::vector<DraftSeq>& seqs, int64_t H, int64_t FW) {
  int64_t sole = -1;
  for (size_t i = 0; i < seqs.size(); ++i)
    if (seqs[i].n_new > 0) {
      if (sole >= 0) return -1;
      sole = static_cast<int64_t>(i);
    }
  if (sole >= 0 && (seqs[sole].layer_stride != H || seqs[sole].row_stride != FW)) return -1;
  return sole;
}

}  // namespace

float* DFlashDraft::take(int64_t floats) {
  const int64_t n = aligned_floats(floats);
  if ((work_used_ + n) * static_cast<int64_t>(sizeof(float)) > static_cast<int64_t>(work_.size()))
    fail(PE_ERR_INTERNAL, "draft workspace: ", work_used_ + n, " floats taken of ", work_.size() / sizeof(float));
  float* p = work_.as<float>() + work_used_;
  work_used_ += n;
  return p;
}

// Every take of context_rows and block_rows for T_ctx context rows and n_blocks blocks.
int64_t DFlashDraft::workspace_floats(int64_t T_ctx, int64_t n_blocks, bool gathered) const {
  const int64_t H = cfg_.hidden, qd = cfg_.n_heads * cfg_.head_dim, kvd = cfg_.n_kv_heads * cfg_.head_dim;
  const int64_t kvw = layers_.front().kv.width, bs = cfg_.block_size, T_blk = n_blocks * bs;
  const int64_t context = T_ctx == 0 ? 0
                          : (gathered ? aligned_floats(T_ctx * cfg_.n_features() * H) : 0) + aligned_floats(T_ctx * H) +
                                aligned_floats(T_ctx * kvw) + 2 * aligned_floats(T_ctx * kvd);
  const int64_t block = n_blocks == 0 ? 0
                        : 3 * aligned_floats(T_blk * H) + 3 * aligned_floats(T_blk * qd) + aligned_floats(T_blk * kvw) +
                              2 * aligned_floats(T_blk * kvd) + Backend::attention_blocks_scratch(n_blocks, bs, cfg_.n_heads, cfg_.head_dim) +
                              aligned_floats(T_blk * cfg_.intermediate) +
                              Backend::project_swiglu_scratch(T_blk, layers_.front().gate_up, cfg_.intermediate) +
                              aligned_floats(n_blocks * (bs - 1) * H);
  return context + block;
}

void DFlashDraft::ensure_workspace(int64_t floats) {
  if (work_.size() < static_cast<size_t>(floats) * sizeof(float)) work_ = Buffer(device(), sizeof(float) * floats);
}

void DFlashDraft::reserve(int64_t ctx_rows, int64_t n_blocks, int64_t max_context, int64_t page_size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ready_) fail(PE_ERR_STATE, "the draft is not finalized");
  ensure_workspace(workspace_floats(ctx_rows, n_blocks, true));
  const int64_t ints = (4 + 2 * cfg_.n_kv_heads) * n_blocks * cfg_.block_size + (2 + cfg_.n_features()) * ctx_rows +
                      n_blocks * ((max_context + cfg_.block_size) / page_size + 2);
  be_->reserve(shape_cfg_, ctx_rows + n_blocks * cfg_.block_size, std::max<int64_t>(n_blocks * (cfg_.block_size - 1), 1),
               ints, be_->attention_scratch_bytes(1, max_context, shape_cfg_));
}

// Validates the sequences, sizes the workspace and uploads the step's ints in one copy: block
// tokens | context positions | block positions | context cache rows | block cache rows | page tables
// | context feature row ids (where one gather takes them) | the blocks' proposing rows | the block
// attention's row permutations.
void DFlashDraft::prepare_step(const std::vector<DraftSeq>& seqs, const KvPool& kv, int64_t logit_rows) {
  const int64_t bs = cfg_.block_size, ps = kv.page_size(), H = cfg_.hidden, FW = cfg_.n_features() * H;
  step_.drafting.clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DraftSeq& s = seqs[i];
    if (s.n_context < 0 || s.n_new < 0 || !s.page_table || (s.n_new > 0 && !s.features))
      fail(PE_ERR_INVALID_ARGUMENT, "draft sequence ", i, ": negative length, no page table or no features");
    if (s.n_new > 0 && (s.layer_stride < H || s.row_stride < H))
      fail(PE_ERR_INVALID_ARGUMENT, "draft sequence ", i, ": feature strides ", s.layer_stride, " / ", s.row_stride,
           " below the hidden size ", H);
    if (s.draft && (s.last_token < 0 || s.last_token >= cfg_.vocab))
      fail(PE_ERR_INVALID_ARGUMENT, "draft sequence ", i, ": token id ", s.last_token, " outside the vocabulary");
    const int64_t pages = (s.n_context + s.n_new + (s.draft ? bs : 0) + ps - 1) / ps;
    for (int64_t p = 0; p < pages; ++p)
      if (s.page_table[p] < 0 || s.page_table[p] >= kv.n_pages())
        fail(PE_ERR_INVALID_ARGUMENT, "draft sequence ", i, ": page ", s.page_table[p], " outside the pool of ",
             kv.n_pages());
    if (s.draft && (s.n_logits == 0 || s.n_logits > bs - 1))
      fail(PE_ERR_INVALID_ARGUMENT, "draft sequence ", i, ": ", s.n_logits, " logit rows of a block of ", bs);
    if (s.draft) step_.drafting.push_back(static_cast<int64_t>(i));
  }
  const int64_t T_ctx = n_new_total(seqs), n_blocks = static_cast<int64_t>(step_.drafting.size()), T_blk = n_blocks * bs;
  std::vector<int32_t>& h = host_ints_;
  h.clear();
  for (int64_t i : step_.drafting) {
    h.push_back(seqs[i].last_token);
    h.insert(h.end(), bs - 1, cfg_.mask_token);
  }
  auto each_row = [&](bool block, auto&& put) {
    for (const DraftSeq& s : seqs) {
      if (block && !s.draft) continue;
      const int64_t p0 = block ? s.n_context + s.n_new : s.n_context, len = block ? bs : s.n_new;
      for (int64_t t = p0; t < p0 + len; ++t) put(s, t);
    }
  };
  auto position = [&](const DraftSeq&, int64_t t) { h.push_back(static_cast<int32_t>(t)); };
  auto cache_row = [&](const DraftSeq& s, int64_t t) {
    h.push_back(static_cast<int32_t>(static_cast<int64_t>(s.page_table[t / ps]) * ps + t % ps));
  };
  each_row(false, position);
  each_row(true, position);
  each_row(false, cache_row);
  each_row(true, cache_row);
  step_.page_off.clear();
  size_t attn_scratch = 0;
  for (int64_t i : step_.drafting) {
    const DraftSeq& s = seqs[i];
    const int64_t end = s.n_context + s.n_new + bs;
    step_.page_off.push_back(static_cast<int64_t>(h.size()) - (T_blk + 2 * T_ctx + 2 * T_blk));
    h.insert(h.end(), s.page_table, s.page_table + (end + ps - 1) / ps);
    attn_scratch = std::max(attn_scratch, be_->attention_scratch_bytes(1, end - 1, shape_cfg_));
  }
  const int64_t feat_off = static_cast<int64_t>(h.size());
  step_.feat_base = sole_context(seqs, H, FW) < 0 ? feature_ids(seqs, h) : nullptr;
  const int64_t blk_off = static_cast<int64_t>(h.size());
  for (size_t b = 0; b < step_.drafting.size(); ++b)
    for (int64_t i = 0; i < seqs[step_.drafting[b]].logit_rows(bs); ++i)
      h.push_back(static_cast<int32_t>(static_cast<int64_t>(b) * bs + 1 + i));
  const int64_t perm_off = static_cast<int64_t>(h.size());
  Backend::attention_blocks_perm(n_blocks, bs, cfg_.n_kv_heads, h);
  step_.starts.clear();
  for (int64_t i : step_.drafting) step_.starts.push_back(seqs[i].n_context + seqs[i].n_new);
  ensure_workspace(workspace_floats(T_ctx, n_blocks, sole_context(seqs, H, FW) < 0));
  work_used_ = 0;
  be_->reserve(shape_cfg_, T_ctx + T_blk, std::max<int64_t>(logit_rows, 1), static_cast<int64_t>(h.size()), attn_scratch);
  const int32_t* d = be_->upload_ints(h);
  step_.T_ctx = T_ctx;
  step_.T_blk = T_blk;
  step_.ids = d;
  step_.pos_ctx = d + T_blk;
  step_.pos_blk = step_.pos_ctx + T_ctx;
  step_.rows_ctx = step_.pos_blk + T_blk;
  step_.rows_blk = step_.rows_ctx + T_ctx;
  step_.pages = step_.rows_blk + T_blk;
  step_.feat_ids = step_.feat_base ? d + feat_off : nullptr;
  step_.blk_ids = d + blk_off;
  step_.perm = d + perm_off;
  step_.page_tables.clear();
  for (int64_t off : step_.page_off) step_.page_tables.push_back(step_.pages + off);
}

// Appends the context features' row ids (token-major: row t's feature j at t * n_features + j)
// relative to the lowest feature pointer, and returns it; null (nothing appended) where a
// sequence's features or strides are not whole hidden-wide rows from there.
const float* DFlashDraft::feature_ids(const std::vector<DraftSeq>& seqs, std::vector<int32_t>& h) {
  const int64_t H = cfg_.hidden, F = cfg_.n_features();
  // Addresses as integers: the sequences' features may lie in different allocations.
  const float* base = nullptr;
  for (const DraftSeq& s : seqs)
    if (s.n_new > 0 && (!base || reinterpret_cast<uintptr_t>(s.features) < reinterpret_cast<uintptr_t>(base)))
      base = s.features;
  const size_t begin = h.size();
  int64_t max_id = -1;
  for (const DraftSeq& s : seqs) {
    if (s.n_new <= 0) continue;
    const uintptr_t bytes = reinterpret_cast<uintptr_t>(s.features) - reinterpret_cast<uintptr_t>(base);
    const int64_t off = static_cast<int64_t>(bytes / sizeof(float));
    if (bytes % sizeof(float) != 0 || off % H != 0 || s.layer_stride % H != 0 || s.row_stride % H != 0) {
      h.resize(begin);
      return nullptr;
    }
    for (int64_t t = 0; t < s.n_new; ++t)
      for (int64_t j = 0; j < F; ++j) {
        const int64_t id = (off + j * s.layer_stride + t * s.row_stride) / H;
        max_id = std::max(max_id, id);
        h.push_back(static_cast<int32_t>(id));
      }
  }
  if (max_id < 0 || max_id > INT32_MAX) {
    h.resize(begin);
    return nullptr;
  }
  step_.feat_rows = max_id + 1;
  return base;
}

void DFlashDraft::forward(const std::vector<DraftSeq>& seqs, KvPool& kv, bool host_outputs, ForwardResult& res) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ready_) fail(PE_ERR_STATE, "the draft is not finalized");
  if (kv.device() != device())
    fail(PE_ERR_INVALID_ARGUMENT, "the draft's KV pool must live on its device (", device() == Device::CPU ? "cpu" : "cuda", ")");
  const cpu::PagedKV probe = kv.layer(0);
  if (kv.n_layers() != cfg_.n_layers || probe.n_kv_heads != cfg_.n_kv_heads || probe.head_dim != cfg_.head_dim)
    fail(PE_ERR_INVALID_ARGUMENT, "draft KV pool of ", kv.n_layers(), " layers x ", probe.n_kv_heads, " heads of ",
         probe.head_dim, ", the draft needs ", cfg_.n_layers, " x ", cfg_.n_kv_heads, " of ", cfg_.head_dim);
  const int64_t bs = cfg_.block_size;
  int64_t rows = 0;
  res.logit_row_begin.clear();
  for (const DraftSeq& s : seqs) {
    res.logit_row_begin.push_back(s.draft ? rows : -1);
    if (s.draft) rows += s.logit_rows(bs);
  }
  if (seqs.empty()) {
    res.logits.clear();
    res.hidden.clear();
    return;
  }
  prepare_step(seqs, kv, rows);
  float* logits = be_->logits_buffer(rows, cfg_.vocab, host_outputs, res);
  const float* hidden = nullptr;
  be_->run_step(-1, [&] {
    context_rows(seqs, kv);
    if (rows > 0) hidden = block_rows(seqs, kv, logits, rows);
  });
  be_->finish_step(logits, rows, cfg_.vocab, hidden, rows, cfg_.hidden, host_outputs, res);
}

// C = hidden_norm(fc(features)) of the new context rows, then per layer their keys (k_norm, RoPE)
// and values into the draft's cache rows.
void DFlashDraft::context_rows(const std::vector<DraftSeq>& seqs, KvPool& kv) {
  const int64_t T = step_.T_ctx;
  if (T == 0) return;
  const int64_t H = cfg_.hidden, FW = cfg_.n_features() * H, D = cfg_.head_dim, Hkv = cfg_.n_kv_heads;
  const int64_t sole = sole_context(seqs, H, FW);
  const float* feat = sole >= 0 ? seqs[sole].features : nullptr;
  if (sole < 0) {  // token-major [T, FW], feature j at columns j * H
    float* gathered = take(T * FW);
    if (step_.feat_base) {  // one gather (prepare_step)
      WeightView table;
      table.rows = step_.feat_rows;
      table.cols = H;
      table.data = step_.feat_base;
      be_->embedding(table, step_.feat_ids, T * cfg_.n_features(), gathered);
    } else {
      int64_t r0 = 0;
      for (const DraftSeq& s : seqs) {
        for (int64_t j = 0; s.n_new > 0 && j < cfg_.n_features(); ++j)
          be_->copy_rows(gathered + r0 * FW + j * H, FW, s.features + j * s.layer_stride, s.row_stride, H, s.n_new);
        r0 += s.n_new;
      }
    }
    feat = gathered;
  }
  float* ctx = take(T * H);
  be_->project(feat, T, fc_, ctx, {});
  be_->rms_norm(ctx, hidden_norm_, T, H, cfg_.eps, false, ctx);
  float* kvp = take(T * layers_.front().kv.width);
  float* kb = take(T * Hkv * D);
  float* vb = take(T * Hkv * D);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    be_->project(ctx, T, L.kv, kvp, {});
    const Projection::Part k = L.kv.part(0, kvp, T), v = L.kv.part(1, kvp, T);
    cpu::AttnInputArgs a{nullptr, 0, k.ptr, k.stride, v.ptr, v.stride, L.q_norm, L.k_norm, step_.pos_ctx, T, 0, Hkv, D,
                         D, cfg_.eps, cfg_.rope_theta, nullptr, nullptr, kb, vb};
    a.gated = false;
    a.norm_offset = false;
    be_->attention_inputs(a, kv.layer(static_cast<int64_t>(l)), step_.rows_ctx);
  }
}

// The blocks through the draft layers; logits of rows 1 .. n_logits of every block. Returns those
// rows' final-normed hidden states (in the workspace).
const float* DFlashDraft::block_rows(const std::vector<DraftSeq>& seqs, KvPool& kv, float* logits, int64_t n_rows) {
  const int64_t T = step_.T_blk, bs = cfg_.block_size, H = cfg_.hidden, Hq = cfg_.n_heads, Hkv = cfg_.n_kv_heads;
  const int64_t D = cfg_.head_dim, I = cfg_.intermediate, qd = Hq * D;
  const Residual r{take(T * H), take(T * H), take(T * H), H, cfg_.eps, false};
  float* qraw = take(T * qd);
  float* q = take(T * qd);
  float* o = take(T * qd);
  float* kvp = take(T * layers_.front().kv.width);
  float* kb = take(T * Hkv * D);
  float* vb = take(T * Hkv * D);
  float* attn = take(Backend::attention_blocks_scratch(static_cast<int64_t>(step_.drafting.size()), bs, Hq, D));
  float* act = take(T * I);
  float* swiglu = take(Backend::project_swiglu_scratch(T, layers_.front().gate_up, I));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  be_->embed_norm(target_.embedding_table(), step_.ids, T, r, layers_.front().input_norm, nullptr);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const cpu::PagedKV layer = kv.layer(static_cast<int64_t>(l));
    be_->project(r.h, T, L.q, qraw, {});
    be_->project(r.h, T, L.kv, kvp, {});
    const Projection::Part k = L.kv.part(0, kvp, T), v = L.kv.part(1, kvp, T);
    cpu::AttnInputArgs a{qraw, qd, k.ptr, k.stride, v.ptr, v.stride, L.q_norm, L.k_norm, step_.pos_blk, T, Hq, Hkv, D,
                         D, cfg_.eps, cfg_.rope_theta, q, nullptr, kb, vb};
    a.gated = false;
    a.norm_offset = false;
    be_->attention_inputs(a, layer, step_.rows_blk);
    be_->attention_blocks(q, static_cast<int64_t>(step_.drafting.size()), bs, step_.starts.data(), Hq, layer,
                          step_.page_tables.data(), step_.perm, scale, o, attn);
    be_->project_add_norm(o, T, L.o, r, L.post_norm, nullptr);
    be_->project_swiglu(r.h, T, L.gate_up, I, act, {}, swiglu);
    const bool last = l + 1 == layers_.size();
    be_->project_add_norm(act, T, L.down, r, last ? final_norm_ : layers_[l + 1].input_norm, nullptr);
  }
  // Row 0 of a block is the committed token: only rows 1 .. bs - 1 propose.
  float* rows = take(n_rows * H);
  WeightView blocks;  // one gather of the proposing rows (prepare_step's blk_ids)
  blocks.rows = T;
  blocks.cols = H;
  blocks.data = r.h;
  be_->embedding(blocks, step_.blk_ids, n_rows, rows);
  be_->linear(rows, n_rows, target_.lm_head(), logits, {});
  return rows;
}

}  // namespace pe
