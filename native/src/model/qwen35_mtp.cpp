// The Qwen3.5 MTP head (MODEL_SPEC §3) through the forward's decoder layer: over one fresh
// sequence (mtp_forward, LLM.mtp_logits) and over a batch of chunks whose KV lives in the engine's
// pages (mtp_step, the speculative-decoding drafter); and the hidden rows a forward keeps for a
// drafter (Batch::keep_hidden).
#include <algorithm>

#include "core/error.h"
#include "model/qwen35.h"

namespace pe {

void Qwen35Model::ensure_kept(int64_t n_layers, int64_t rows) {
  const size_t bytes = static_cast<size_t>(n_layers * rows * cfg_.hidden) * sizeof(float);
  if (kept_.size() < bytes) kept_ = Buffer(device(), bytes);
}

void Qwen35Model::reserve_kept(int64_t n_layers, int64_t max_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  ensure_kept(n_layers, max_tokens);
}

// Inside a keeping forward's launches: rows [T, H] of `layer` (the residual stream x after that
// decoder layer, complete there on every backend: a split norm defers only the norm of h; or the
// final-normed h for -1) to its place in keep_into_ when the batch keeps that layer.
void Qwen35Model::keep_rows(const std::vector<int32_t>& layers, int32_t layer, const float* rows) {
  auto it = std::find(layers.begin(), layers.end(), layer);
  if (it == layers.end()) return;
  const int64_t T = step_.T, H = cfg_.hidden;
  mem_copy(device(), keep_into_ + (it - layers.begin()) * T * H, rows, sizeof(float) * T * H);
}

const float* Qwen35Model::kept_hidden(int32_t layer, int64_t* n_rows) const {
  auto it = std::find(kept_layers_.begin(), kept_layers_.end(), layer);
  if (it == kept_layers_.end()) return nullptr;
  if (n_rows) *n_rows = kept_rows_;
  return kept_.as<float>() + (it - kept_layers_.begin()) * kept_rows_ * cfg_.hidden;
}

// The head over the step's T rows (prepare_step done), with h_p in r.x: e = norm(embed(x_{p+1});
// pre_fc_norm_embedding), c = norm(h_p; pre_fc_norm_hidden), u = [e | c] W_fc^T, u through one
// gated-attention decoder layer (attention layer kv_layer of kv, position p), then norm(u;
// mtp.norm) in r.h and the logit rows of b's chunks through the lm_head. All norms are the
// offset form (1 + w).
void Qwen35Model::mtp_head(int64_t T, float* out_logits, int64_t n_rows, const Batch& b, KvPool& kv,
                           int64_t kv_layer) {
  const int64_t H = cfg_.hidden;
  const Residual r = residual();
  float* cat = scratch();
  be_->rms_norm(r.x, mtp_->norm_hidden, T, H, cfg_.eps, true, r.h);
  be_->copy_rows(cat + H, 2 * H, r.h, H, H, T);
  be_->embedding(embed_.view, step_.tokens, T, r.mix);
  be_->rms_norm(r.mix, mtp_->norm_embedding, T, H, cfg_.eps, true, r.h);
  be_->copy_rows(cat, 2 * H, r.h, H, H, T);
  be_->project(cat, T, mtp_->fc, r.x, {});
  be_->rms_norm(r.x, mtp_->layer.input_norm, T, H, cfg_.eps, true, r.h);
  decoder_layer(mtp_->layer, kv_layer, b, kv, nullptr, {}, mtp_->norm, nullptr);
  if (n_rows > 0) project_logits(logit_rows(b, r.h, r.mix), n_rows, out_logits);
}

void Qwen35Model::mtp_forward(const int32_t* tokens, int64_t n, const float* hidden, KvPool& mtp_kv,
                              std::vector<float>& logits) {
  if (!mtp_) fail(PE_ERR_UNSUPPORTED, "this checkpoint has no MTP head (mtp.* tensors)");
  if (n < 2) fail(PE_ERR_INVALID_ARGUMENT, "the MTP head needs at least 2 tokens, got ", n);
  std::lock_guard<std::mutex> lock(mu_);
  check_pools(mtp_kv, nullptr);
  const int64_t T = n - 1, H = cfg_.hidden;
  Batch b;  // one sequence of T rows at positions 0 .. T-1 (the positions of h_p)
  b.tokens.assign(tokens + 1, tokens + n);
  std::vector<int32_t> table;
  for (int64_t i = 0; i * mtp_kv.page_size() < T; ++i) table.push_back(mtp_kv.alloc());
  if (table.back() < 0) fail(PE_ERR_OUT_OF_MEMORY, "MTP KV pool too small for ", T, " tokens");
  SeqChunk s;
  s.n_new = T;
  s.page_table = table.data();
  s.logits = LogitsMode::All;
  b.seqs.push_back(s);
  prepare_step(b, mtp_kv.page_size(), 1);
  mem_upload(device(), residual().x, hidden, sizeof(float) * T * H);
  ForwardResult res;
  float* out = be_->logits_buffer(T, cfg_.vocab, true, res);
  be_->run_step(-1, [&] { mtp_head(T, out, T, b, mtp_kv, 0); });
  be_->finish_step(out, T, cfg_.vocab, residual().h, 0, H, true, res);
  logits = std::move(res.logits);
  for (int32_t page : table) mtp_kv.unref(page);
}

void Qwen35Model::mtp_step(const Batch& b, const std::vector<int32_t>& hidden_rows, KvPool& kv, int64_t kv_layer,
                           ForwardResult& res) {
  if (!mtp_) fail(PE_ERR_UNSUPPORTED, "this checkpoint has no MTP head (mtp.* tensors)");
  std::lock_guard<std::mutex> lock(mu_);
  check_pools(kv, nullptr);
  const int64_t T = static_cast<int64_t>(b.tokens.size()), H = cfg_.hidden;
  if (kv_layer < 0 || kv_layer >= kv.n_layers())
    fail(PE_ERR_INTERNAL, "mtp_step: KV layer ", kv_layer, " of a pool with ", kv.n_layers());
  if (static_cast<int64_t>(hidden_rows.size()) != T)
    fail(PE_ERR_INTERNAL, "mtp_step: ", T, " tokens but ", hidden_rows.size(), " hidden rows");
  const float* kept = kept_layers_.empty() || kept_layers_[0] != -1 ? nullptr : kept_.as<float>();
  for (int32_t row : hidden_rows)
    if (!kept || row < 0 || row >= kept_rows_)
      fail(PE_ERR_INTERNAL, "mtp_step: hidden row ", row, " of ", kept ? kept_rows_ : 0, " kept final-normed rows");
  int64_t n_rows = 0;
  res.logit_row_begin.clear();
  for (const SeqChunk& s : b.seqs) {
    res.logit_row_begin.push_back(n_rows);
    n_rows += s.n_new - s.first_logit_row();
  }
  prepare_step(b, kv.page_size(), 1);
  if (kept_.size() < static_cast<size_t>(T * H) * sizeof(float))
    fail(PE_ERR_INTERNAL, "mtp_step: ", T, " rows do not fit the kept rows' buffer");
  const Residual r = residual();
  // The hidden inputs into x, one copy per run of consecutive rows (kept_ is not written until the
  // head's outputs replace it at the end).
  for (int64_t i = 0; i < T;) {
    int64_t j = i + 1;
    while (j < T && hidden_rows[j] == hidden_rows[j - 1] + 1) ++j;
    mem_copy(device(), r.x + i * H, kept_.as<float>() + static_cast<int64_t>(hidden_rows[i]) * H,
             sizeof(float) * (j - i) * H);
    i = j;
  }
  float* out = be_->logits_buffer(n_rows, cfg_.vocab, b.host_outputs, res);
  be_->run_step(-1, [&] { mtp_head(T, out, n_rows, b, kv, kv_layer); });
  mem_copy(device(), kept_.as<float>(), r.h, sizeof(float) * T * H);
  kept_layers_.assign(1, -1);
  kept_rows_ = T;
  be_->finish_step(out, n_rows, cfg_.vocab, r.h, 0, H, b.host_outputs, res);
}

}  // namespace pe
