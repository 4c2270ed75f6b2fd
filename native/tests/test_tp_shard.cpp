// The tensor-parallel shard plan: local shapes, ranges that tile every tensor exactly once across
// the ranks, FP8 blocks never cut, and clear refusals where the heads do not divide.
#include <map>
#include <string>
#include <vector>

#include "check.h"
#include "core/error.h"
#include "model/tp_shard.h"

using namespace pe;

namespace {

ModelConfig shape_27b() {
  ModelConfig c;
  c.vocab = 248320;
  c.hidden = 5120;
  c.n_layers = 4;
  c.intermediate = 17408;
  c.n_heads = 24;
  c.n_kv_heads = 4;
  c.head_dim = 256;
  c.rot_dim = 64;
  c.gdn_k_heads = 16;
  c.gdn_v_heads = 48;
  c.gdn_k_dim = 128;
  c.gdn_v_dim = 128;
  c.conv_kernel = 4;
  c.is_full_attention = {false, false, false, true};
  return c;
}

// name -> (rows, cols) of the matrices (and vectors as rows x 1) of one GDN and one attention layer.
std::map<std::string, std::pair<int64_t, int64_t>> layer_tensors(const ModelConfig& c) {
  const int64_t H = c.hidden, D = c.head_dim, Hv = c.gdn_v_heads, dv = c.gdn_v_dim;
  return {{"layers.0.linear_attn.in_proj_qkv.weight", {c.conv_dim(), H}},
          {"layers.0.linear_attn.conv1d.weight", {c.conv_dim(), c.conv_kernel}},
          {"layers.0.linear_attn.in_proj_z.weight", {Hv * dv, H}},
          {"layers.0.linear_attn.in_proj_a.weight", {Hv, H}},
          {"layers.0.linear_attn.A_log", {Hv, 1}},
          {"layers.0.linear_attn.out_proj.weight", {H, Hv * dv}},
          {"layers.0.mlp.gate_proj.weight", {c.intermediate, H}},
          {"layers.0.mlp.down_proj.weight", {H, c.intermediate}},
          {"layers.3.self_attn.q_proj.weight", {2 * c.n_heads * D, H}},
          {"layers.3.self_attn.k_proj.weight", {c.n_kv_heads * D, H}},
          {"layers.3.self_attn.o_proj.weight", {H, c.n_heads * D}},
          {"lm_head.weight", {c.vocab, H}}};
}

bool throws_with(void (*f)(), const char* needle) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what()).find(needle) != std::string::npos;
  }
  return false;
}

}  // namespace

TEST(local_shapes_of_the_27b_shape) {
  const ModelConfig c = shape_27b();
  const TpShard s = make_tp_shard(c, 1, 2);
  CHECK_EQ(s.local.n_heads, 12);
  CHECK_EQ(s.local.n_kv_heads, 2);
  CHECK_EQ(s.local.gdn_k_heads, 8);
  CHECK_EQ(s.local.gdn_v_heads, 24);
  CHECK_EQ(s.local.intermediate, 8704);
  CHECK_EQ(s.local.vocab, c.vocab);
  CHECK_EQ(s.vocab_begin, 124160);
  CHECK_EQ(s.vocab_rows, 124160);
  CHECK(!s.kv_replicated);
  const ShardRanges qkv = s.ranges("layers.0.linear_attn.in_proj_qkv.weight");
  CHECK_EQ(qkv.ranges.size(), size_t(3));
  CHECK_EQ(qkv.count(), s.local.conv_dim());
  CHECK_EQ(qkv.ranges[0].first, 1024);            // this rank's q heads
  CHECK_EQ(qkv.ranges[1].first, 2048 + 1024);     // its k heads
  CHECK_EQ(qkv.ranges[2].first, 4096 + 24 * 128);  // its v heads
}

TEST(every_element_is_held_by_exactly_one_rank_or_by_all) {
  const ModelConfig c = shape_27b();
  for (int size : {2, 4, 8}) {
    for (const auto& [name, rc] : layer_tensors(c)) {
      std::vector<int> held(rc.first + rc.second, 0);  // per row (dim 0) or column (dim 1)
      int dim = -2;
      for (int r = 0; r < size; ++r) {
        const ShardRanges sr = make_tp_shard(c, r, size).ranges(name);
        if (dim == -2) dim = sr.dim;
        CHECK_EQ(sr.dim, dim);
        for (const auto& [b, e] : sr.ranges)
          for (int64_t i = b; i < e; ++i) ++held[i];
      }
      const bool kv = name.find("k_proj") != std::string::npos;
      const int64_t extent = dim == 0 ? rc.first : rc.second;
      for (int64_t i = 0; i < extent; ++i) {
        // k_proj at TP 8: 4 KV heads, each kept by the 2 ranks whose query heads use it.
        const int want = kv && size == 8 ? 2 : 1;
        if (held[i] != want) {
          CHECK_EQ(held[i], want);
          std::printf("  %s at TP %d, index %lld\n", name.c_str(), size, static_cast<long long>(i));
          break;
        }
      }
      if (dim == 0 || dim == 1) {
        // FP8 128-blocks: matrices' cuts land on block boundaries at these sizes.
        if (name.find("A_log") == std::string::npos && name.find("in_proj_a") == std::string::npos &&
            name.find("conv1d") == std::string::npos && name != "lm_head.weight")  // bf16 in FP8 checkpoints
          for (int r = 0; r < size; ++r) block_ranges(make_tp_shard(c, r, size).ranges(name), extent, 128, name);
      }
    }
  }
  const TpShard s8 = make_tp_shard(c, 5, 8);
  CHECK(s8.kv_replicated);
  CHECK_EQ(s8.local.n_kv_heads, 1);
  CHECK_EQ(s8.ranges("layers.3.self_attn.k_proj.weight").ranges[0].first, 2 * 256);  // query heads 15..17: KV head 2
}

TEST(uneven_shares_where_the_heads_do_not_divide) {
  // The embedded default model's shape: 3 GDN key heads over 2 ranks.
  ModelConfig c = shape_27b();
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.gdn_k_heads = 3;
  c.gdn_v_heads = 6;
  c.intermediate = 1024;
  c.vocab = 8192;
  const TpShard a = make_tp_shard(c, 0, 2), b = make_tp_shard(c, 1, 2);
  CHECK_EQ(a.local.gdn_k_heads, 1);
  CHECK_EQ(a.local.gdn_v_heads, 2);
  CHECK_EQ(b.local.gdn_k_heads, 2);
  CHECK_EQ(b.local.gdn_v_heads, 4);
  CHECK_EQ(a.local.n_heads + b.local.n_heads, 6);
  CHECK_EQ(a.local.n_kv_heads, 1);
  const ShardRanges z = b.ranges("layers.0.linear_attn.in_proj_z.weight");
  CHECK_EQ(z.ranges[0].first, 2 * 128);
  CHECK_EQ(z.ranges[0].second, 6 * 128);
  const ShardRanges qkv = b.ranges("layers.0.linear_attn.in_proj_qkv.weight");
  CHECK_EQ(qkv.count(), b.local.conv_dim());
  // TP 4: 3 GDN key heads leave a rank none.
  bool refused = false;
  try {
    make_tp_shard(c, 0, 4);
  } catch (const Error& e) {
    refused = std::string(e.what()).find("more than the model's GDN key heads") != std::string::npos;
  }
  CHECK(refused);
}

TEST(take_shard_cuts_rows_and_columns_and_the_pieces_rebuild_the_tensor) {
  const std::vector<int64_t> shape = {6, 5};
  std::vector<float> full(30);
  for (int i = 0; i < 30; ++i) full[i] = static_cast<float>(i);
  ShardRanges rows;
  rows.dim = 0;
  rows.ranges = {{1, 2}, {4, 6}};
  std::vector<int64_t> got_shape;
  auto bytes = take_shard(rows, shape, 4, full.data(), &got_shape);
  CHECK_EQ(got_shape[0], 3);
  CHECK_EQ(got_shape[1], 5);
  const float* f = reinterpret_cast<const float*>(bytes.data());
  CHECK_EQ(f[0], 5.0f);   // row 1
  CHECK_EQ(f[5], 20.0f);  // row 4
  CHECK_EQ(f[14], 29.0f);
  ShardRanges cols;
  cols.dim = 1;
  cols.ranges = {{2, 4}};
  bytes = take_shard(cols, shape, 4, full.data(), &got_shape);
  CHECK_EQ(got_shape[0], 6);
  CHECK_EQ(got_shape[1], 2);
  f = reinterpret_cast<const float*>(bytes.data());
  CHECK_EQ(f[0], 2.0f);
  CHECK_EQ(f[1], 3.0f);
  CHECK_EQ(f[2], 7.0f);
  CHECK_EQ(f[11], 28.0f);
  ShardRanges whole;
  bytes = take_shard(whole, shape, 4, full.data(), &got_shape);
  CHECK_EQ(bytes.size(), size_t(120));
}

TEST(counts_that_do_not_divide_are_refused_with_the_reason) {
  CHECK(throws_with([] { make_tp_shard(shape_27b(), 1, 5); }, "query heads 4..8, which neither are whole KV groups of 6"));
  CHECK(throws_with([] { make_tp_shard(shape_27b(), 0, 32); }, "is more than the model's attention heads"));
  CHECK(throws_with([] {
    ModelConfig c = shape_27b();
    c.n_heads = 12;
    c.n_kv_heads = 3;
    make_tp_shard(c, 0, 2);  // rank 0's 6 query heads span KV groups 0 and 1 (of 4 heads each)
  }, "neither are whole KV groups of 4"));
  // FP8: the MLP at TP 16 would cut 128-row blocks (17408 / 16 = 1088 rows).
  CHECK(throws_with([] {
    ModelConfig c = shape_27b();
    c.n_heads = 32;
    c.n_kv_heads = 16;
    c.gdn_k_heads = 16;
    c.gdn_v_heads = 48;
    const TpShard s = make_tp_shard(c, 1, 16);
    block_ranges(s.ranges("layers.0.mlp.gate_proj.weight"), c.intermediate, 128, "layers.0.mlp.gate_proj.weight");
  }, "layers.0.mlp.gate_proj.weight: tensor parallel would cut its FP8 128x128 scale blocks"));
  CHECK(throws_with([] { make_tp_shard(shape_27b(), 2, 2); }, "rank 2 outside a TP group of 2"));
}
