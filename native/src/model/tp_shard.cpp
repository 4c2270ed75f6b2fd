#include "model/tp_shard.h"

#include <cstring>

#include "core/error.h"

namespace pe {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The rank's items [rank * n / size, (rank + 1) * n / size) of n (uneven when size does not
// divide n: the shares differ by at most one).
std::pair<int64_t, int64_t> split(int64_t n, int rank, int size) {
  return {rank * n / size, (rank + 1) * n / size};
}

}  // namespace

int64_t ShardRanges::count() const {
  int64_t n = 0;
  for (const auto& [b, e] : ranges) n += e - b;
  return n;
}

TpShard make_tp_shard(const ModelConfig& full, int rank, int size) {
  if (size < 1) fail(PE_ERR_INVALID_ARGUMENT, "tensor_parallel_size must be >= 1, got ", size);
  if (rank < 0 || rank >= size) fail(PE_ERR_INVALID_ARGUMENT, "rank ", rank, " outside a TP group of ", size);
  auto share = [&](int64_t n, const char* what) {
    const auto r = split(n, rank, size);
    if (r.second == r.first)
      fail(PE_ERR_INVALID_ARGUMENT, "tensor_parallel_size ", size, " is more than the model's ", what, " (", n,
           "): every rank needs at least one");
    return r;
  };
  TpShard s;
  s.rank = rank;
  s.size = size;
  s.full = full;
  s.local = full;
  s.q_heads = share(full.n_heads, "attention heads (num_attention_heads)");
  s.gdn_k_heads = share(full.gdn_k_heads, "GDN key heads (linear_num_key_heads)");
  s.mlp = share(full.intermediate, "MLP width (intermediate_size)");
  // KV heads: those the rank's query heads use. Its query heads must be whole KV groups, or lie in
  // one group (that KV head is then held by every rank of the group), so every local KV head
  // serves the same number of local query heads.
  const int64_t group = full.n_heads / full.n_kv_heads;
  const auto [qb, qe] = s.q_heads;
  const bool whole_groups = qb % group == 0 && qe % group == 0;
  const bool one_group = qb / group == (qe - 1) / group;
  if (!whole_groups && !one_group)
    fail(PE_ERR_INVALID_ARGUMENT, "tensor_parallel_size ", size, " gives rank ", rank, " query heads ", qb, "..",
         qe - 1, ", which neither are whole KV groups of ", group, " nor lie in one (num_attention_heads ",
         full.n_heads, ", num_key_value_heads ", full.n_kv_heads, "): choose a TP size that divides the KV heads");
  s.kv_heads = whole_groups ? std::make_pair(qb / group, qe / group) : std::make_pair(qb / group, qb / group + 1);
  s.kv_replicated = !whole_groups;
  s.local.n_heads = qe - qb;
  s.local.n_kv_heads = s.kv_heads.second - s.kv_heads.first;
  s.local.gdn_k_heads = s.gdn_k_heads.second - s.gdn_k_heads.first;
  s.local.gdn_v_heads = s.local.gdn_k_heads * (full.gdn_v_heads / full.gdn_k_heads);
  s.local.intermediate = s.mlp.second - s.mlp.first;
  s.vocab_padded = (full.vocab + size - 1) / size;
  s.vocab_begin = std::min<int64_t>(full.vocab, rank * s.vocab_padded);
  s.vocab_rows = std::min<int64_t>(full.vocab, s.vocab_begin + s.vocab_padded) - s.vocab_begin;
  if (s.vocab_rows < 1)
    fail(PE_ERR_INVALID_ARGUMENT, "tensor_parallel_size ", size, " leaves rank ", rank, " no vocabulary rows of ",
         full.vocab);
  s.local.vocab_begin = s.vocab_begin;
  s.local.vocab_rows = s.vocab_rows;
  s.local.vocab_padded = s.vocab_padded;
  return s;
}

ShardRanges TpShard::ranges(const std::string& name) const {
  ShardRanges r;
  if (size == 1) return r;
  const int64_t D = full.head_dim, dk = full.gdn_k_dim, dv = full.gdn_v_dim;
  const int64_t ratio = full.gdn_v_heads / full.gdn_k_heads;
  auto rows = [&](std::vector<std::pair<int64_t, int64_t>> rr) {
    r.dim = 0;
    r.ranges = std::move(rr);
    return r;
  };
  auto cols = [&](std::pair<int64_t, int64_t> cr) {
    r.dim = 1;
    r.ranges = {cr};
    return r;
  };
  auto times = [](std::pair<int64_t, int64_t> p, int64_t w) { return std::make_pair(p.first * w, p.second * w); };
  const auto vh = times(gdn_k_heads, ratio);  // value heads follow their key heads
  if (ends_with(name, "self_attn.q_proj.weight")) return rows({times(q_heads, 2 * D)});
  if (ends_with(name, "self_attn.k_proj.weight") || ends_with(name, "self_attn.v_proj.weight"))
    return rows({times(kv_heads, D)});
  if (ends_with(name, "self_attn.o_proj.weight")) return cols(times(q_heads, D));
  if (ends_with(name, "linear_attn.in_proj_qkv.weight") || ends_with(name, "linear_attn.conv1d.weight")) {
    const int64_t k0 = full.gdn_k_heads * dk, v0 = 2 * full.gdn_k_heads * dk;
    const auto q = times(gdn_k_heads, dk), v = times(vh, dv);
    return rows({q, {k0 + q.first, k0 + q.second}, {v0 + v.first, v0 + v.second}});
  }
  if (ends_with(name, "linear_attn.in_proj_z.weight")) return rows({times(vh, dv)});
  if (ends_with(name, "linear_attn.in_proj_a.weight") || ends_with(name, "linear_attn.in_proj_b.weight") ||
      ends_with(name, "linear_attn.A_log") || ends_with(name, "linear_attn.dt_bias"))
    return rows({vh});
  if (ends_with(name, "linear_attn.out_proj.weight")) return cols(times(vh, dv));
  if (ends_with(name, "mlp.gate_proj.weight") || ends_with(name, "mlp.up_proj.weight")) return rows({mlp});
  if (ends_with(name, "mlp.down_proj.weight")) return cols(mlp);
  if (name == "lm_head.weight") return rows({{vocab_begin, vocab_begin + vocab_rows}});
  return r;  // embedding, norms, q/k norms, the gated norm, mtp.fc and its norms: whole
}

std::vector<uint8_t> take_shard(const ShardRanges& r, const std::vector<int64_t>& shape, size_t elem_bytes,
                                const void* data, std::vector<int64_t>* shard_shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const uint8_t* src = static_cast<const uint8_t*>(data);
  *shard_shape = shape;
  if (r.dim < 0) return std::vector<uint8_t>(src, src + numel * elem_bytes);
  if (r.dim >= static_cast<int>(shape.size())) fail(PE_ERR_INTERNAL, "shard dim ", r.dim, " of a ", shape.size(), "-d tensor");
  // outer x extent x inner: the ranges cut `extent`.
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < r.dim; ++d) outer *= shape[d];
  for (size_t d = r.dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t extent = shape[r.dim];
  for (const auto& [b, e] : r.ranges)
    if (b < 0 || e > extent || b > e) fail(PE_ERR_INTERNAL, "shard range [", b, ", ", e, ") of an extent ", extent);
  (*shard_shape)[r.dim] = r.count();
  std::vector<uint8_t> out(static_cast<size_t>(outer * r.count() * inner) * elem_bytes);
  uint8_t* dst = out.data();
  const size_t row = static_cast<size_t>(inner) * elem_bytes;
  for (int64_t o = 0; o < outer; ++o)
    for (const auto& [b, e] : r.ranges) {
      const size_t n = static_cast<size_t>(e - b) * row;
      std::memcpy(dst, src + (static_cast<size_t>(o * extent + b)) * row, n);
      dst += n;
    }
  return out;
}

ShardRanges block_ranges(const ShardRanges& r, int64_t full_extent, int64_t block, const std::string& name) {
  ShardRanges out;
  out.dim = r.dim;
  for (const auto& [b, e] : r.ranges) {
    if (b % block != 0 || (e % block != 0 && e != full_extent))
      fail(PE_ERR_INVALID_ARGUMENT, name, ": tensor parallel would cut its FP8 ", block, "x", block,
           " scale blocks (", r.dim == 0 ? "rows " : "columns ", b, "..", e,
           "); choose a TP size whose shards are whole blocks");
    out.ranges.push_back({b / block, (e + block - 1) / block});
  }
  return out;
}

}  // namespace pe
