#include "cache/kv_pool.h"

#include "core/error.h"
#include "kernels/cpu/kv_codec.h"

namespace pe {

KvPool::KvPool(const CacheShape& shape, int64_t n_pages, int64_t page_size, DType dtype, Device device)
    : n_pages_(n_pages), page_size_(page_size), n_kv_heads_(shape.n_kv_heads), head_dim_(shape.head_dim), dtype_(dtype),
      device_(device) {
  const cpu::KvRowFormat fmt = cpu::kv_row_format(dtype, shape.head_dim);
  rows_ = n_pages * page_size * shape.n_kv_heads;
  row_bytes_ = fmt.bytes;
  scale_floats_ = fmt.scales;
  const size_t values = static_cast<size_t>(rows_ * row_bytes_), scales = static_cast<size_t>(rows_ * scale_floats_) * 4;
  for (int64_t l = 0; l < shape.n_attn_layers; ++l) layers_.emplace_back(device, 2 * values + 2 * scales);
  refs_.assign(n_pages, 0);
  free_.reserve(n_pages);
  for (int64_t p = n_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

int64_t KvPool::page_bytes(const CacheShape& shape, int64_t page_size, DType dtype) {
  const cpu::KvRowFormat fmt = cpu::kv_row_format(dtype, shape.head_dim);
  return shape.n_attn_layers * 2 * page_size * shape.n_kv_heads * (fmt.bytes + 4 * fmt.scales);
}

cpu::PagedKV KvPool::layer(int64_t l) {
  uint8_t* base = layers_[l].as<uint8_t>();
  const int64_t values = rows_ * row_bytes_;
  cpu::PagedKV kv;
  kv.dtype = dtype_;
  kv.k = base;
  kv.v = base + values;
  if (scale_floats_ > 0) {
    kv.k_scale = reinterpret_cast<float*>(base + 2 * values);
    kv.v_scale = kv.k_scale + rows_ * scale_floats_;
  }
  kv.page_size = page_size_;
  kv.n_kv_heads = n_kv_heads_;
  kv.head_dim = head_dim_;
  return kv;
}

int32_t KvPool::alloc() {
  if (free_.empty()) return -1;
  int32_t p = free_.back();
  free_.pop_back();
  refs_[p] = 1;
  return p;
}

void KvPool::ref(int32_t p) {
  if (refs_[p] <= 0) fail(PE_ERR_INTERNAL, "kv page ", p, " referenced while free");
  ++refs_[p];
}

void KvPool::unref(int32_t p) {
  if (refs_[p] <= 0) fail(PE_ERR_INTERNAL, "kv page ", p, " released twice");
  if (--refs_[p] == 0) free_.push_back(p);
}

}  // namespace pe
