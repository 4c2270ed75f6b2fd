// The MTP head of Qwen3.5 (vLLM qwen3_5_mtp semantics; MODEL_SPEC §3):
//   e = norm(embed(x_{p+1}); pre_fc_norm_embedding), c = norm(h_p; pre_fc_norm_hidden),
//   u = [e | c] W_fc^T, u -> one gated-attention decoder layer (own KV cache, position p),
//   logits = lm_head(norm(u; mtp.norm)). All norms are the offset form (1 + w).
#include <cstring>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/qwen35.h"
#include "model/qwen35_parts.h"

namespace pe {

void Qwen35Model::mtp_forward(const int32_t* tokens, int64_t n, const float* hidden, KvPool& mtp_kv,
                              std::vector<float>& logits) {
  if (!mtp_layer_) fail(PE_ERR_UNSUPPORTED, "this checkpoint has no MTP head (mtp.* tensors)");
  if (n < 2) fail(PE_ERR_INVALID_ARGUMENT, "the MTP head needs at least 2 tokens, got ", n);
  std::lock_guard<std::mutex> lock(forward_mu_);
  Workspace& ws = *ws_;
  const int64_t T = n - 1, H = cfg_.hidden;
  Batch b;  // one sequence of T rows at positions 0 .. T-1 (the positions of h_p)
  b.tokens.assign(tokens + 1, tokens + n);
  for (int32_t t : b.tokens)
    if (t < 0 || t >= cfg_.vocab) fail(PE_ERR_INVALID_ARGUMENT, "token id ", t, " outside the vocabulary");
  std::vector<int32_t> table;
  for (int64_t i = 0; i * mtp_kv.page_size() < T; ++i) table.push_back(mtp_kv.alloc());
  if (table.back() < 0) fail(PE_ERR_OUT_OF_MEMORY, "MTP KV pool too small for ", T, " tokens");
  SeqChunk s;
  s.n_new = T;
  s.page_table = table.data();
  b.seqs.push_back(s);
  set_positions(b, ws);

  float* cat = Workspace::get(ws.t5, T * 2 * H);
  float* e = Workspace::get(ws.x, T * H);
  cpu::embedding(weights_.matrix("embed_tokens.weight"), b.tokens.data(), T, e);
  cpu::rms_norm(e, weights_.vec("mtp.pre_fc_norm_embedding.weight"), T, H, cfg_.eps, true, e);
  for (int64_t t = 0; t < T; ++t) std::memcpy(cat + t * 2 * H, e + t * H, sizeof(float) * H);
  cpu::rms_norm(hidden, weights_.vec("mtp.pre_fc_norm_hidden.weight"), T, H, cfg_.eps, true, e);
  for (int64_t t = 0; t < T; ++t) std::memcpy(cat + t * 2 * H + H, e + t * H, sizeof(float) * H);
  float* x = Workspace::get(ws.x, T * H);  // e is no longer needed
  cpu::linear(cat, T, weights_.matrix("mtp.fc.weight"), x);
  decoder_layer(*mtp_layer_, 0, b, mtp_kv, nullptr, x, ws);
  cpu::rms_norm(x, weights_.vec("mtp.norm.weight"), T, H, cfg_.eps, true, x);
  logits.resize(T * cfg_.vocab);
  lm_head(x, T, logits.data());
  for (int32_t page : table) mtp_kv.unref(page);
}

}  // namespace pe
