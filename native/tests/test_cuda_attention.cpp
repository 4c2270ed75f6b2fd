// CUDA kv_write + attention_paged against the CPU twins, every cache dtype (F32, F16, BF16,
// FP8_E4M3, I8 + row scales, NVFP4 + group scales).
// kv_write: the same fp32 K/V written by both backends must give the same bytes AND scales
// (the codecs round identically). attention: the GPU reads the cache the CPU wrote (uploaded),
// the CPU reads its own; outputs within the cuda_ops.h tolerance.
// Sizes: the test checkpoints' head layouts (4 q / 2 kv D64, 8/2 D128, 6/3 D16, 3/1 D32) and the
// 27B one (24/4 D256), shuffled pages of 16 / 64 / 7 tokens, prefill from 0 (n_q 1 .. 1000),
// decode and chunked prefill after contexts of 1, 63, 65, 1000 (split-K + combine), the
// speculative-verify block (n_q 8 at depth), gate on/off, and an odd head_dim (tiled fallback).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/kv_codec.h"
#include "kernels/ops.h"
#include "test_cuda_util.h"

using namespace pe;
using cpu::PagedKV;
using pe_test::DevBuf;

namespace pe::cuda::attn {  // attention_decode.cu: the split-K merge (internal, not in cuda_ops.h)
void attention_combine(const float* part, int splits, int64_t n_rows, int D, const float* gate,
                       float* out, cudaStream_t stream);
}  // namespace pe::cuda::attn

namespace {

struct Shape {
  int64_t hq, hkv, d;
};

const DType kAllKv[] = {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3, DType::I8, DType::NVFP4};

// Normalized-error limit of a cache dtype (cuda_ops.h): both backends decode the same bytes to the
// same values, so only fp32 summation order differs.
double tol_of(DType t) { return t == DType::F32 ? 1e-5 : 1e-4; }

// Which CUDA entry point a check runs: the public dispatcher, or the tensor-core prefill kernel
// (attention_prefill_mma, tolerance kMmaTol) called directly.
enum class Kernel { dispatch, prefill_mma };
constexpr double kMmaTol = 3e-3;  // fp16 Q, K, V, P (cuda_ops.h)

void check_attention(const Shape& s, DType kvt, int64_t start, int64_t n_q, bool gated, int64_t page,
                     uint64_t seed, Kernel kernel = Kernel::dispatch, float q_mag = 1.0f, float kv_mag = 1.0f) {
  pe_test::Rng rng(seed);
  const int64_t total = start + n_q;
  const int64_t n_pages = (total + page - 1) / page + 3;
  std::vector<int32_t> pt(n_pages);
  std::iota(pt.begin(), pt.end(), 0);
  for (int64_t i = n_pages - 1; i > 0; --i) std::swap(pt[i], pt[rng.below(i + 1)]);
  const cpu::KvRowFormat fmt = cpu::kv_row_format(kvt, s.d);
  const int64_t rows = n_pages * page * s.hkv, row = s.hkv * s.d;
  std::vector<uint8_t> hk(rows * fmt.bytes, 0), hv(rows * fmt.bytes, 0);
  std::vector<float> hks(std::max<int64_t>(rows * fmt.scales, 1), 0.0f), hvs(hks.size(), 0.0f);
  PagedKV ckv{kvt, hk.data(), hv.data(), hks.data(), hvs.data(), page, s.hkv, s.d};
  DevBuf<uint8_t> dk(hk), dv(hv);
  DevBuf<float> dks(hks), dvs(hvs);
  PagedKV gkv{kvt, dk.p, dv.p, dks.p, dvs.p, page, s.hkv, s.d};
  DevBuf<int32_t> dpt(pt);
  // Cache the prefix and the new tokens in two writes (as a chunked prefill does). K/V spread
  // like post-norm activations, with a few outliers so the I8/NVFP4 scales vary.
  std::vector<float> k = rng.normals(total * row), v = rng.normals(total * row);
  for (int64_t i = 0; i < total * row; i += 37) k[i] *= 8.0f, v[i] *= 5.0f;
  for (int64_t i = 0; i < total * row; ++i) k[i] *= kv_mag, v[i] *= kv_mag;
  DevBuf<float> gk(k), gv(v);
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, start}, {start, total}}) {
    if (e <= b) continue;
    cpu::kv_write(ckv, pt.data(), b, e - b, k.data() + b * row, v.data() + b * row);
    cuda::kv_write(gkv, dpt.p, b, e - b, gk.p + b * row, gv.p + b * row, nullptr);
  }
  const std::string cfg = cfgs("%s H%lld/%lld D%lld start=%lld n=%lld pg%lld%s", dtype_name(kvt),
                               (long long)s.hq, (long long)s.hkv, (long long)s.d, (long long)start,
                               (long long)n_q, (long long)page, gated ? " gate" : "");
  // Same bytes and the same scales (bit for bit) from both encoders.
  CHECK(dk.download() == hk);
  CHECK(dv.download() == hv);
  CHECK(dks.download() == hks);
  CHECK(dvs.download() == hvs);

  std::vector<float> q = rng.normals(n_q * s.hq * s.d);
  for (float& x : q) x *= q_mag;
  const std::vector<float> gate = rng.normals(n_q * s.hq * s.d, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  std::vector<float> ref(n_q * s.hq * s.d);
  cpu::attention_paged(q.data(), n_q, start, s.hq, ckv, pt.data(), scale, gated ? gate.data() : nullptr,
                       ref.data());
  // The GPU reads the pages the CPU wrote.
  dk.upload(hk);
  dv.upload(hv);
  dks.upload(hks);
  dvs.upload(hvs);
  DevBuf<float> dq(q), dgate(gate), dout(ref.size());
  if (kernel == Kernel::prefill_mma) {
    cuda::attention_prefill_mma(dq.p, n_q, start, s.hq, gkv, dpt.p, scale, gated ? dgate.p : nullptr,
                                dout.p, nullptr);
    EXPECT_CLOSE("prefill_mma", cfg, dout.download(), ref, kMmaTol);
    return;
  }
  const size_t sb = cuda::attention_paged_scratch_bytes(n_q, start, s.hq, s.hkv, s.d);
  DevBuf<uint8_t> scratch(sb);
  // Decode on the tensor-core caches: every attention_decode_set_variant (-1: the per-dtype default).
  const bool tc_decode = n_q <= 16 && kvt != DType::F32 && kvt != DType::BF16;
  // The new tokens' rows (and scales) poisoned, then written by kv_write right before the
  // attention, as in the model's step: the decode kernel reads older keys before its pdl_wait
  // (DecodeParams::early), and any read of a new key there would see the poison.
  std::vector<uint8_t> pk = hk, pv = hv;
  std::vector<float> pks = hks, pvs = hvs;
  for (int64_t tpos = start; tpos < total; ++tpos)
    for (int64_t h = 0; h < s.hkv; ++h) {
      const int64_t r = (pt[tpos / page] * page + tpos % page) * s.hkv + h;
      std::fill_n(pk.begin() + r * fmt.bytes, fmt.bytes, uint8_t{0xff});
      std::fill_n(pv.begin() + r * fmt.bytes, fmt.bytes, uint8_t{0xff});
      for (int64_t i = 0; i < fmt.scales; ++i) pks[r * fmt.scales + i] = pvs[r * fmt.scales + i] = NAN;
    }
  for (int variant = -1; variant < (tc_decode ? cuda::kAttentionDecodeVariants : 0); ++variant) {
    cuda::attention_decode_set_variant(variant);
    dk.upload(pk);
    dv.upload(pv);
    dks.upload(pks);
    dvs.upload(pvs);
    cuda::kv_write(gkv, dpt.p, start, n_q, gk.p + start * row, gv.p + start * row, nullptr);
    cuda::attention_paged(dq.p, n_q, start, s.hq, gkv, dpt.p, scale, gated ? dgate.p : nullptr, dout.p,
                          scratch.p, sb, nullptr);
    // Long chunks take the tensor-core kernel inside attention_paged (cuda_ops.h).
    const bool mma = n_q >= cuda::kAttentionMmaMinQueries && cuda::attention_prefill_mma_supported(n_q, gkv);
    EXPECT_CLOSE("attention", tc_decode ? cfg + cfgs(" v%d", variant) : cfg, dout.download(), ref,
                 mma ? kMmaTol : tol_of(kvt));
  }
  CHECK(dk.download() == hk);  // kv_write restored the poisoned rows
  CHECK(dks.download() == hks);
  cuda::attention_decode_set_variant(-1);
}

const Shape kCkpt[] = {{4, 2, 64}, {8, 2, 128}};
const Shape kOdd[] = {{6, 3, 16}, {3, 1, 32}};

}  // namespace

TEST(cuda_kv_codec_edge_values) {
  // Rows with ties, saturation, zeros and subnormal-range values: both encoders agree bit for bit.
  const int64_t D = 32;
  std::vector<float> k(D), v(D);
  const float specials[] = {0.0f, -0.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 448.0f,
                            500.0f, -1e6f, 1e-3f, 0.001953125f, 0.0029296875f, 65520.0f};
  for (int64_t i = 0; i < D; ++i) {
    k[i] = specials[i % 16] * (i < 16 ? 1.0f : -0.37f);
    v[i] = i == 5 ? 0.0f : specials[(i * 7) % 16] / 6.0f;
  }
  std::vector<float> zeros(D, 0.0f);
  for (DType t : kAllKv) {
    const cpu::KvRowFormat fmt = cpu::kv_row_format(t, D);
    for (const std::vector<float>* src : {&k, &zeros}) {
      std::vector<uint8_t> hk(2 * fmt.bytes, 0), hv(2 * fmt.bytes, 0);
      std::vector<float> hks(std::max<int64_t>(2 * fmt.scales, 1), 0.0f), hvs(hks.size(), 0.0f);
      PagedKV ckv{t, hk.data(), hv.data(), hks.data(), hvs.data(), 2, 1, D};
      const std::vector<int32_t> pt = {0};
      cpu::kv_write(ckv, pt.data(), 1, 1, src->data(), v.data());
      DevBuf<uint8_t> dk(hk.size()), dv(hv.size());
      dk.upload(std::vector<uint8_t>(hk.size(), 0));
      dv.upload(std::vector<uint8_t>(hv.size(), 0));
      DevBuf<float> dks(std::vector<float>(hks.size(), 0.0f)), dvs(std::vector<float>(hvs.size(), 0.0f));
      DevBuf<int32_t> dpt(pt);
      DevBuf<float> gk(*src), gv(v);
      PagedKV gkv{t, dk.p, dv.p, dks.p, dvs.p, 2, 1, D};
      cuda::kv_write(gkv, dpt.p, 1, 1, gk.p, gv.p, nullptr);
      const bool same = dk.download() == hk && dv.download() == hv && dks.download() == hks &&
                        dvs.download() == hvs;
      std::printf("  %-16s %-44s %s\n", "kv_codec", dtype_name(t), same ? "ok" : "FAIL");
      CHECK(same);
    }
  }
}

TEST(cuda_attention_prefill) {
  const bool small = small_only();
  for (DType t : kAllKv)
    for (const Shape& s : kCkpt)
      for (int64_t n : {1, 3, 17, 63, 65, 1000}) {
        if (small && n > 65) continue;
        check_attention(s, t, 0, n, n % 2 == 1, n % 3 ? 16 : 64, 11 + n);
      }
}

TEST(cuda_attention_decode_and_chunked_prefill) {
  const bool small = small_only();
  for (DType t : kAllKv)
    for (const Shape& s : kCkpt)
      for (int64_t ctx : {1, 63, 65, 1000}) {
        if (small && ctx > 65) continue;
        for (int64_t n : {1, 3, 17}) check_attention(s, t, ctx, n, (n + ctx) % 2 == 0, ctx % 2 ? 16 : 64, 31 + n + ctx);
      }
}

TEST(cuda_attention_odd_shapes) {
  const bool small = small_only();
  for (DType t : kAllKv)
    for (const Shape& s : kOdd)
      for (int64_t ctx : {0, 100}) {
        check_attention(s, t, ctx, 1, true, 7, 3 + ctx);
        check_attention(s, t, ctx, small ? 17 : 65, false, 7, 4 + ctx);
      }
  // head_dim % 8 != 0: the tiled kernel serves decode too.
  for (DType t : {DType::F32, DType::F16, DType::FP8_E4M3, DType::I8})
    check_attention({4, 2, 20}, t, 100, 1, true, 16, 9);
}

TEST(cuda_attention_27b_shape) {
  const bool small = small_only();
  const Shape s{24, 4, 256};
  for (DType t : kAllKv) {
    check_attention(s, t, 0, small ? 17 : 65, true, 16, 5);
    check_attention(s, t, small ? 40 : 4000, 1, true, 64, 6);   // decode at depth: split-K
    check_attention(s, t, small ? 40 : 1000, 1, false, 16, 8);
    check_attention(s, t, small ? 40 : 2000, 8, true, 16, 7);   // speculative verify block
    check_attention(s, t, small ? 63 : 1000, 3, true, 7, 9);    // pages of 7: boundaries inside tiles
  }
}

// Decode on the tensor-core kernel (F16, FP8, I8, NVFP4 at head_dim 64 / 128 / 256) with q and
// K/V far from unit scale: q's fp16 high + low split is normalized per vector, P' = P * scale must
// stay in fp16 range. Flat (q tiny), peaked (K large) and small-V softmaxes, split-K depths.
TEST(cuda_attention_decode_magnitudes) {
  const bool small = small_only();
  const struct { float q, kv; } mags[] = {{1e-3f, 1.0f}, {1.0f, 30.0f}, {30.0f, 1e-2f}};
  for (DType t : kAllKv)
    for (const auto& mg : mags) {
      check_attention({8, 2, 128}, t, small ? 60 : 700, 1, false, 16, 77, Kernel::dispatch, mg.q, mg.kv);
      check_attention({24, 4, 256}, t, small ? 30 : 1500, 2, true, 64, 78, Kernel::dispatch, mg.q, mg.kv);
    }
}

// The tensor-core prefill kernel (attention_prefill_mma, behind attention_paged for chunks of >= 64 queries) against
// the CPU twin: the checkpoint and 27B head layouts plus padded head_dims (16, 32, 40, 80: run as
// 64 / 128 with zero columns), query counts around the 64-query block and the 16..64-key tiles,
// from position 0 and after a cached prefix (chunked prefill), pages of 16, 64 and 7, gate on/off,
// every cache dtype. Shapes the kernel refuses are listed (attention_paged keeps the tiled kernel
// for them).
TEST(cuda_attention_prefill_mma) {
  const bool small = small_only();
  const Shape shapes[] = {{4, 2, 64}, {8, 2, 128}, {24, 4, 256}, {6, 3, 16}, {3, 1, 32}, {2, 2, 40}, {4, 1, 80}};
  const int64_t full_n[] = {1, 3, 17, 63, 65, 200, 1000}, small_n[] = {1, 17, 65};
  const int64_t full_start[] = {0, 100, 1000}, small_start[] = {0, 37};
  int runs = 0, skips = 0;
  uint64_t seed = 1000;
  for (const Shape& s : shapes)
    for (DType t : kAllKv) {
      const cpu::KvRowFormat fmt = [&] {
        try {
          return cpu::kv_row_format(t, s.d);
        } catch (const std::exception&) {
          return cpu::KvRowFormat{0, 0};
        }
      }();
      const PagedKV probe{t, reinterpret_cast<void*>(256), reinterpret_cast<void*>(512), nullptr, nullptr, 16,
                          s.hkv, s.d};
      if (fmt.bytes == 0 || !cuda::attention_prefill_mma_supported(1, probe)) {
        std::printf("  %-16s %s H%lld/%lld D%lld: refused by the kernel (tiled kernel serves it)\n", "prefill_mma", dtype_name(t),
                    (long long)s.hq, (long long)s.hkv, (long long)s.d);
        ++skips;
        continue;
      }
      const bool big = s.d >= 128;  // keep the CPU reference time of the default run short
      for (int64_t start : small ? std::vector<int64_t>(small_start, small_start + 2)
                                 : std::vector<int64_t>(full_start, full_start + 3))
        for (int64_t n : small ? std::vector<int64_t>(small_n, small_n + 3)
                               : std::vector<int64_t>(full_n, full_n + 7)) {
          if (small && s.hq >= 24 && n > 17) continue;
          // The padded head_dims and the slower dtypes of the big shapes: a subset of the sizes.
          if (!small && (s.d % 64 != 0 || (big && t != DType::F16 && t != DType::F32)) && n != 1 &&
              n != 65 && n != 200)
            continue;
          ++seed;
          const int64_t page = (n + start) % 2 ? 16 : s.d % 64 ? 7 : 64;  // 7: rows straddle tiles
          check_attention(s, t, start, n, (n + start / 100) % 2 == 1, page, seed, Kernel::prefill_mma);
          ++runs;
        }
    }
  std::printf("  prefill_mma: %d cases, %d shape/dtype pairs skipped\n", runs, skips);
  CHECK(runs > 0);
  // Refused shapes: head_dim not a multiple of 8 or above 256, unaligned cache.
  CHECK(!cuda::attention_prefill_mma_supported(8, PagedKV{DType::F16, reinterpret_cast<void*>(256),
                                                           reinterpret_cast<void*>(512), nullptr, nullptr, 16, 2, 20}));
  CHECK(!cuda::attention_prefill_mma_supported(8, PagedKV{DType::F16, reinterpret_cast<void*>(256),
                                                           reinterpret_cast<void*>(512), nullptr, nullptr, 16, 2, 512}));
  CHECK(!cuda::attention_prefill_mma_supported(8, PagedKV{DType::F16, reinterpret_cast<void*>(264),
                                                           reinterpret_cast<void*>(512), nullptr, nullptr, 16, 2, 64}));
}

// The tensor-core decode variants of attention_decode_set_variant (cuda_ops.h; -1 the per-dtype
// default) against variant 0 on the same GPU-written cache: the same values (bit for bit, but
// the pairs kernel of 6 and the default on splits of <= 32 keys: within float rounding; checked
// at 1e-6). check_attention runs them all against the CPU too.
// Depths past one window per block (27B shape on 132 SMs: 66 splits, > 33,800 keys) use the rows
// resolved past a window's end; pages of 7 put page boundaries inside every tile; n_q 3 masks.
TEST(cuda_attention_decode_variants) {
  const bool small = small_only();
  const struct { Shape s; int64_t ctx, n_q, page; } cases[] = {
      {{24, 4, 256}, 1, 1, 16},   {{24, 4, 256}, 63, 3, 7},       {{24, 4, 256}, 1500, 1, 16},
      {{8, 2, 128}, 700, 2, 7},   {{4, 2, 64}, 5000, 1, 64},      {{24, 4, 256}, small ? 3000 : 40000, 1, 16},
      {{24, 4, 256}, small ? 2000 : 34500, 3, 7},
      // Variant 4 (NVFP4: chunks loaded a step ahead, rows resolved past the window): a
      // warp's look-ahead step past the split's end, 16 queries, every head_dim; 52,000 keys: past
      // one window per block.
      {{24, 4, 256}, 65, 3, 7},   {{24, 4, 256}, 1000, 16, 7},    {{8, 2, 128}, 65, 16, 7},
      {{4, 2, 64}, 1000, 3, 7},   {{24, 4, 256}, small ? 1100 : 52000, 1, 16}};
  for (DType t : {DType::F16, DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (const auto& c : cases) {
      pe_test::Rng rng(900 + c.ctx);
      const int64_t total = c.ctx + c.n_q, n_pages = (total + c.page - 1) / c.page + 2;
      std::vector<int32_t> pt(n_pages);
      std::iota(pt.begin(), pt.end(), 0);
      for (int64_t i = n_pages - 1; i > 0; --i) std::swap(pt[i], pt[rng.below(i + 1)]);
      const cpu::KvRowFormat fmt = cpu::kv_row_format(t, c.s.d);
      const int64_t rows = n_pages * c.page * c.s.hkv, row = c.s.hkv * c.s.d;
      DevBuf<uint8_t> dk(rows * fmt.bytes), dv(rows * fmt.bytes);
      DevBuf<float> dks(std::max<int64_t>(rows * fmt.scales, 1)), dvs(std::max<int64_t>(rows * fmt.scales, 1));
      DevBuf<int32_t> dpt(pt);
      PagedKV gkv{t, dk.p, dv.p, dks.p, dvs.p, c.page, c.s.hkv, c.s.d};
      {
        DevBuf<float> gk(rng.normals(total * row)), gv(rng.normals(total * row));
        cuda::kv_write(gkv, dpt.p, 0, total, gk.p, gv.p, nullptr);
      }
      DevBuf<float> dq(rng.normals(c.n_q * c.s.hq * c.s.d)), dgate(rng.normals(c.n_q * c.s.hq * c.s.d));
      const size_t sb = cuda::attention_paged_scratch_bytes(c.n_q, c.ctx, c.s.hq, c.s.hkv, c.s.d);
      DevBuf<uint8_t> scratch(sb);
      std::vector<float> ref;
      for (int i = 0; i <= cuda::kAttentionDecodeVariants; ++i) {
        const int variant = i < cuda::kAttentionDecodeVariants ? i : -1;  // the per-dtype default last
        cuda::attention_decode_set_variant(variant);
        DevBuf<float> dout(c.n_q * c.s.hq * c.s.d);
        cuda::attention_paged(dq.p, c.n_q, c.ctx, c.s.hq, gkv, dpt.p, 1.0f / std::sqrt(static_cast<float>(c.s.d)),
                              dgate.p, dout.p, scratch.p, sb, nullptr);
        const std::vector<float> out = dout.download();
        if (variant == 0) {
          ref = out;
          continue;
        }
        const bool same = std::memcmp(out.data(), ref.data(), out.size() * sizeof(float)) == 0;
        const std::string cfg = cfgs("%s H%lld/%lld D%lld ctx=%lld n=%lld pg%lld v%d%s", dtype_name(t),
                                     (long long)c.s.hq, (long long)c.s.hkv, (long long)c.s.d, (long long)c.ctx,
                                     (long long)c.n_q, (long long)c.page, variant, same ? " bitwise" : "");
        EXPECT_CLOSE("decode_variant", cfg, out, ref, 1e-6);
      }
      cuda::attention_decode_set_variant(-1);
      // Other split lengths (attention_decode_set_min_split_keys): the partial states grouped
      // otherwise, the same values within float rounding.
      for (int msk : {16, 64, 128}) {
        cuda::attention_decode_set_min_split_keys(msk);
        DevBuf<float> dout(c.n_q * c.s.hq * c.s.d);
        cuda::attention_paged(dq.p, c.n_q, c.ctx, c.s.hq, gkv, dpt.p, 1.0f / std::sqrt(static_cast<float>(c.s.d)),
                              dgate.p, dout.p, scratch.p, sb, nullptr);
        EXPECT_CLOSE("decode_min_split_keys",
                     cfgs("%s D%lld ctx=%lld n=%lld msk=%d", dtype_name(t), (long long)c.s.d, (long long)c.ctx,
                          (long long)c.n_q, msk),
                     dout.download(), ref, 1e-5);
      }
      cuda::attention_decode_set_min_split_keys(0);
    }
}

// The split-K merge alone, on partial states made up here: split counts below, at and above the
// kernel's prefetched chunk (8 warps x 16 = 128 splits) up to the 256 cap, whatever the GPU's SM
// count (attention_paged picks its splits from it). Some splits saw no key (m = -inf, l = 0);
// head_dim 40 leaves a partial 32-dim block; gate on and off. Reference in double.
TEST(cuda_attention_combine_splits) {
  const int64_t n_rows = 3;
  for (int splits : {2, 9, 127, 128, 129, 200, 256})
    for (int D : {40, 256})
      for (bool gated : {false, true}) {
        pe_test::Rng rng(5000 + splits * 7 + D + gated);
        std::vector<float> part = rng.normals(splits * n_rows * (D + 2));
        float* acc = part.data() + splits * n_rows * 2;
        for (int64_t s = 0; s < splits; ++s)
          for (int64_t r = 0; r < n_rows; ++r) {
            float* ml = part.data() + (s * n_rows + r) * 2;
            ml[0] *= 6.0f;  // log2-domain maxima a few units apart
            ml[1] = rng.uniform(0.5f, 40.0f);
            if ((s + r) % 5 == 3) {  // a split without keys for this row
              ml[0] = -INFINITY;
              ml[1] = 0.0f;
              std::fill_n(acc + (s * n_rows + r) * D, D, 0.0f);
            }
          }
        const std::vector<float> gate = rng.normals(n_rows * D, 2.0f);
        std::vector<float> want(n_rows * D);
        for (int64_t r = 0; r < n_rows; ++r) {
          double mx = -INFINITY;
          for (int64_t s = 0; s < splits; ++s) mx = std::max(mx, static_cast<double>(part[(s * n_rows + r) * 2]));
          for (int64_t d = 0; d < D; ++d) {
            double o = 0.0, l = 0.0;
            for (int64_t s = 0; s < splits; ++s) {
              const double w = std::exp2(part[(s * n_rows + r) * 2] - mx);
              l += w * part[(s * n_rows + r) * 2 + 1];
              o += w * acc[(s * n_rows + r) * D + d];
            }
            o /= l;
            if (gated) o /= 1.0 + std::exp(-static_cast<double>(gate[r * D + d]));
            want[r * D + d] = static_cast<float>(o);
          }
        }
        DevBuf<float> dpart(part), dgate(gate), dout(n_rows * D);
        cuda::attn::attention_combine(dpart.p, splits, n_rows, D, gated ? dgate.p : nullptr, dout.p, nullptr);
        EXPECT_CLOSE("combine", cfgs("splits %d D%d%s", splits, D, gated ? " gate" : ""), dout.download(), want,
                     1e-5);
      }
}
