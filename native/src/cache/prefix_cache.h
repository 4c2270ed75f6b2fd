// Prefix cache for the hybrid model.
//
// Attention layers: full KV pages are shared between requests, keyed by a hash chain over the
// tokens of each block (a block = one KV page of page_size tokens); the block's tokens are stored
// too and compared on lookup, so a hash collision can never serve another prompt's state.
// GDN layers have no per-token cache, so the GDN state (conv + recurrent, all layers) is
// snapshotted into snapshot slots at chosen block boundaries: every `snapshot_interval` blocks
// of a prompt, at the prompt's last block boundary, and at the newest block boundary of the
// generated text (so the next turn of a chat starts from it). A prompt whose prefill is cancelled
// keeps its last computed block boundary too (so the same prompt sent again resumes there): a
// prefill chunk that ends inside a block snapshots that block's start, as the request's newest
// ("moving") snapshot, and a cancel at a block boundary copies the live state. A lookup returns
// the longest cached chain of blocks that ends at a block holding a snapshot.
// Eviction: least recently used first, only blocks no running sequence holds.
#pragma once
#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "cache/sequence.h"

namespace pe {

struct SnapshotPoint {
  int64_t offset;  // tokens into the chunk after which the state is copied
  int32_t slot;    // snapshot slot that receives it
};

class PrefixCache {
 public:
  PrefixCache(KvPool& kv, GdnPool& gdn, int64_t snapshot_interval_blocks);

  // At admission: shares the longest cached prefix with r (refs its pages, copies its snapshot
  // into r's running slot, sets n_computed / n_cached). At least one token is left to compute.
  void attach(Sequence& r);
  // Snapshot points for the chunk [start, start + n) of r: slots are taken from the snapshot pool
  // (evicting old snapshots when needed). start is r.n_computed unless tokens before the chunk
  // are still in flight (overlapped steps).
  std::vector<SnapshotPoint> plan_snapshots(const Sequence& r, int64_t start, int64_t n);
  // After the forward: offers r's newly completed blocks and the snapshots taken in them.
  void on_computed(Sequence& r, const std::vector<SnapshotPoint>& taken, int64_t chunk_start);
  // r is cancelled mid-prefill: when its computed prompt ends at a block boundary, the live GDN
  // state (r's running slot) becomes that block's snapshot.
  void keep_prefill_state(const Sequence& r);
  // r ended: its moving snapshot stays cached but no longer moves with it.
  void on_finished(const Sequence& r);
  // Frees up to n pages held only by the cache; returns how many were freed.
  int64_t evict_pages(int64_t n);
  // Returns snapshot slots that plan_snapshots handed out but the forward never used.
  void release_snapshot(int32_t slot) { gdn_.release(slot); }

  int64_t hit_tokens() const { return hit_tokens_; }
  int64_t n_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t n_pages_held() const;  // pages only the cache holds

 private:
  struct Block {
    uint64_t hash;
    uint64_t parent;
    std::vector<int32_t> tokens;
    int32_t page;
    int32_t snapshot = -1;
    uint64_t owner_request = 0;   // sequence whose moving snapshot this is (replaced as it grows)
    std::list<uint64_t>::iterator lru;
  };
  Block* find(uint64_t parent, uint64_t hash, const int32_t* tokens);
  void touch(Block& b);
  void drop_snapshot(Block& b);
  void erase(Block& b);
  int32_t take_snapshot_slot();
  bool is_snapshot_point(const Sequence& r, int64_t pos) const;

  KvPool& kv_;
  GdnPool& gdn_;
  int64_t interval_;
  int64_t page_;
  std::unordered_map<uint64_t, Block> blocks_;  // by hash
  std::list<uint64_t> lru_;                     // front = most recent
  std::unordered_map<uint64_t, uint64_t> moving_snapshot_of_;  // sequence id -> block hash
  int64_t hit_tokens_ = 0;
};

}  // namespace pe
