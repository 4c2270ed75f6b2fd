// Tensor-parallel sharding of a Qwen3.5 checkpoint: which part of each tensor a rank holds.
//
// Column-parallel in, row-parallel out (Megatron), one all-reduce after each mixer's out
// projection and one after the MLP's down projection:
// - attention: q_proj (per head D query rows then D gate rows) by query head; k_proj / v_proj: the KV
//   heads of the rank's query heads (whole KV groups, or the one KV head of a group its query heads
//   lie in, then held by every rank of that group); o_proj by columns.
// - GDN by key-head group: in_proj_qkv's q, k and v rows and the conv channels of the rank's key
//   heads and their value heads, in_proj_z / in_proj_a / in_proj_b rows, A_log and dt_bias by value
//   head; the gated norm (per head, weight [dv]) is local; out_proj by columns.
// - MLP: gate / up by rows, down by columns.
// - lm_head by vocabulary rows (vocab-parallel; the logits are gathered), the embedding, the norms,
//   q_norm / k_norm, and the MTP head's fc and its pre-fc norms whole on every rank (its decoder
//   layer is sharded like the others).
// FP8 checkpoints' 128 x 128 blocks are never split: a cut that is not a multiple of 128 in a
// block-scaled dimension is refused at load, naming the tensor.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace pe {

// The parts of one dimension of a tensor a rank holds: [begin, end) ranges, in order.
struct ShardRanges {
  int dim = -1;  // -1: the whole tensor
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t count() const;
};

struct TpShard {
  int rank = 0, size = 1;
  ModelConfig full;   // the checkpoint's
  ModelConfig local;  // this rank's head counts and MLP width (vocab stays the full vocabulary)
  // lm_head rows [vocab_begin, vocab_begin + vocab_rows); every rank's logits part is padded to
  // vocab_padded rows so the gather is even.
  int64_t vocab_begin = 0, vocab_rows = 0, vocab_padded = 0;
  // The rank's items [first, second) of the checkpoint's: query heads, KV heads, GDN key heads (its
  // value heads follow), MLP columns.
  std::pair<int64_t, int64_t> q_heads, kv_heads, gdn_k_heads, mlp;
  bool kv_replicated = false;  // each rank holds a KV head that other ranks hold too

  // The part of tensor `name` (a checkpoint name without prefix) this rank holds.
  ShardRanges ranges(const std::string& name) const;
};

// Shares that do not divide evenly differ by one item between ranks. Throws pe::Error naming the
// count when a rank would get none, or when a rank's query heads would use KV heads unevenly.
TpShard make_tp_shard(const ModelConfig& full, int rank, int size);

// The rank's part of a row-major tensor of `shape` (elements of `elem_bytes`), and its shape.
std::vector<uint8_t> take_shard(const ShardRanges& r, const std::vector<int64_t>& shape, size_t elem_bytes,
                                const void* data, std::vector<int64_t>* shard_shape);

// The block ranges of an FP8 weight's scale tensor for its weight's ranges (block rows or columns
// of `block`); throws naming `name` when a range does not start and end on a block boundary
// (the tensor's end counts as one).
ShardRanges block_ranges(const ShardRanges& r, int64_t full_extent, int64_t block, const std::string& name);

}  // namespace pe
