#include "model/config.h"

#include <cmath>

#include "core/error.h"

namespace pe {

int64_t ModelConfig::n_full_layers() const {
  int64_t n = 0;
  for (bool f : is_full_attention) n += f;
  return n;
}

static void require_positive(const char* field, int64_t v) {
  if (v <= 0) fail(PE_ERR_INVALID_ARGUMENT, "config: ", field, " must be > 0, got ", v);
}

ModelConfig ModelConfig::from_c(const pe_model_config& c) {
  ModelConfig m;
  m.vocab = c.vocab_size;
  m.hidden = c.hidden_size;
  m.n_layers = c.num_hidden_layers;
  m.intermediate = c.intermediate_size;
  m.n_heads = c.num_attention_heads;
  m.n_kv_heads = c.num_key_value_heads;
  m.head_dim = c.head_dim;
  m.gdn_k_heads = c.linear_num_key_heads;
  m.gdn_v_heads = c.linear_num_value_heads;
  m.gdn_k_dim = c.linear_key_head_dim;
  m.gdn_v_dim = c.linear_value_head_dim;
  m.conv_kernel = c.linear_conv_kernel_dim;
  m.eps = c.rms_norm_eps;
  m.rope_theta = c.rope_theta;
  m.tied_embeddings = c.tie_word_embeddings != 0;
  m.mtp_layers = c.mtp_num_hidden_layers;
  m.max_positions = c.max_position_embeddings;

  require_positive("vocab_size", m.vocab);
  require_positive("hidden_size", m.hidden);
  require_positive("num_hidden_layers", m.n_layers);
  require_positive("intermediate_size", m.intermediate);
  if (m.n_layers > 4096) fail(PE_ERR_INVALID_ARGUMENT, "config: num_hidden_layers too large: ", m.n_layers);
  if (!c.layer_types) fail(PE_ERR_INVALID_ARGUMENT, "config: layer_types is missing");
  for (int64_t i = 0; i < m.n_layers; ++i) {
    int32_t t = c.layer_types[i];
    if (t != PE_LAYER_LINEAR_ATTENTION && t != PE_LAYER_FULL_ATTENTION)
      fail(PE_ERR_INVALID_ARGUMENT, "config: layer_types[", i, "] has unknown kind ", t);
    m.is_full_attention.push_back(t == PE_LAYER_FULL_ATTENTION);
  }
  if (m.n_full_layers() > 0 || m.mtp_layers > 0) {
    require_positive("num_attention_heads", m.n_heads);
    require_positive("num_key_value_heads", m.n_kv_heads);
    require_positive("head_dim", m.head_dim);
    if (m.n_heads % m.n_kv_heads)
      fail(PE_ERR_INVALID_ARGUMENT, "config: num_attention_heads (", m.n_heads,
           ") must be a multiple of num_key_value_heads (", m.n_kv_heads, ")");
    float f = c.partial_rotary_factor;
    if (!(f > 0.0f && f <= 1.0f))
      fail(PE_ERR_INVALID_ARGUMENT, "config: partial_rotary_factor must be in (0, 1], got ", f);
    m.rot_dim = static_cast<int64_t>(std::lround(m.head_dim * f));
    if (m.rot_dim % 2 || m.rot_dim <= 0)
      fail(PE_ERR_INVALID_ARGUMENT, "config: head_dim * partial_rotary_factor must be even and > 0, got ",
           m.rot_dim);
    if (!(m.rope_theta > 0.0f)) fail(PE_ERR_INVALID_ARGUMENT, "config: rope_theta must be > 0");
  }
  if (m.n_gdn_layers() > 0) {
    require_positive("linear_num_key_heads", m.gdn_k_heads);
    require_positive("linear_num_value_heads", m.gdn_v_heads);
    require_positive("linear_key_head_dim", m.gdn_k_dim);
    require_positive("linear_value_head_dim", m.gdn_v_dim);
    require_positive("linear_conv_kernel_dim", m.conv_kernel);
    if (m.gdn_v_heads % m.gdn_k_heads)
      fail(PE_ERR_INVALID_ARGUMENT, "config: linear_num_value_heads (", m.gdn_v_heads,
           ") must be a multiple of linear_num_key_heads (", m.gdn_k_heads, ")");
  }
  if (!(m.eps > 0.0f)) fail(PE_ERR_INVALID_ARGUMENT, "config: rms_norm_eps must be > 0");
  if (m.mtp_layers < 0) fail(PE_ERR_INVALID_ARGUMENT, "config: mtp_num_hidden_layers must be >= 0");
  return m;
}

}  // namespace pe
