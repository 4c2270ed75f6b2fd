// GDN state slots: per slot and per GDN layer the conv state, a ring [K, conv_dim] holding the raw
// input of position p in row p % K (ops.h conv1d_causal), and the recurrent state S [Hv, dk, dv],
// fp32, contiguous per slot so a snapshot is one memcpy. A snapshot taken after position p - 1 is
// continued at position p, so its ring rows stay where the conv looks for them.
// Slots [0, n_running) serve running sequences; slots [n_running, n_running + n_snapshot) hold
// prefix-cache snapshots. Both ranges have their own free list.
#pragma once
#include <cstdint>
#include <vector>

#include "cache/cache_shape.h"
#include "core/buffer.h"

namespace pe {

// A change of slot contents made outside a forward (a new slot zeroed, a snapshot restored), which
// tensor parallel repeats on every other rank's pool (engine/tp_group.h).
struct GdnPoolOp {
  enum Kind : int32_t { Zero = 0, Copy = 1 } kind;
  int32_t dst, src;
};

class GdnPool {
 public:
  GdnPool(const CacheShape& shape, int64_t n_running, int64_t n_snapshot, Device device = Device::CPU);

  static int64_t slot_bytes(const CacheShape& shape);

  // Pointers into the pool's memory (device memory for a CUDA pool).
  float* conv_state(int32_t slot, int64_t gdn_layer);
  float* recurrent_state(int32_t slot, int64_t gdn_layer);

  // A running slot, zeroed (a new sequence's) or not (one a forward fills: speculative decoding's
  // per-position states), or -1.
  int32_t alloc_running(bool zeroed = true);
  int32_t alloc_snapshot();  // slot (contents undefined), or -1
  void release(int32_t slot);
  void zero(int32_t slot);
  void copy(int32_t dst, int32_t src);
  // While set, zero and copy also append themselves to `journal` (null: off).
  void set_journal(std::vector<GdnPoolOp>* journal) { journal_ = journal; }
  std::vector<GdnPoolOp>* journal() const { return journal_; }
  // Repeats ops recorded on another rank's pool of the same shape.
  void apply(const GdnPoolOp& op);

  Device device() const { return data_.device(); }
  int64_t slot_floats() const { return slot_floats_; }
  int64_t conv_floats() const { return conv_floats_; }  // of one layer's conv ring
  int64_t rec_floats() const { return rec_floats_; }    // of one layer's recurrent state
  int64_t n_running() const { return n_running_; }
  int64_t n_snapshot() const { return n_snapshot_; }
  int64_t n_running_free() const { return static_cast<int64_t>(free_running_.size()); }
  int64_t n_snapshot_free() const { return static_cast<int64_t>(free_snapshot_.size()); }

 private:
  int64_t n_running_, n_snapshot_;
  int64_t conv_floats_, rec_floats_, slot_floats_;
  Buffer data_;
  std::vector<int32_t> free_running_, free_snapshot_;
  std::vector<bool> in_use_;
  std::vector<GdnPoolOp>* journal_ = nullptr;
};

}  // namespace pe
