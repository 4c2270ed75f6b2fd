#include "cache/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace pe {

static constexpr uint64_t kChainSeed = 0x9e3779b97f4a7c15ull;

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

PrefixCache::PrefixCache(KvPool& kv, GdnPool& gdn, int64_t interval)
    : kv_(kv), gdn_(gdn), interval_(std::max<int64_t>(1, interval)), page_(kv.page_size()) {}

// Hashes of r's full blocks up to `n_blocks` (computed once per request, then reused).
static void extend_hashes(Sequence& r, int64_t n_blocks, int64_t page) {
  while (static_cast<int64_t>(r.block_hashes.size()) < n_blocks) {
    int64_t i = static_cast<int64_t>(r.block_hashes.size());
    uint64_t parent = i ? r.block_hashes[i - 1] : kChainSeed;
    uint64_t h = mix64(parent ^ 0x2545f4914f6cdd1dull);
    for (int64_t j = 0; j < page; ++j)
      h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(r.tokens[i * page + j])) + 0x632be59bd9b4e019ull));
    r.block_hashes.push_back(h);
  }
}

PrefixCache::Block* PrefixCache::find(uint64_t parent, uint64_t hash, const int32_t* tokens) {
  auto it = blocks_.find(hash);
  if (it == blocks_.end()) return nullptr;
  Block& b = it->second;
  if (b.parent != parent || !std::equal(b.tokens.begin(), b.tokens.end(), tokens)) return nullptr;
  return &b;
}

void PrefixCache::touch(Block& b) {
  lru_.erase(b.lru);
  lru_.push_front(b.hash);
  b.lru = lru_.begin();
}

void PrefixCache::drop_snapshot(Block& b) {
  if (b.snapshot >= 0) gdn_.release(b.snapshot);
  b.snapshot = -1;
  if (b.owner_request) {
    auto it = moving_snapshot_of_.find(b.owner_request);
    if (it != moving_snapshot_of_.end() && it->second == b.hash) moving_snapshot_of_.erase(it);
    b.owner_request = 0;
  }
}

void PrefixCache::erase(Block& b) {
  drop_snapshot(b);
  kv_.unref(b.page);
  lru_.erase(b.lru);
  blocks_.erase(b.hash);
}

void PrefixCache::attach(Sequence& r) {
  const int64_t max_blocks = (static_cast<int64_t>(r.tokens.size()) - 1) / page_;
  extend_hashes(r, max_blocks, page_);
  int64_t best = 0;
  int32_t best_snapshot = -1;
  for (int64_t i = 0; i < max_blocks; ++i) {
    uint64_t parent = i ? r.block_hashes[i - 1] : kChainSeed;
    Block* b = find(parent, r.block_hashes[i], r.tokens.data() + i * page_);
    if (!b) break;
    if (b->snapshot >= 0) {
      best = i + 1;
      best_snapshot = b->snapshot;
    }
  }
  if (best == 0) return;
  for (int64_t i = 0; i < best; ++i) {
    Block& b = blocks_.at(r.block_hashes[i]);
    kv_.ref(b.page);
    r.pages.push_back(b.page);
    touch(b);
  }
  gdn_.copy(r.gdn_slot, best_snapshot);
  r.n_computed = best * page_;
  r.n_blocks_offered = best;
  if (r.n_generated() == 0) r.n_cached = r.n_computed;  // a preempted request keeps its first count
  hit_tokens_ += r.n_computed;
}

bool PrefixCache::is_snapshot_point(const Sequence& r, int64_t pos) const {
  if (pos <= 0 || pos % page_) return false;
  if (pos > r.n_prompt) return true;  // generated text: the newest boundary (older ones dropped)
  return (pos / page_) % interval_ == 0 || pos == r.n_prompt / page_ * page_;
}

int32_t PrefixCache::take_snapshot_slot() {
  int32_t slot = gdn_.alloc_snapshot();
  for (auto it = lru_.rbegin(); slot < 0 && it != lru_.rend(); ++it) {
    Block& b = blocks_.at(*it);
    if (b.snapshot < 0) continue;
    drop_snapshot(b);
    slot = gdn_.alloc_snapshot();
  }
  return slot;
}

std::vector<SnapshotPoint> PrefixCache::plan_snapshots(const Sequence& r, int64_t start, int64_t n) {
  std::vector<SnapshotPoint> out;
  for (int64_t pos = (start / page_ + 1) * page_; pos <= start + n; pos += page_) {
    if (!is_snapshot_point(r, pos)) continue;
    int32_t slot = take_snapshot_slot();
    if (slot < 0) return out;
    out.push_back({pos - start, slot});
  }
  // A prompt chunk that stops inside a block: its last boundary is where a cancelled prefill
  // would resume (keep_prefill_state covers chunks that end on a boundary, at no cost).
  const int64_t end = start + n, resume = end / page_ * page_;
  if (end < r.n_prompt && end % page_ != 0 && resume > start && !is_snapshot_point(r, resume)) {
    const int32_t slot = take_snapshot_slot();
    if (slot >= 0) out.push_back({resume - start, slot});
  }
  return out;
}

void PrefixCache::keep_prefill_state(const Sequence& r) {
  const int64_t pos = r.n_computed;
  if (pos <= 0 || pos % page_ != 0 || pos >= r.n_prompt || pos / page_ > r.n_blocks_offered) return;
  const int64_t i = pos / page_ - 1;
  Block* b = find(i ? r.block_hashes[i - 1] : kChainSeed, r.block_hashes[i], r.tokens.data() + i * page_);
  if (!b || b->snapshot >= 0) return;
  const int32_t slot = take_snapshot_slot();
  if (slot < 0) return;
  gdn_.copy(slot, r.gdn_slot);
  b->snapshot = slot;
  touch(*b);
}

void PrefixCache::on_computed(Sequence& r, const std::vector<SnapshotPoint>& taken, int64_t chunk_start) {
  const int64_t full = r.n_computed / page_;
  extend_hashes(r, full, page_);
  for (int64_t i = r.n_blocks_offered; i < full; ++i) {
    uint64_t parent = i ? r.block_hashes[i - 1] : kChainSeed;
    const int32_t* toks = r.tokens.data() + i * page_;
    if (Block* b = find(parent, r.block_hashes[i], toks)) {
      touch(*b);
      continue;
    }
    if (blocks_.count(r.block_hashes[i])) continue;  // a colliding hash: keep the first, never mix
    Block b;
    b.hash = r.block_hashes[i];
    b.parent = parent;
    b.tokens.assign(toks, toks + page_);
    b.page = r.pages[i];
    kv_.ref(b.page);
    lru_.push_front(b.hash);
    b.lru = lru_.begin();
    blocks_.emplace(b.hash, std::move(b));
  }
  r.n_blocks_offered = std::max(r.n_blocks_offered, full);
  for (const SnapshotPoint& s : taken) {
    const int64_t pos = chunk_start + s.offset;
    const int64_t i = pos / page_ - 1;
    Block* b = find(i ? r.block_hashes[i - 1] : kChainSeed, r.block_hashes[i], r.tokens.data() + i * page_);
    if (!b || b->snapshot >= 0) {
      gdn_.release(s.slot);
      continue;
    }
    b->snapshot = s.slot;
    if (pos > r.n_prompt || !is_snapshot_point(r, pos)) {
      // Keep one moving snapshot per request: the newest boundary of its generated text, or of
      // its prefill while that stops inside blocks.
      auto prev = moving_snapshot_of_.find(r.id);
      if (prev != moving_snapshot_of_.end()) {
        auto pb = blocks_.find(prev->second);
        if (pb != blocks_.end() && pb->second.owner_request == r.id) drop_snapshot(pb->second);
      }
      b->owner_request = r.id;
      moving_snapshot_of_[r.id] = b->hash;
    }
  }
}

void PrefixCache::on_finished(const Sequence& r) {
  auto it = moving_snapshot_of_.find(r.id);
  if (it == moving_snapshot_of_.end()) return;
  auto b = blocks_.find(it->second);
  if (b != blocks_.end()) b->second.owner_request = 0;
  moving_snapshot_of_.erase(it);
}

int64_t PrefixCache::evict_pages(int64_t n) {
  std::vector<uint64_t> victims;
  for (auto it = lru_.rbegin(); it != lru_.rend() && static_cast<int64_t>(victims.size()) < n; ++it)
    if (kv_.refcount(blocks_.at(*it).page) == 1) victims.push_back(*it);
  for (uint64_t h : victims) erase(blocks_.at(h));
  return static_cast<int64_t>(victims.size());
}

int64_t PrefixCache::n_pages_held() const {
  int64_t n = 0;
  for (auto& [h, b] : blocks_) n += kv_.refcount(b.page) == 1;
  return n;
}

}  // namespace pe
