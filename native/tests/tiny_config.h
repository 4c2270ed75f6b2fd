// A tiny hybrid config for the C-level tests on the CPU: one GDN layer, then one attention layer.
#pragma once
#include "model/config.h"

namespace pe_test {

inline pe::ModelConfig tiny_config() {
  pe::ModelConfig c;
  c.vocab = 100;
  c.hidden = 8;
  c.n_layers = 2;
  c.intermediate = 8;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  c.rot_dim = 2;
  c.gdn_k_heads = 1;
  c.gdn_v_heads = 1;
  c.gdn_k_dim = 4;
  c.gdn_v_dim = 4;
  c.conv_kernel = 4;
  c.is_full_attention = {false, true};
  return c;
}

}  // namespace pe_test
