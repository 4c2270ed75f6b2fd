// dtype conversions: exhaustive round trips, round-to-nearest-even at ties, special values, and a
// nearest-value property check on random floats for every narrow format.
#include <cmath>
#include <cstring>
#include <limits>

#include "check.h"
#include "core/dtype.h"

using namespace pe;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// |x - decode(code)| must not exceed the distance to the decoded neighbours code +- 1 (same
// sign), i.e. the encoder picked a nearest value.
template <typename Dec>
bool is_nearest(float x, Dec dec, uint32_t code, uint32_t sign_bit, uint32_t max_mag) {
  const double d = std::fabs(static_cast<double>(x) - dec(code));
  const uint32_t sign = code & sign_bit;
  const uint32_t mag = code & ~sign_bit;
  for (int delta : {-1, 1}) {
    const int64_t m = static_cast<int64_t>(mag) + delta;
    if (m < 0 || m > static_cast<int64_t>(max_mag)) continue;
    const double dn = std::fabs(static_cast<double>(x) - dec(sign | static_cast<uint32_t>(m)));
    if (dn < d) return false;
  }
  return true;
}

}  // namespace

TEST(sizes_and_names) {
  CHECK_EQ(dtype_size(DType::F32), 4u);
  CHECK_EQ(dtype_size(DType::BF16), 2u);
  CHECK_EQ(dtype_size(DType::FP8_E4M3), 1u);
  CHECK_EQ(dtype_size(DType::NVFP4), 0u);
  CHECK_EQ(dtype_bytes_for(DType::NVFP4, 7), 4u);
  CHECK_EQ(dtype_bytes_for(DType::F16, 7), 14u);
  CHECK(std::strcmp(dtype_name(DType::BF16), "bf16") == 0);
  CHECK(dtype_valid(0) && dtype_valid(6) && !dtype_valid(7) && !dtype_valid(-1));
}

TEST(f16_exhaustive_round_trip) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
    if (nan) {
      bad += !std::isnan(f) || !std::isnan(f16_to_f32(f32_to_f16(f)));
    } else {
      bad += f32_to_f16(f) != h;
    }
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(f16_to_f32(0x3c00), 1.0f);
  CHECK_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  CHECK_EQ(f16_to_f32(0x7bff), 65504.0f);
}

TEST(f16_rounding_and_specials) {
  CHECK_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even (down)
  CHECK_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  CHECK_EQ(f32_to_f16(65519.0f), 0x7bff);
  CHECK_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie at max rounds to inf
  CHECK_EQ(f32_to_f16(1e30f), 0x7c00);
  CHECK_EQ(f32_to_f16(-INFINITY), 0xfc00);
  CHECK_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);      // tie with 0 -> 0
  CHECK_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);      // 1.5 quanta -> 2
  CHECK_EQ(f32_to_f16(std::ldexp(1.0f, -24) * 1.01f), 0x0001);
  CHECK_EQ(f32_to_f16(-0.0f), 0x8000);
  CHECK(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  pe_test::Rng rng(1);
  int bad = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(rng.uniform(-1.0f, 1.0f), static_cast<int>(rng.below(44)) - 28);
    const uint16_t h = f32_to_f16(x);
    if (std::fabs(x) >= 65504.0f) continue;
    bad += !is_nearest(x, [](uint32_t c) { return f16_to_f32(c); }, h, 0x8000, 0x7bff);
  }
  CHECK_EQ(bad, 0);
}

TEST(bf16) {
  int bad = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      bad += !std::isnan(bf16_to_f32(f32_to_bf16(f)));
    } else {
      bad += f32_to_bf16(f) != b;
    }
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even (down)
  CHECK_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  CHECK_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) * 1.01f), 0x3f81);
  CHECK_EQ(f32_to_bf16(INFINITY), 0x7f80);
  // A NaN whose payload lives only in the low bits must not become inf.
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(fp8_e4m3) {
  for (uint32_t v = 0; v < 256; ++v) {
    const float f = fp8e4m3_to_f32(static_cast<uint8_t>(v));
    if ((v & 0x7f) == 0x7f) {
      CHECK(std::isnan(f));
      CHECK_EQ(f32_to_fp8e4m3(f) & 0x7f, 0x7f);
    } else {
      CHECK_EQ(f32_to_fp8e4m3(f), v);
    }
  }
  CHECK_EQ(fp8e4m3_to_f32(0x38), 1.0f);
  CHECK_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  CHECK_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  CHECK_EQ(f32_to_fp8e4m3(448.0f), 0x7e);
  CHECK_EQ(f32_to_fp8e4m3(464.0f), 0x7e);  // saturates, never NaN
  CHECK_EQ(f32_to_fp8e4m3(1e9f), 0x7e);
  CHECK_EQ(f32_to_fp8e4m3(INFINITY), 0x7e);
  CHECK_EQ(f32_to_fp8e4m3(-INFINITY), 0xfe);
  CHECK_EQ(f32_to_fp8e4m3(-500.0f), 0xfe);
  CHECK(std::isnan(fp8e4m3_to_f32(f32_to_fp8e4m3(NAN))));
  CHECK_EQ(f32_to_fp8e4m3(1.0625f), 0x38);   // tie between 1 and 1.125 -> even (1)
  CHECK_EQ(f32_to_fp8e4m3(1.1875f), 0x3a);   // tie between 1.125 and 1.25 -> even (1.25)
  CHECK_EQ(f32_to_fp8e4m3(std::ldexp(1.0f, -10)), 0x00);      // half the smallest subnormal
  CHECK_EQ(f32_to_fp8e4m3(std::ldexp(3.0f, -10)), 0x02);      // 1.5 quanta -> 2
  CHECK_EQ(f32_to_fp8e4m3(std::ldexp(15.0f, -10)), 0x08);     // 7.5 quanta -> min normal
  pe_test::Rng rng(2);
  int bad = 0;
  for (int i = 0; i < 100000; ++i) {
    const float x = std::ldexp(rng.uniform(-1.0f, 1.0f), static_cast<int>(rng.below(20)) - 10);
    bad += !is_nearest(x, [](uint32_t c) { return fp8e4m3_to_f32(c); }, f32_to_fp8e4m3(x),
                       0x80, 0x7e);
  }
  CHECK_EQ(bad, 0);
}

TEST(fp4_e2m1) {
  const float vals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t c = 0; c < 16; ++c) {
    const float f = fp4e2m1_to_f32(c);
    CHECK_EQ(f, (c & 8) ? -vals[c & 7] : vals[c & 7]);
    CHECK_EQ(f32_to_fp4e2m1(f), c);
  }
  CHECK_EQ(f32_to_fp4e2m1(0.25f), 0);   // ties go to the even code
  CHECK_EQ(f32_to_fp4e2m1(0.75f), 2);
  CHECK_EQ(f32_to_fp4e2m1(1.25f), 2);
  CHECK_EQ(f32_to_fp4e2m1(1.75f), 4);
  CHECK_EQ(f32_to_fp4e2m1(2.5f), 4);
  CHECK_EQ(f32_to_fp4e2m1(3.5f), 6);
  CHECK_EQ(f32_to_fp4e2m1(5.0f), 6);
  CHECK_EQ(f32_to_fp4e2m1(5.01f), 7);
  CHECK_EQ(f32_to_fp4e2m1(100.0f), 7);
  CHECK_EQ(f32_to_fp4e2m1(-7.0f), 15);
  CHECK_EQ(f32_to_fp4e2m1(NAN), 0);
  CHECK_EQ(f32_to_fp4e2m1(0.26f), 1);
}

TEST(to_f32_bulk) {
  pe_test::Rng rng(3);
  for (int64_t n : {1, 7, 8, 17, 130}) {
    std::vector<float> x = rng.normals(n, 3.0f), got(n), want(n);
    std::vector<uint16_t> h(n), b(n);
    std::vector<uint8_t> f8(n), f4((n + 1) / 2, 0);
    std::vector<int8_t> i8(n);
    std::vector<int32_t> i32(n);
    for (int64_t i = 0; i < n; ++i) {
      h[i] = f32_to_f16(x[i]);
      b[i] = f32_to_bf16(x[i]);
      f8[i] = f32_to_fp8e4m3(x[i]);
      f4[i / 2] |= f32_to_fp4e2m1(x[i]) << ((i & 1) * 4);
      i8[i] = static_cast<int8_t>(i - 60);
      i32[i] = static_cast<int32_t>(i * 1000 - 7);
    }
    to_f32(DType::F16, h.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) want[i] = f16_to_f32(h[i]);
    CHECK(got == want);
    to_f32(DType::BF16, b.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) want[i] = bf16_to_f32(b[i]);
    CHECK(got == want);
    to_f32(DType::FP8_E4M3, f8.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) want[i] = fp8e4m3_to_f32(f8[i]);
    CHECK(got == want);
    to_f32(DType::NVFP4, f4.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) want[i] = fp4e2m1_to_f32(f32_to_fp4e2m1(x[i]));
    CHECK(got == want);
    to_f32(DType::I8, i8.data(), n, got.data());
    CHECK_EQ(got[n - 1], static_cast<float>(n - 1 - 60));
    to_f32(DType::I32, i32.data(), n, got.data());
    CHECK_EQ(got[n - 1], static_cast<float>((n - 1) * 1000 - 7));
    to_f32(DType::F32, x.data(), n, got.data());
    CHECK(got == x);
  }
}
