#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace sala {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::F64, "F64", 8},         {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::I64, "I64", 8},         {DType::I32, "I32", 4},         {DType::I16, "I16", 2},
    {DType::I8, "I8", 1},           {DType::U64, "U64", 8},         {DType::U32, "U32", 4},
    {DType::U16, "U16", 2},         {DType::U8, "U8", 1},           {DType::BOOL, "BOOL", 1},
};
}  // namespace

size_t dtype_size(DType t) { return kInfo[size_t(t)].size; }
std::string_view dtype_name(DType t) { return kInfo[size_t(t)].name; }

DType parse_dtype(std::string_view name) {
  for (const auto& info : kInfo)
    if (info.name == name) return info.type;
  fail("unknown dtype '{}'", name);
}

bool dtype_is_float(DType t) {
  return t == DType::F64 || t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F8_E4M3 ||
         t == DType::F8_E5M2;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { mant <<= 1; ++e; } while (!(mant & 0x400));
      bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00);
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to inf
  if (ax < 0x38800000u) {                                  // subnormal or zero in f16
    float a;
    std::memcpy(&a, &ax, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));  // a / 2^-24, ties to even
  }
  uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

// Generic small-float decode: 1 sign bit, E exponent bits, M mantissa bits.
static float decode_small(uint8_t v, int E, int M, int bias) {
  int sign = v >> 7, exp = (v >> M) & ((1 << E) - 1), mant = v & ((1 << M) - 1);
  float mag = exp == 0 ? std::ldexp(float(mant), 1 - bias - M) : std::ldexp(float(mant | (1 << M)), exp - bias - M);
  return sign ? -mag : mag;
}

float fp8_e4m3_to_f32(uint8_t v) {
  if ((v & 0x7f) == 0x7f) return NAN;  // e4m3fn: only S.1111.111 is NaN, no infinities
  return decode_small(v, 4, 3, 7);
}

float fp8_e5m2_to_f32(uint8_t v) {
  int exp = (v >> 2) & 0x1f, mant = v & 3;
  if (exp == 31) return mant ? NAN : ((v & 0x80) ? -INFINITY : INFINITY);
  return decode_small(v, 5, 2, 15);
}

// Encode to the nearest representable value, ties to the even code, saturating at the largest
// finite one (e4m3fn has no infinities). Below the smallest normal the codes are evenly spaced
// (2^(1-bias-M)): the code is the rounded multiple. Above, the f32 mantissa is rounded to M bits
// (round to nearest even in the bits, as for bf16; a carry moves into the exponent) and the
// exponent rebiased. Tested against a scan of every code (dtype_test): quantizing a 9B model
// converts ~9e9 values, which the scan took minutes for.
template <int M, int Bias>
static uint8_t encode_fp8(float f, float max_finite) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::min(std::fabs(f), max_finite);
  constexpr float kMinNormal = 1.0f / float(1u << (Bias - 1));  // 2^(1-bias)
  if (a < kMinNormal)  // subnormal codes; nearbyint rounds half to even (default mode)
    return uint8_t(sign | int(std::nearbyint(a * float(1u << (Bias - 1 + M)))));
  uint32_t bits;
  std::memcpy(&bits, &a, 4);
  constexpr int kDrop = 23 - M;
  bits += (1u << (kDrop - 1)) - 1u + ((bits >> kDrop) & 1u);
  const uint32_t exp = (bits >> 23) - uint32_t(127 - Bias), mant = (bits >> kDrop) & ((1u << M) - 1u);
  return uint8_t(sign | (exp << M) | mant);
}

uint8_t f32_to_fp8_e4m3(float f) { return encode_fp8<3, 7>(f, 448.0f); }
uint8_t f32_to_fp8_e5m2(float f) { return encode_fp8<2, 15>(f, 57344.0f); }

void convert_to_f32(const void* src, DType t, float* dst, size_t n) {
  auto load = [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = float(s[i]);
  };
  const uint16_t* s16 = static_cast<const uint16_t*>(src);
  const uint8_t* s8 = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); break;
    case DType::BF16: for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s16[i]); break;
    case DType::F16: for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s16[i]); break;
    case DType::F8_E4M3: for (size_t i = 0; i < n; ++i) dst[i] = fp8_e4m3_to_f32(s8[i]); break;
    case DType::F8_E5M2: for (size_t i = 0; i < n; ++i) dst[i] = fp8_e5m2_to_f32(s8[i]); break;
    case DType::F64: load(double{}); break;
    case DType::I64: load(int64_t{}); break;
    case DType::I32: load(int32_t{}); break;
    case DType::I16: load(int16_t{}); break;
    case DType::I8: load(int8_t{}); break;
    case DType::U64: load(uint64_t{}); break;
    case DType::U32: load(uint32_t{}); break;
    case DType::U16: load(uint16_t{}); break;
    case DType::U8: case DType::BOOL: load(uint8_t{}); break;
  }
}

void convert_from_f32(const float* src, DType t, void* dst, size_t n) {
  uint16_t* d16 = static_cast<uint16_t*>(dst);
  uint8_t* d8 = static_cast<uint8_t*>(dst);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); break;
    case DType::BF16: for (size_t i = 0; i < n; ++i) d16[i] = f32_to_bf16(src[i]); break;
    case DType::F16: for (size_t i = 0; i < n; ++i) d16[i] = f32_to_f16(src[i]); break;
    case DType::F8_E4M3: for (size_t i = 0; i < n; ++i) d8[i] = f32_to_fp8_e4m3(src[i]); break;
    case DType::F8_E5M2: for (size_t i = 0; i < n; ++i) d8[i] = f32_to_fp8_e5m2(src[i]); break;
    default: fail("cannot convert f32 to {}", dtype_name(t));
  }
}

}  // namespace sala
