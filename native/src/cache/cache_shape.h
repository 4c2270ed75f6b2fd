// The sizes of the state the caches hold: KV rows of the full-attention layers, conv rings and
// recurrent states of the Gated DeltaNet layers.
//
// Design decision (dependencies point down): the caches know no model type. A model config
// converts to a CacheShape where a pool or the planner wants one (ModelConfig does, by its
// n_full_layers(), n_gdn_layers(), conv_dim() and head fields), so cache/ includes nothing of
// model/ and model/ may include cache/.
#pragma once
#include <cstdint>

namespace pe {

struct CacheShape {
  int64_t n_attn_layers = 0;  // full-attention layers: a K and a V row per token and KV head
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t n_gdn_layers = 0;   // Gated DeltaNet layers: a conv ring and a recurrent state each
  int64_t conv_kernel = 0;    // conv ring rows (ops.h conv1d_causal)
  int64_t conv_dim = 0;       // conv channels
  int64_t gdn_v_heads = 0;    // recurrent state [gdn_v_heads, gdn_k_dim, gdn_v_dim]
  int64_t gdn_k_dim = 0;
  int64_t gdn_v_dim = 0;

  CacheShape() = default;
  template <class Config>
  CacheShape(const Config& c)  // NOLINT: implicit, so a model config is passed where a shape is
      : n_attn_layers(c.n_full_layers()), n_kv_heads(c.n_kv_heads), head_dim(c.head_dim),
        n_gdn_layers(c.n_gdn_layers()), conv_kernel(c.conv_kernel), conv_dim(c.conv_dim()),
        gdn_v_heads(c.gdn_v_heads), gdn_k_dim(c.gdn_k_dim), gdn_v_dim(c.gdn_v_dim) {}
};

}  // namespace pe
