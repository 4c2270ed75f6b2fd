#include "cache/kv_pool.h"

#include "core/error.h"

namespace pe {

KvPool::KvPool(const ModelConfig& cfg, int64_t n_pages, int64_t page_size)
    : n_pages_(n_pages),
      page_size_(page_size),
      n_kv_heads_(cfg.n_kv_heads),
      head_dim_(cfg.head_dim),
      row_floats_(cfg.n_kv_heads * cfg.head_dim) {
  const int64_t n_layers = cfg.n_full_layers();
  const size_t floats = static_cast<size_t>(n_pages * page_size * row_floats_);
  k_.resize(n_layers);
  v_.resize(n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    k_[l].assign(floats, 0.0f);
    v_[l].assign(floats, 0.0f);
  }
  refs_.assign(n_pages, 0);
  free_.reserve(n_pages);
  for (int64_t p = n_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

int64_t KvPool::page_bytes(const ModelConfig& cfg, int64_t page_size) {
  return cfg.n_full_layers() * 2 * page_size * cfg.n_kv_heads * cfg.head_dim * int64_t(sizeof(float));
}

cpu::PagedKV KvPool::layer(int64_t l) {
  cpu::PagedKV kv;
  kv.dtype = DType::F32;
  kv.k = k_[l].data();
  kv.v = v_[l].data();
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
