#include "cache/gdn_pool.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace pe {
namespace {

// K rows, not the K - 1 a conv step reads: the step writes its new row in place of the oldest
// (position p - K) instead of shifting the K - 1 rows up, so no second pass over the state.
int64_t conv_ring_floats(const CacheShape& s) { return s.conv_kernel * s.conv_dim; }

}  // namespace

GdnPool::GdnPool(const CacheShape& shape, int64_t n_running, int64_t n_snapshot, Device device)
    : n_running_(n_running), n_snapshot_(n_snapshot) {
  conv_floats_ = conv_ring_floats(shape);
  rec_floats_ = shape.gdn_v_heads * shape.gdn_k_dim * shape.gdn_v_dim;
  slot_floats_ = shape.n_gdn_layers * (conv_floats_ + rec_floats_);
  const int64_t n = n_running + n_snapshot;
  data_ = Buffer(device, static_cast<size_t>(n * slot_floats_) * sizeof(float));
  in_use_.assign(n, false);
  for (int64_t s = n_running - 1; s >= 0; --s) free_running_.push_back(static_cast<int32_t>(s));
  for (int64_t s = n - 1; s >= n_running; --s) free_snapshot_.push_back(static_cast<int32_t>(s));
}

int64_t GdnPool::slot_bytes(const CacheShape& shape) {
  int64_t conv = conv_ring_floats(shape);
  int64_t rec = shape.gdn_v_heads * shape.gdn_k_dim * shape.gdn_v_dim;
  return shape.n_gdn_layers * (conv + rec) * int64_t(sizeof(float));
}

float* GdnPool::conv_state(int32_t slot, int64_t l) {
  return data_.as<float>() + slot * slot_floats_ + l * (conv_floats_ + rec_floats_);
}

float* GdnPool::recurrent_state(int32_t slot, int64_t l) { return conv_state(slot, l) + conv_floats_; }

int32_t GdnPool::alloc_running(bool zeroed) {
  if (free_running_.empty()) return -1;
  int32_t s = free_running_.back();
  free_running_.pop_back();
  in_use_[s] = true;
  if (zeroed) zero(s);
  return s;
}

int32_t GdnPool::alloc_snapshot() {
  if (free_snapshot_.empty()) return -1;
  int32_t s = free_snapshot_.back();
  free_snapshot_.pop_back();
  in_use_[s] = true;
  return s;
}

void GdnPool::release(int32_t s) {
  if (s < 0 || s >= n_running_ + n_snapshot_ || !in_use_[s]) fail(PE_ERR_INTERNAL, "gdn slot ", s, " released twice");
  in_use_[s] = false;
  (s < n_running_ ? free_running_ : free_snapshot_).push_back(s);
}

void GdnPool::zero(int32_t s) {
  if (journal_) journal_->push_back({GdnPoolOp::Zero, s, -1});
  mem_zero(data_.device(), data_.as<float>() + s * slot_floats_, sizeof(float) * slot_floats_);
}

void GdnPool::copy(int32_t dst, int32_t src) {
  if (journal_) journal_->push_back({GdnPoolOp::Copy, dst, src});
  mem_copy(data_.device(), data_.as<float>() + dst * slot_floats_, data_.as<float>() + src * slot_floats_,
           sizeof(float) * slot_floats_);
}

void GdnPool::apply(const GdnPoolOp& op) {
  const int64_t n = n_running_ + n_snapshot_;
  if (op.dst < 0 || op.dst >= n || (op.kind == GdnPoolOp::Copy && (op.src < 0 || op.src >= n)))
    fail(PE_ERR_INTERNAL, "GDN pool op on slot ", op.dst, " / ", op.src, " of a pool of ", n);
  if (op.kind == GdnPoolOp::Zero)
    zero(op.dst);
  else
    copy(op.dst, op.src);
}

}  // namespace pe
