// Paged KV cache of all full-attention layers: a page id names the same block of page_size tokens
// in every layer. Pages are reference counted so the prefix cache and running requests can share
// them; a page returns to the free list when its count drops to zero.
#pragma once
#include <cstdint>
#include <vector>

#include "cache/cache_shape.h"
#include "core/buffer.h"
#include "kernels/ops.h"

namespace pe {

class KvPool {
 public:
  KvPool(const CacheShape& shape, int64_t n_pages, int64_t page_size, DType dtype = DType::F32,
         Device device = Device::CPU);

  // Bytes one page takes over all attention layers (K and V).
  static int64_t page_bytes(const CacheShape& shape, int64_t page_size, DType dtype = DType::F32);

  // Pointers into the pool's memory (device memory for a CUDA pool).
  cpu::PagedKV layer(int64_t attention_layer_index);
  Device device() const { return device_; }
  int64_t n_pages() const { return n_pages_; }
  int64_t page_size() const { return page_size_; }
  int64_t n_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }

  int32_t alloc();  // a page with count 1, or -1 when none is free
  void ref(int32_t page);
  void unref(int32_t page);
  int32_t refcount(int32_t page) const { return refs_[page]; }

 private:
  int64_t n_pages_, page_size_, n_kv_heads_, head_dim_;
  DType dtype_;
  Device device_;
  // One allocation per attention layer: K rows, V rows, then (I8, NVFP4) K and V row scales.
  std::vector<Buffer> layers_;
  int64_t row_bytes_ = 0, scale_floats_ = 0, rows_ = 0;
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;
};

}  // namespace pe
