// Element types of the safetensors format and conversions between them and f32.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace sala {

enum class DType : uint8_t { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, U8, BOOL };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling, e.g. "BF16"
DType parse_dtype(std::string_view name);  // throws sala::Error on an unknown name
bool dtype_is_float(DType t);

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

// Rounds an f32 value through bf16 and back (the reference's rounding points).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float f);
float fp8_e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f);  // saturating, round to nearest even
float fp8_e5m2_to_f32(uint8_t v);
uint8_t f32_to_fp8_e5m2(float f);

// Converts n elements of any float dtype (or integer dtype) to f32.
void convert_to_f32(const void* src, DType t, float* dst, size_t n);
// Converts n f32 values to a float dtype (F32, F16, BF16, F8_*).
void convert_from_f32(const float* src, DType t, void* dst, size_t n);

}  // namespace sala
