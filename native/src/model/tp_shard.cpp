#include "model/tp_shard.h"

#include <cstring>

#include "core/error.h"

namespace pe {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The rank's share [rank * n / size, (rank + 1) * n / size) of n items of `width` each.
std::pair<int64_t, int64_t> share(int64_t n, int rank, int size, int64_t width) {
  return {rank * (n / size) * width, (rank + 1) * (n / size) * width};
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
  auto divides = [&](int64_t n, const char* what) {
    if (n % size != 0)
      fail(PE_ERR_INVALID_ARGUMENT, "tensor_parallel_size ", size, " does not divide the model's ", what, " (", n,
           "): choose a TP size that divides it");
  };
  divides(full.n_heads, "attention heads (num_attention_heads)");
  divides(full.gdn_k_heads, "GDN key heads (linear_num_key_heads)");
  divides(full.gdn_v_heads, "GDN value heads (linear_num_value_heads)");
  divides(full.intermediate, "MLP width (intermediate_size)");
  TpShard s;
  s.rank = rank;
  s.size = size;
  s.full = full;
  s.local = full;
  s.local.n_heads = full.n_heads / size;
  s.local.gdn_k_heads = full.gdn_k_heads / size;
  s.local.gdn_v_heads = full.gdn_v_heads / size;
  s.local.intermediate = full.intermediate / size;
  if (full.n_kv_heads % size == 0) {
    s.local.n_kv_heads = full.n_kv_heads / size;
  } else {
    // Fewer KV heads than ranks (or not a multiple): each rank keeps the one KV head of its query
    // heads, which works only where no rank's query heads span two KV groups.
    const int64_t group = full.n_heads / full.n_kv_heads;
    if (size % full.n_kv_heads != 0 || group % s.local.n_heads != 0)
      fail(PE_ERR_INVALID_ARGUMENT, "tensor_parallel_size ", size, " neither divides the KV heads (", full.n_kv_heads,
           ") nor keeps each rank's ", s.local.n_heads, " query heads within one KV group of ", group,
           ": choose a TP size that divides num_key_value_heads or is a multiple of it");
    s.local.n_kv_heads = 1;
    s.kv_replicated = true;
  }
  s.vocab_padded = (full.vocab + size - 1) / size;
  s.vocab_begin = std::min<int64_t>(full.vocab, rank * s.vocab_padded);
  s.vocab_rows = std::min<int64_t>(full.vocab, s.vocab_begin + s.vocab_padded) - s.vocab_begin;
  return s;
}

ShardRanges TpShard::ranges(const std::string& name) const {
  ShardRanges r;
  if (size == 1) return r;
  const ModelConfig& c = local;
  const int64_t D = c.head_dim;
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
  const int64_t full_heads = full.n_heads;
  if (ends_with(name, "self_attn.q_proj.weight")) return rows({share(full_heads, rank, size, 2 * D)});
  if (ends_with(name, "self_attn.k_proj.weight") || ends_with(name, "self_attn.v_proj.weight")) {
    // Replicated: the KV head of the rank's query heads (make_tp_shard checked they share one).
    const int64_t kv0 = kv_replicated ? rank * c.n_heads / (full.n_heads / full.n_kv_heads) : rank * c.n_kv_heads;
    return rows({{kv0 * D, (kv0 + c.n_kv_heads) * D}});
  }
  if (ends_with(name, "self_attn.o_proj.weight")) return cols(share(full_heads, rank, size, D));
  const int64_t Hk = c.gdn_k_heads, Hv = c.gdn_v_heads, dk = c.gdn_k_dim, dv = c.gdn_v_dim;
  const int64_t Hk_full = Hk * size, Hv_full = Hv * size;
  if (ends_with(name, "linear_attn.in_proj_qkv.weight") || ends_with(name, "linear_attn.conv1d.weight")) {
    const int64_t k0 = Hk_full * dk, v0 = 2 * Hk_full * dk;
    return rows({{rank * Hk * dk, (rank + 1) * Hk * dk},
                 {k0 + rank * Hk * dk, k0 + (rank + 1) * Hk * dk},
                 {v0 + rank * Hv * dv, v0 + (rank + 1) * Hv * dv}});
  }
  if (ends_with(name, "linear_attn.in_proj_z.weight")) return rows({share(Hv_full, rank, size, dv)});
  if (ends_with(name, "linear_attn.in_proj_a.weight") || ends_with(name, "linear_attn.in_proj_b.weight") ||
      ends_with(name, "linear_attn.A_log") || ends_with(name, "linear_attn.dt_bias"))
    return rows({share(Hv_full, rank, size, 1)});
  if (ends_with(name, "linear_attn.out_proj.weight")) return cols(share(Hv_full, rank, size, dv));
  if (ends_with(name, "mlp.gate_proj.weight") || ends_with(name, "mlp.up_proj.weight"))
    return rows({share(c.intermediate * size, rank, size, 1)});
  if (ends_with(name, "mlp.down_proj.weight")) return cols(share(c.intermediate * size, rank, size, 1));
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
