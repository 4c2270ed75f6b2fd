// The text-model configuration of a Qwen3.5 hybrid checkpoint (C++ side of pe_model_config).
#pragma once
#include <cstdint>
#include <vector>

#include "pyengine.h"

namespace pe {

struct ModelConfig {
  int64_t vocab = 0, hidden = 0, n_layers = 0, intermediate = 0;
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, rot_dim = 0;
  int64_t gdn_k_heads = 0, gdn_v_heads = 0, gdn_k_dim = 0, gdn_v_dim = 0, conv_kernel = 0;
  float eps = 1e-6f, rope_theta = 1e7f;
  bool tied_embeddings = false;
  int64_t mtp_layers = 0;
  int64_t max_positions = 0;
  std::vector<bool> is_full_attention;  // per layer
  // Tensor parallel (model/tp_shard.h): the lm_head rows this rank holds, [vocab_begin,
  // vocab_begin + vocab_rows), each rank's logits padded to vocab_padded rows for the gather.
  // vocab_rows 0: the whole vocabulary (TP = 1).
  int64_t vocab_begin = 0, vocab_rows = 0, vocab_padded = 0;
  int64_t lm_head_rows() const { return vocab_rows > 0 ? vocab_rows : vocab; }
  // The shape of the MTP layer's own KV cache: this model's attention, one layer.
  ModelConfig mtp_kv_config() const {
    ModelConfig c = *this;
    c.n_layers = 1;
    c.is_full_attention = {true};
    return c;
  }

  // Derived sizes.
  int64_t conv_dim() const { return 2 * gdn_k_heads * gdn_k_dim + gdn_v_heads * gdn_v_dim; }
  int64_t n_full_layers() const;
  int64_t n_gdn_layers() const { return n_layers - n_full_layers(); }

  // Validates and converts; throws pe::Error naming the bad field.
  static ModelConfig from_c(const pe_model_config& c);
};

}  // namespace pe
