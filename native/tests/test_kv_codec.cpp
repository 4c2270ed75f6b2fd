// KV cache row formats (kernels/cpu/kv_codec.h) and attention over quantized caches.
#include <cmath>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "kernels/cpu/kv_codec.h"
#include "kernels/ops.h"

using namespace pe;
using namespace pe::cpu;

namespace {

const DType kAll[] = {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3, DType::I8, DType::NVFP4};

// Largest allowed |decoded - x| for a row whose max |x| is m (per value magnitude a).
double bound(DType t, double a, double m) {
  switch (t) {
    case DType::F32: return 0.0;
    case DType::F16: return a * 1e-3 + 1e-7;
    case DType::BF16: return a * 4e-3 + 1e-30;
    case DType::FP8_E4M3: return a * 0.0625 + 0.002;  // 3 mantissa bits; subnormals near 0
    case DType::I8: return m / 254.0 + 1e-7;
    default: return m / 6.0;                          // fp4: half the widest e2m1 step (2) x scale
  }
}

}  // namespace

TEST(rows_round_trip_within_each_formats_rounding) {
  pe_test::Rng rng(11);
  for (DType t : kAll)
    for (int64_t D : {16, 32, 128, 256}) {
      std::vector<float> x = rng.normals(D, 3.0f), y(D);
      x[0] = 0.0f;
      KvRowFormat f = kv_row_format(t, D);
      std::vector<uint8_t> bytes(f.bytes);
      std::vector<float> scales(f.scales + 1);
      kv_encode_row(t, x.data(), D, bytes.data(), scales.data());
      kv_decode_row(t, bytes.data(), scales.data(), D, y.data());
      double m = 0;
      for (float v : x) m = std::max(m, std::fabs(static_cast<double>(v)));
      int bad = 0;
      for (int64_t i = 0; i < D; ++i) {
        // fp4 groups have their own max: use the row max as a (looser) stand-in.
        if (std::fabs(y[i] - x[i]) > bound(t, std::fabs(x[i]), m)) ++bad;
      }
      CHECK_EQ(bad, 0);
      CHECK_EQ(y[0], 0.0f);
    }
}

TEST(fp4_needs_groups_of_16_and_unknown_dtypes_are_refused) {
  bool threw = false;
  try {
    kv_row_format(DType::NVFP4, 24);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
  threw = false;
  try {
    kv_row_format(DType::I32, 32);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

// Attention over a quantized cache must equal attention over an fp32 cache holding the decoded
// values: quantization is the only difference between the formats.
TEST(attention_on_a_quantized_cache_equals_attention_on_its_decoded_values) {
  pe_test::Rng rng(5);
  const int64_t page = 16, pages = 6, H = 6, Hkv = 2, D = 32, n_ctx = 70;
  std::vector<int32_t> table = {4, 1, 5, 0, 3};
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4, DType::BF16}) {
    KvRowFormat f = kv_row_format(t, D);
    const int64_t rows = pages * page * Hkv;
    std::vector<uint8_t> kq(rows * f.bytes), vq(rows * f.bytes);
    std::vector<float> ks(rows * f.scales + 1), vs(rows * f.scales + 1);
    std::vector<float> kf(rows * D), vf(rows * D);
    PagedKV q8{t, kq.data(), vq.data(), ks.data(), vs.data(), page, Hkv, D};
    PagedKV f32{DType::F32, kf.data(), vf.data(), nullptr, nullptr, page, Hkv, D};
    std::vector<float> k = rng.normals(n_ctx * Hkv * D, 2.0f), v = rng.normals(n_ctx * Hkv * D);
    kv_write(q8, table.data(), 0, n_ctx, k.data(), v.data());
    // Decode every written row into the fp32 cache.
    for (int64_t pos = 0; pos < n_ctx; ++pos)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t row = (table[pos / page] * page + pos % page) * Hkv + h;
        kv_decode_row(t, kq.data() + row * f.bytes, ks.data() + row * f.scales, D, kf.data() + row * D);
        kv_decode_row(t, vq.data() + row * f.bytes, vs.data() + row * f.scales, D, vf.data() + row * D);
      }
    const int64_t n_q = 5;
    std::vector<float> q = rng.normals(n_q * H * D), gate = rng.normals(n_q * H * D);
    std::vector<float> out_q(n_q * H * D), out_f(n_q * H * D);
    attention_paged(q.data(), n_q, n_ctx - n_q, H, q8, table.data(), 0.17f, gate.data(), out_q.data());
    attention_paged(q.data(), n_q, n_ctx - n_q, H, f32, table.data(), 0.17f, gate.data(), out_f.data());
    CHECK_CLOSE(out_q.data(), out_f.data(), n_q * H * D, 1e-6);
  }
}
