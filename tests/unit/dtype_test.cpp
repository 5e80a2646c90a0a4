// DType names/sizes and the float conversions: bf16 rounding, f16 (incl. subnormals), fp8 codes.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>
#include <limits>

#include "core/error.h"
#include "core/rng.h"

namespace sala {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(DTypeNames, ParseAndSize) {
  EXPECT_EQ(parse_dtype("BF16"), DType::BF16);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::F8_E4M3);
  EXPECT_EQ(dtype_name(DType::U16), "U16");
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::BOOL), 1u);
  EXPECT_TRUE(dtype_is_float(DType::F8_E5M2));
  EXPECT_FALSE(dtype_is_float(DType::I8));
  EXPECT_THROW(parse_dtype("bf16"), Error);
}

TEST(DTypeBf16, RoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, lower code even: down
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, lower code odd: up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);  // just above the tie: up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fff)), 0x3f80);  // just below the tie: down
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);  // subnormal tie, odd: up
  uint16_t nan = f32_to_bf16(from_bits(0x7f800001));       // signalling NaN with low payload only
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(round_bf16(1.00390625f), 1.0f);  // 1 + 2^-8 is the tie between 1 and 1 + 2^-7
  for (uint32_t c = 0; c < 0x10000; ++c) {   // every non-NaN code round trips
    float f = bf16_to_f32(uint16_t(c));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), c) << std::hex << c;
  }
}

TEST(DTypeF16, KnownValuesAndRounding) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));          // smallest normal
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));          // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));       // largest subnormal
  EXPECT_EQ(f16_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));

  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie between 65504 and 65536: even -> inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even: down
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd: up
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);             // half the smallest subnormal: even -> 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);             // 1.5 subnormal steps: tie -> even 2
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(f32_to_f16(std::ldexp(2047.0f, -25)), 0x0400);          // rounds up into the normals
}

TEST(DTypeF16, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    float f = f16_to_f32(uint16_t(c));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), c) << std::hex << c;
  }
}

TEST(DTypeFp8, E4M3KnownCodes) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
  EXPECT_EQ(f32_to_fp8_e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_fp8_e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(1.0625f), 0x38);  // tie between 1 and 1.125: even
  EXPECT_EQ(f32_to_fp8_e4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25: even
}

TEST(DTypeFp8, E5M2KnownCodes) {
  EXPECT_EQ(fp8_e5m2_to_f32(0x3c), 1.0f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_EQ(fp8_e5m2_to_f32(0xbc), -1.0f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(fp8_e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_f32(0x7c)));
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_f32(0x7d)));
}

// The table search gives the code a scan of every code picks: nearest, ties to the even code,
// saturating — on every midpoint between neighbours, just around it, and on random magnitudes.
TEST(DTypeFp8, EncodeMatchesExhaustiveNearestSearch) {
  auto scan = [](float f, float (*decode)(uint8_t)) {
    const uint8_t sign = std::signbit(f) ? 0x80 : 0;
    int n = 0;
    while (n < 0x80 && std::isfinite(decode(uint8_t(n)))) ++n;
    const float a = std::min(std::fabs(f), decode(uint8_t(n - 1)));  // saturate
    int best = 0;
    float best_err = INFINITY;
    for (int c = 0; c < n; ++c) {
      const float d = decode(uint8_t(c));
      const float err = std::fabs(std::fabs(d) - a);
      if (err < best_err || (err == best_err && c % 2 == 0)) best_err = err, best = c;
    }
    return uint8_t(sign | best);
  };
  using Enc = uint8_t (*)(float);
  using Dec = float (*)(uint8_t);
  for (auto [enc, dec] : {std::pair<Enc, Dec>{f32_to_fp8_e4m3, fp8_e4m3_to_f32}, std::pair<Enc, Dec>{f32_to_fp8_e5m2, fp8_e5m2_to_f32}}) {
    std::vector<float> xs;
    for (int c = 0; c + 1 < 0x80 && std::isfinite(dec(uint8_t(c + 1))); ++c) {
      const float mid = 0.5f * (dec(uint8_t(c)) + dec(uint8_t(c + 1)));
      xs.insert(xs.end(), {mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY), -mid});
    }
    for (uint64_t i = 0; i < 20000; ++i) xs.push_back(normal01(5, i) * std::ldexp(1.f, int(i % 40) - 20));
    xs.insert(xs.end(), {0.f, -0.f, 1e30f, -1e30f, 1e-30f});
    for (float x : xs) ASSERT_EQ(enc(x), scan(x, dec)) << x;
  }
}

TEST(DTypeFp8, EncodeDecodeEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    float a = fp8_e4m3_to_f32(uint8_t(c));
    if (std::isfinite(a)) {
      EXPECT_EQ(f32_to_fp8_e4m3(a), c) << std::hex << c;
    }
    float b = fp8_e5m2_to_f32(uint8_t(c));
    if (std::isfinite(b)) {
      EXPECT_EQ(f32_to_fp8_e5m2(b), c) << std::hex << c;
    }
  }
}

TEST(DTypeConvert, BufferConversions) {
  const float src[] = {1.0f, -2.5f, 0.15625f, 300.0f};
  float back[4];
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    uint8_t buf[16];
    convert_from_f32(src, t, buf, 4);
    convert_to_f32(buf, t, back, 4);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], src[i]) << dtype_name(t);  // all exact in these types
  }
  const int32_t ints[] = {-7, 0, 42, 1 << 20};
  convert_to_f32(ints, DType::I32, back, 4);
  EXPECT_EQ(back[0], -7.0f);
  EXPECT_EQ(back[3], float(1 << 20));
  uint8_t dst[4];
  EXPECT_THROW(convert_from_f32(src, DType::I32, dst, 1), Error);
}

}  // namespace
}  // namespace sala
