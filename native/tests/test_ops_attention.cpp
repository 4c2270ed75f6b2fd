// rope_neox (partial rotation) and kv_write + attention_paged (paged cache with a shuffled page
// table, several page sizes, GQA 1/2/3, gate on/off, F32/F16/BF16 cache, queries continuing after
// cached tokens; both of its ways to compute a key tile) against naive double references.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "check.h"
#include "core/dtype.h"
#include "core/threadpool.h"
#include "kernels/ops.h"

using namespace pe;

namespace {

// Reference RoPE: fp32 inv_freq and fp32 angle (the documented rounding), cos/sin in double.
void ref_rope(std::vector<double>& x, int64_t n, int64_t stride, int64_t H, int64_t D, int64_t R,
              const std::vector<int32_t>& pos, float theta, bool exact_angle) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double* a = x.data() + t * stride + h * D;
      for (int64_t i = 0; i < R / 2; ++i) {
        const float inv = 1.0f / static_cast<float>(std::pow(static_cast<double>(theta),
                                                             static_cast<double>(2 * i) / R));
        const double ang = exact_angle
                               ? pos[t] * std::pow(static_cast<double>(theta), -2.0 * i / R)
                               : static_cast<double>(static_cast<float>(pos[t]) * inv);
        const double x0 = a[i], x1 = a[i + R / 2];
        a[i] = x0 * std::cos(ang) - x1 * std::sin(ang);
        a[i + R / 2] = x1 * std::cos(ang) + x0 * std::sin(ang);
      }
    }
}

void check_rope(int64_t n, int64_t H, int64_t D, int64_t R, int64_t stride, int32_t pos0,
                bool exact_angle, double tol) {
  pe_test::Rng rng(n * 7 + R);
  auto x = rng.normals(n * stride);
  std::vector<int32_t> pos(n);
  for (int64_t t = 0; t < n; ++t) pos[t] = pos0 + static_cast<int32_t>(t * 3);
  std::vector<double> ref(x.begin(), x.end());
  ref_rope(ref, n, stride, H, D, R, pos, 1e7f, exact_angle);
  cpu::rope_neox(x.data(), n, stride, H, D, R, pos.data(), 1e7f);
  CHECK_CLOSE(x.data(), ref.data(), n * stride, tol);
}

}  // namespace

TEST(rope_simple) {
  // One head, D = 4, R = 2: dims (0, 1) rotate by pos * 1 rad; dims 2, 3 pass through.
  float x[4] = {1, 0, 5, 6};
  const int32_t pos = 1;
  cpu::rope_neox(x, 1, 4, 1, 4, 2, &pos, 10000.0f);
  CHECK_NEAR(x[0], std::cos(1.0), 1e-6);
  CHECK_NEAR(x[1], std::sin(1.0), 1e-6);
  CHECK_EQ(x[2], 5.0f);
  CHECK_EQ(x[3], 6.0f);
}

TEST(rope_partial_random) {
  for (int64_t n : {1, 3, 17, 130})
    for (int64_t D : {64, 256})
      for (int64_t R : {D / 4, D / 2}) {
        check_rope(n, 3, D, R, 3 * D, 0, true, 1e-6);             // small positions: exact math
        check_rope(n, 5, D, R, 2 * 5 * D + 3, 100000, false, 1e-6);  // strided, long positions
      }
}

namespace {

struct AttnCase {
  int64_t n_kv_heads, group, D, page_size, n0, n1;
  bool gated;
  DType dtype;
};

// Rounds to what the cache stores.
float stored(DType t, float x) {
  if (t == DType::F16) return f16_to_f32(f32_to_f16(x));
  if (t == DType::BF16) return bf16_to_f32(f32_to_bf16(x));
  return x;
}

void check_attention(const AttnCase& c, uint64_t seed) {
  pe_test::Rng rng(seed);
  const int64_t Hkv = c.n_kv_heads, Hq = Hkv * c.group, D = c.D, total = c.n0 + c.n1;
  const int64_t n_pages_used = (total + c.page_size - 1) / c.page_size;
  const int64_t n_pages = 2 * n_pages_used + 3;
  // A shuffled, non-contiguous page table.
  std::vector<int32_t> perm(n_pages);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = n_pages - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  std::vector<int32_t> table(perm.begin(), perm.begin() + n_pages_used);

  const size_t cache_elems = static_cast<size_t>(n_pages * c.page_size * Hkv * D);
  std::vector<uint8_t> kbuf(cache_elems * dtype_size(c.dtype)), vbuf(kbuf.size());
  cpu::PagedKV kv;
  kv.dtype = c.dtype;
  kv.k = kbuf.data();
  kv.v = vbuf.data();
  kv.page_size = c.page_size;
  kv.n_kv_heads = Hkv;
  kv.head_dim = D;

  const auto K = rng.normals(total * Hkv * D), V = rng.normals(total * Hkv * D);
  const auto Q = rng.normals(total * Hq * D, 2.0f), G = rng.normals(total * Hq * D, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  // Two calls: the prompt (n0 tokens from position 0), then n1 more continuing after the cache.
  std::vector<float> out(total * Hq * D);
  for (int call = 0; call < 2; ++call) {
    const int64_t start = call == 0 ? 0 : c.n0, n = call == 0 ? c.n0 : c.n1;
    if (n == 0) continue;
    cpu::kv_write(kv, table.data(), start, n, K.data() + start * Hkv * D, V.data() + start * Hkv * D);
    cpu::attention_paged(Q.data() + start * Hq * D, n, start, Hq, kv, table.data(), scale,
                         c.gated ? G.data() + start * Hq * D : nullptr,
                         out.data() + start * Hq * D);
  }

  std::vector<double> ref(total * Hq * D), p(total);
  for (int64_t t = 0; t < total; ++t)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / c.group;
      double m = -1e300;
      for (int64_t s = 0; s <= t; ++s) {
        double d = 0.0;
        for (int64_t j = 0; j < D; ++j)
          d += static_cast<double>(Q[(t * Hq + h) * D + j]) * stored(c.dtype, K[(s * Hkv + g) * D + j]);
        p[s] = d * scale;
        m = std::max(m, p[s]);
      }
      double sum = 0.0;
      for (int64_t s = 0; s <= t; ++s) sum += (p[s] = std::exp(p[s] - m));
      for (int64_t j = 0; j < D; ++j) {
        double o = 0.0;
        for (int64_t s = 0; s <= t; ++s) o += p[s] * stored(c.dtype, V[(s * Hkv + g) * D + j]);
        o /= sum;
        if (c.gated) o *= 1.0 / (1.0 + std::exp(-static_cast<double>(G[(t * Hq + h) * D + j])));
        ref[(t * Hq + h) * D + j] = o;
      }
    }
  CHECK_CLOSE(out.data(), ref.data(), total * Hq * D, 2e-6);
}

}  // namespace

TEST(attention_simple) {
  // One head, D = 2, two keys: query 1 attends to both with equal scores -> mean of the values.
  float kmem[4 * 2] = {}, vmem[4 * 2] = {};
  cpu::PagedKV kv;
  kv.k = kmem;
  kv.v = vmem;
  kv.page_size = 2;
  kv.n_kv_heads = 1;
  kv.head_dim = 2;
  const int32_t table[1] = {1};  // the second page
  const float k[4] = {1, 0, 1, 0}, v[4] = {2, 4, 6, 8}, q[4] = {0, 1, 0, 1};
  cpu::kv_write(kv, table, 0, 2, k, v);
  CHECK_EQ(kmem[4], 1.0f);  // page 1, row 0
  CHECK_EQ(vmem[7], 8.0f);  // page 1, row 1
  float out[4];
  cpu::attention_paged(q, 2, 0, 1, kv, table, 1.0f, nullptr, out);
  CHECK_NEAR(out[0], 2.0, 1e-6);  // query 0 sees only key 0
  CHECK_NEAR(out[1], 4.0, 1e-6);
  CHECK_NEAR(out[2], 4.0, 1e-6);  // query 1: mean of both
  CHECK_NEAR(out[3], 6.0, 1e-6);
}

TEST(attention_random_f32) {
  uint64_t seed = 1;
  for (int64_t page : {1, 3, 16})
    for (int64_t group : {1, 2, 3})
      for (auto nn : {std::pair<int64_t, int64_t>{1, 0}, {3, 1}, {17, 4}, {63, 2}, {65, 65}})
        check_attention({2, group, 32, page, nn.first, nn.second, (seed & 1) != 0, DType::F32},
                        seed++);
}

TEST(attention_long_and_odd) {
  check_attention({1, 3, 64, 16, 130, 1, true, DType::F32}, 100);
  check_attention({3, 2, 20, 5, 0, 17, false, DType::F32}, 101);  // no prompt: n_q > 1 from 0
  check_attention({2, 2, 256, 8, 40, 3, true, DType::F32}, 102);
  check_attention({1, 12, 16, 4, 37, 2, true, DType::F32}, 103);  // a wide group: 12 heads per KV head
  check_attention({2, 9, 8, 2, 20, 1, false, DType::F32}, 104);
}

TEST(attention_half_caches) {
  for (DType t : {DType::F16, DType::BF16}) {
    check_attention({2, 2, 32, 4, 33, 5, true, t}, 200);
    check_attention({1, 3, 64, 16, 65, 1, false, t}, 201);
  }
}

TEST(attention_tiled_and_dot_paths) {
  // attention_paged picks its path by the query vectors (queries x heads of a KV group) of a
  // task: one thread keeps blocks of up to 96 vectors (the tiled path wherever n_q * group >= 8:
  // column tails of 1 and 2 vectors, blocks cut short, masks inside a tile), 64 threads shrink
  // them to one query (the dot path). Head dims off the 4-row micro-tiles, long contexts.
  const int before = num_threads();
  uint64_t seed = 300;
  for (int threads : {1, 64}) {
    set_num_threads(threads);
    for (int64_t group : {1, 3, 5})
      for (int64_t D : {8, 22, 64})
        for (auto nn : {std::pair<int64_t, int64_t>{0, 9}, {40, 33}, {100, 97}, {150, 2}})
          check_attention({2, group, D, 16, nn.first, nn.second, (seed & 1) != 0, DType::F32}, seed++);
  }
  set_num_threads(1);
  check_attention({1, 3, 64, 16, 300, 200, true, DType::BF16}, 400);  // decoded rows in the tiled path
  check_attention({1, 4, 64, 5, 0, 70, false, DType::F16}, 401);
  set_num_threads(before);
}
