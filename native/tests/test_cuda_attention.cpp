// CUDA kv_write + attention_paged against the CPU twins: the test checkpoints' head layouts
// (3 q / 1 kv, 6/2, 6/3) and the 27B one (24/4, D 256), F32 / F16 / BF16 caches, shuffled pages
// of an awkward size, prefill from 0, chunked prefill after a cached prefix, decode at depth
// (split-K + combine), with and without the output gate.
#include <algorithm>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "kernels/ops.h"
#include "test_cuda_util.h"

using namespace pe;
using cpu::GdnArgs;
using cpu::PagedKV;
using pe_test::DevBuf;

namespace {

struct Shape {
  int64_t hq, hkv, d;
};

void check_attention(const Shape& s, DType kvt, int64_t start, int64_t n_q, bool gated,
                     uint64_t seed) {
  pe_test::Rng rng(seed);
  const int64_t page = 7, total = start + n_q;
  const int64_t n_pages = (total + page - 1) / page + 3;
  std::vector<int32_t> pt(n_pages);
  std::iota(pt.begin(), pt.end(), 0);
  for (int64_t i = n_pages - 1; i > 0; --i) std::swap(pt[i], pt[rng.below(i + 1)]);
  const int64_t row = s.hkv * s.d, es = static_cast<int64_t>(dtype_size(kvt));
  const size_t cache_bytes = static_cast<size_t>(n_pages * page * row * es);
  std::vector<uint8_t> hk(cache_bytes, 0), hv(cache_bytes, 0);
  PagedKV ckv{kvt, hk.data(), hv.data(), nullptr, nullptr, page, s.hkv, s.d};
  DevBuf<uint8_t> dk(hk), dv(hv);
  PagedKV gkv{kvt, dk.p, dv.p, nullptr, nullptr, page, s.hkv, s.d};
  DevBuf<int32_t> dpt(pt);
  // Cache the prefix and the new tokens in two writes (as a chunked prefill does).
  const std::vector<float> k = rng.normals(total * row), v = rng.normals(total * row);
  DevBuf<float> gk(k), gv(v);
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, start}, {start, total}}) {
    if (e <= b) continue;
    cpu::kv_write(ckv, pt.data(), b, e - b, k.data() + b * row, v.data() + b * row);
    cuda::kv_write(gkv, dpt.p, b, e - b, gk.p + b * row, gv.p + b * row, nullptr);
  }
  const std::vector<uint8_t> gk_bytes = dk.download();
  CHECK(gk_bytes == hk);
  CHECK(dv.download() == hv);

  const std::vector<float> q = rng.normals(n_q * s.hq * s.d), gate = rng.normals(n_q * s.hq * s.d, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  std::vector<float> ref(n_q * s.hq * s.d);
  cpu::attention_paged(q.data(), n_q, start, s.hq, ckv, pt.data(), scale, gated ? gate.data() : nullptr,
                       ref.data());
  DevBuf<float> dq(q), dgate(gate), dout(ref.size());
  const size_t sb = cuda::attention_paged_scratch_bytes(n_q, start, s.hq, s.hkv, s.d);
  DevBuf<uint8_t> scratch(sb);
  cuda::attention_paged(dq.p, n_q, start, s.hq, gkv, dpt.p, scale, gated ? dgate.p : nullptr, dout.p,
                        scratch.p, sb, nullptr);
  EXPECT_CLOSE("attention", cfgs("%s H%lld/%lld D%lld start=%lld n=%lld%s", dtype_name(kvt),
                                 (long long)s.hq, (long long)s.hkv, (long long)s.d, (long long)start,
                                 (long long)n_q, gated ? " gate" : ""),
               dout.download(), ref, kvt == DType::F32 ? 1e-5 : 1e-4);
}

const Shape kSmall[] = {{3, 1, 32}, {6, 2, 64}, {6, 3, 16}};

}  // namespace

TEST(cuda_attention_prefill) {
  const bool small = small_only();
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (const Shape& s : kSmall)
      for (int64_t n : {1, 3, 17, 63, 65, 1000}) {
        if (small && n > 65) continue;
        check_attention(s, t, 0, n, n % 2 == 1, 11 + n);
      }
}

TEST(cuda_attention_chunked_prefill_and_decode) {
  const bool small = small_only();
  for (DType t : {DType::F32, DType::F16})
    for (const Shape& s : kSmall)
      for (int64_t start : {5, 100, 3000}) {
        if (small && start > 100) continue;
        for (int64_t n : {1, 3, 17, 65}) check_attention(s, t, start, n, true, 31 + n + start);
      }
}

TEST(cuda_attention_27b_shape) {
  const bool small = small_only();
  const Shape s{24, 4, 256};
  for (DType t : {DType::F32, DType::F16}) {
    check_attention(s, t, 0, small ? 17 : 300, true, 5);
    check_attention(s, t, small ? 40 : 4000, 1, true, 6);  // decode at depth: split-K
    check_attention(s, t, small ? 40 : 2000, 8, true, 7);  // speculative verify block
  }
}
