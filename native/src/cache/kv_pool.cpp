#include "cache/kv_pool.h"

#include "core/error.h"
#include "kernels/cpu/kv_codec.h"

namespace pe {

KvPool::KvPool(const ModelConfig& cfg, int64_t n_pages, int64_t page_size, DType dtype)
    : n_pages_(n_pages), page_size_(page_size), n_kv_heads_(cfg.n_kv_heads), head_dim_(cfg.head_dim), dtype_(dtype) {
  const int64_t n_layers = cfg.n_full_layers();
  const int64_t rows = n_pages * page_size * cfg.n_kv_heads;
  const cpu::KvRowFormat fmt = cpu::kv_row_format(dtype, cfg.head_dim);
  k_.resize(n_layers);
  v_.resize(n_layers);
  k_scale_.resize(n_layers);
  v_scale_.resize(n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    k_[l].assign(static_cast<size_t>(rows * fmt.bytes), 0);
    v_[l].assign(static_cast<size_t>(rows * fmt.bytes), 0);
    k_scale_[l].assign(static_cast<size_t>(rows * fmt.scales), 0.0f);
    v_scale_[l].assign(static_cast<size_t>(rows * fmt.scales), 0.0f);
  }
  refs_.assign(n_pages, 0);
  free_.reserve(n_pages);
  for (int64_t p = n_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

int64_t KvPool::page_bytes(const ModelConfig& cfg, int64_t page_size, DType dtype) {
  const cpu::KvRowFormat fmt = cpu::kv_row_format(dtype, cfg.head_dim);
  return cfg.n_full_layers() * 2 * page_size * cfg.n_kv_heads * (fmt.bytes + 4 * fmt.scales);
}

cpu::PagedKV KvPool::layer(int64_t l) {
  cpu::PagedKV kv;
  kv.dtype = dtype_;
  kv.k = k_[l].data();
  kv.v = v_[l].data();
  kv.k_scale = k_scale_[l].empty() ? nullptr : k_scale_[l].data();
  kv.v_scale = v_scale_[l].empty() ? nullptr : v_scale_[l].data();
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
