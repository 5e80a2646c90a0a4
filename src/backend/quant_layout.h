// Packed weight layouts shared by the backends (docs/quantization.md, "Formats in memory"), the
// host side of the CUDA tile layout, and the bit tricks its kernels decode codes with. Plain C++
// (no CUDA headers): the unit tests check the tile layout and the decoders on the host.
//
// Canonical (host, CPU backend) layout: see QuantMatrixView in backend.h.
//
// CUDA tile layout. The decode GEMV (quant_gemv.cu) feeds codes to bf16 mma.sync.m16n8k16 with the
// weight as the A operand: a warp owns 16 output rows; per mma, lane L (g = L/4, t = L%4)
// supplies rows g and g+8 at four k positions. Inside one mma the k order is free as long as x
// uses the same one, so lane t takes the 4 consecutive columns k0 + 4t .. k0 + 4t + 3 of the
// mma's 16 (k0 = 16·j); x is then one 8-byte load per lane. The codes are reordered at load so
// that each lane's codes for a run of mmas are one 16-byte piece:
//   rows padded to a multiple of 16, columns to a multiple of KT; tile (rb, kt) = rows
//   16·rb .. 16·rb + 15 × columns KT·kt .. KT·kt + KT − 1 = 512 bytes at (rb·ktiles + kt)·512;
//   lane L's 16 bytes at 16·L = four 32-bit words.
//   8-bit (FP8, Q8; KT = 32, 2 mmas): word 2j = row g columns c0..c3 of mma j (byte i = c_i),
//     word 2j + 1 = row g + 8.
//   4-bit (Q4; KT = 64, 4 mmas): word j = mma j; nibble ν (bits 4ν..4ν+3) holds row g + 8·r8,
//     column c, with ν = r8 + 2·(c >> 1) + 4·(c & 1). Then (word >> 4p) & 0x000F000F puts the
//     bf16 A-fragment register p (a0: row g c0,c1; a1: row g+8 c0,c1; a2: row g c2,c3; a3: row
//     g+8 c2,c3) into the two halves, one lop3 from bf16 values.
// Every mma's 16 columns lie in one group when group % 16 == 0 (required for grouped formats).
// Scales and biases: {s(row g), b(row g), s(row g+8), b(row g+8)} at ((rb · groups + gi) · 8 + g),
//   padded rows s = b = 0: per-row weights (group = cols) as f32 (a float4, 16 bytes), grouped
//   ones (group < cols) as f16 (8 bytes). Why f16: int4 in groups of 128 with f32 parameters
//   spends 0.0625 of its 0.5625 bytes per weight on them; in f16 0.03125 — 5.6% fewer bytes for
//   a decode bound by them (in groups of 64: 10%), the layout MLX stores. The backends therefore
//   multiply by the f16-rounded values (group_param, shared with the CPU backend).
// Zero-packed (Q4 in groups whose every bias is −s·z, z an integer 0..15, and whose f16 scales
//   end in four zero mantissa bits — what `sala quantize --format int4` writes with zero points:
//   scales of 7 significant bits): {s(row g) | z, s(row g+8) | z} as two f16 words whose low 4 bits
//   hold z (4 bytes per entry, the same index). The bias is −s·z again, exact in f32 (7 × 4
//   significant bits), so the products are those of the 8-byte form bit for bit, from 0.515625
//   bytes per weight in groups of 128 instead of 0.53125 (groups of 64: 0.53125 against 0.5625).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

#ifndef SALA_HD
#if defined(__CUDACC__)
#define SALA_HD __host__ __device__
#else
#define SALA_HD
#endif
#endif

namespace sala::qlayout {

// Format numbers as the kernels see them (WeightFormat::FP8/Q8/Q4 = 1/2/3).
enum Fmt : int { kFP8 = 1, kQ8 = 2, kQ4 = 3 };

SALA_HD constexpr int bits_of(int fmt) { return fmt == kQ4 ? 4 : 8; }
SALA_HD constexpr int tile_k(int fmt) { return fmt == kQ4 ? 64 : 32; }
// How a grouped matrix's groups lie in its tiles, which picks the decode GEMV's compiled path
// (quant_gemv.cu's TG; the loader notes the generic one): 1 every tile inside one group (group %
// tile_k == 0), 2 two groups per tile (4-bit in groups of 32), 0 any other grouping (the generic
// kernel). Per-row weights (group == cols) are told apart by the caller.
SALA_HD constexpr int tile_groups(int fmt, int64_t group) {
  return group % tile_k(fmt) == 0 ? 1 : fmt == kQ4 && 2 * group == tile_k(fmt) ? 2 : 0;
}
constexpr int kTileBytes = 512;

struct TileGeom {
  int fmt = kQ4;
  int64_t rows = 0, cols = 0, group = 0;  // group = cols: one per row
  bool zpack = false;                     // grouped Q4: zero points packed into the scales (above)
  SALA_HD int64_t row_blocks() const { return (rows + 15) / 16; }
  SALA_HD int64_t ktiles() const { return (cols + tile_k(fmt) - 1) / tile_k(fmt); }
  SALA_HD int64_t groups() const { return cols / group; }
  SALA_HD int64_t code_bytes() const { return row_blocks() * ktiles() * kTileBytes; }
  SALA_HD bool grouped() const { return group < cols; }  // f16 parameters (else one f32 set per row)
  SALA_HD int entry_bytes() const { return !grouped() ? 16 : zpack ? 4 : 8; }  // one (rb, gi, g) entry
  SALA_HD int64_t param_bytes() const { return row_blocks() * groups() * 8 * entry_bytes(); }
};

// A grouped weight's scale or bias as the backends hold it: rounded to f16 (the tile layout's
// storage; the CPU backend keeps the rounded value in f32, so both multiply by the same numbers).
inline float group_param(float v) { return f16_to_f32(f32_to_f16(v)); }

// Zero-packed entries: an f16 scale with z in its low 4 bits (s·z fits f16's 11 significant bits).
constexpr uint16_t kZeroBits = 0xf;

// A positive int4 scale as `sala quantize` stores it: rounded up to 7 significant bits (below
// f16's normal range, to a multiple of 2^-20), so that its f16 ends in four zero bits and s·z,
// z ≤ 15, is exact in f16.
inline float int4_scale_7_bits(float s) {
  int e;
  const float m = std::frexp(s, &e);  // s = m · 2^e, m in [0.5, 1)
  s = std::ldexp(std::ceil(m * 128.f) / 128.f, e);
  return s < 0x1p-14f ? std::ceil(s * 0x1p20f) * 0x1p-20f : s;
}

// Whether a grouped Q4 weight's parameters ([rows, groups] scales and biases, f16-rounded as
// group_param holds them) take the zero-packed form: every scale an f16 with four zero low
// mantissa bits (or 0) and every bias exactly −s·z for an integer z in 0..15.
inline bool zero_pack_fits(int fmt, int64_t n, const float* scales, const float* biases) {
  if (fmt != kQ4 || !biases) return false;
  for (int64_t i = 0; i < n; ++i) {
    const float s = group_param(scales[i]), b = group_param(biases[i]);
    if (f32_to_f16(s) & kZeroBits) return false;
    const float z = s != 0.f ? -b / s : 0.f;
    if (!(z >= 0.f && z <= 15.f) || z != std::nearbyint(z) || -s * z != b) return false;
  }
  return true;
}

// A zero-packed entry's half: the scale's f16 bits with z below them.
inline uint16_t zero_packed_half(float s, float b) {
  const float z = s != 0.f ? -group_param(b) / group_param(s) : 0.f;
  return uint16_t(f32_to_f16(s) | uint16_t(z));
}
// And back: {s, b = −s·z}.
inline void zero_unpacked(uint16_t h, float* s, float* b) {
  *s = f16_to_f32(uint16_t(h & ~kZeroBits));
  *b = -*s * float(h & kZeroBits);
}

// Where (row, k) lives in the tile layout: byte offset and bit shift (0 or 4 for 4-bit).
SALA_HD inline void code_slot(const TileGeom& g, int64_t row, int64_t k, int64_t* byte, int* shift) {
  const int64_t rb = row / 16, r = row % 16, kt = k / tile_k(g.fmt), kk = k % tile_k(g.fmt);
  const int j = int(kk / 16), t = int(kk % 16) / 4, c = int(kk % 4);
  const int lane = int(r % 8) * 4 + t, r8 = int(r / 8);
  const int64_t base = (rb * g.ktiles() + kt) * kTileBytes + lane * 16;
  if (g.fmt == kQ4) {
    const int nu = r8 + 2 * (c >> 1) + 4 * (c & 1);
    *byte = base + j * 4 + nu / 2;
    *shift = (nu % 2) * 4;
  } else {
    *byte = base + (2 * j + r8) * 4 + c;
    *shift = 0;
  }
}

// Reorders canonical codes (row-major; Q4 two per byte, element 2j low nibble) into the tile
// layout; dst has g.code_bytes() bytes, padding becomes zero.
inline void tile_codes(const TileGeom& g, const uint8_t* src, uint8_t* dst) {
  std::memset(dst, 0, size_t(g.code_bytes()));
  const int64_t row_bytes = g.fmt == kQ4 ? g.cols / 2 : g.cols;
  for (int64_t r = 0; r < g.rows; ++r)
    for (int64_t k = 0; k < g.cols; ++k) {
      const uint8_t b = src[r * row_bytes + (g.fmt == kQ4 ? k / 2 : k)];
      const unsigned v = g.fmt == kQ4 ? (k & 1 ? b >> 4 : b & 0xf) : b;
      int64_t at;
      int shift;
      code_slot(g, r, k, &at, &shift);
      dst[at] = uint8_t(dst[at] | (v << shift));
    }
}

// Index of the {s, b, s, b} set of (row block rb, group gi, lane group lg) in the parameter tiles
// (16 bytes each per row, 8 grouped).
inline int64_t param_index(const TileGeom& g, int64_t rb, int64_t gi, int lg) {
  return (rb * g.groups() + gi) * 8 + lg;
}

// Interleaves scales/biases ([rows, groups], biases may be null = 0) into the parameter tiles
// (dst: g.param_bytes() bytes): f32 per row, f16 (rounded to nearest even) for grouped weights,
// zero-packed where g.zpack (zero_pack_fits must hold).
inline void tile_params(const TileGeom& g, const float* scales, const float* biases, uint8_t* dst) {
  std::memset(dst, 0, size_t(g.param_bytes()));
  const int64_t G = g.groups();
  for (int64_t r = 0; r < g.rows; ++r)
    for (int64_t gi = 0; gi < G; ++gi) {
      const int64_t rr = r % 16, slot = param_index(g, r / 16, gi, int(rr % 8)) * 4 + (rr / 8) * 2;
      const float s = scales[r * G + gi], b = biases ? biases[r * G + gi] : 0.f;
      if (g.zpack) {
        const uint16_t h = zero_packed_half(s, b);
        std::memcpy(dst + slot, &h, 2);  // 4-byte entries: slot is the byte offset
      } else if (g.grouped()) {
        const uint16_t h[2] = {f32_to_f16(s), f32_to_f16(b)};
        std::memcpy(dst + slot * 2, h, 4);
      } else {
        const float f[2] = {s, b};
        std::memcpy(dst + slot * 4, f, 8);
      }
    }
}

// {s(row g), b(row g), s(row g + 8), b(row g + 8)} of (row block rb, group gi, lane group g) from
// the parameter tiles, as f32 (host emulation and tests).
inline void param_at(const TileGeom& g, const uint8_t* tiles, int64_t rb, int64_t gi, int lg, float out[4]) {
  const int64_t slot = param_index(g, rb, gi, lg) * 4;
  if (g.zpack) {
    uint16_t h[2];
    std::memcpy(h, tiles + slot, 4);
    zero_unpacked(h[0], &out[0], &out[1]);
    zero_unpacked(h[1], &out[2], &out[3]);
  } else if (g.grouped()) {
    uint16_t h[4];
    std::memcpy(h, tiles + slot * 2, 8);
    for (int i = 0; i < 4; ++i) out[i] = f16_to_f32(h[i]);
  } else {
    std::memcpy(out, tiles + slot * 4, 16);
  }
}

// ---- decoders (integer bit tricks; identical on host and device) ----

SALA_HD inline float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Q4: A-fragment register p (0..3) of a tile word: two bf16 values 128 + q (exact: bf16 has 8
// significant bits). The kernel removes the 128 with the bias: s·Σx(128+q) + (b − 128·s)·Σx.
SALA_HD inline uint32_t q4_bf16x2(uint32_t word, int p) { return ((word >> (4 * p)) & 0x000F000Fu) | 0x43004300u; }

// Q8: byte i of a word, less `zero` (an integer below 2^23: 128 decodes symmetric int8), as an
// exact f32 (2^23 + q − (2^23 + zero): one subtraction).
SALA_HD inline float q8_f32(uint32_t word, int i, float zero = 0.f) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7440u | unsigned(i))) - (8388608.f + zero);
#else
  return bits_to_float(0x4B000000u | ((word >> (8 * i)) & 0xffu)) - (8388608.f + zero);
#endif
}

// FP8: bytes 2h, 2h+1 of a word as two f16 values e4m3(q)·2^-8 (exact, subnormals included):
// the e4m3 bits shifted into an f16's exponent/mantissa fields (biases 7 vs 15). The kernels
// multiply by 256 with the scale. Codes 0x7f/0xff (NaN) are rejected at load.
SALA_HD inline uint32_t fp8_f16x2(uint32_t word, int h) {
#if defined(__CUDA_ARCH__)
  const uint32_t t = __byte_perm(word, 0u, h ? 0x3424u : 0x1404u);  // byte 2h -> bits 8..15, 2h+1 -> 24..31
#else
  const uint32_t t = (((word >> (16 * h)) & 0xffu) << 8) | (((word >> (16 * h + 8)) & 0xffu) << 24);
#endif
  return (t & 0x80008000u) | ((t >> 1) & 0x3F803F80u);
}

// ---- random packed weights (benchmarks) ----

// Scale and bias that give codes drawn uniformly a mean of ~0 and a standard deviation of ~std.
// FP8: uniform over the 254 finite codes; returns the row scale (bias 0).
inline void random_params(int fmt, float std, float* scale, float* bias) {
  if (fmt == kFP8) {
    double ss = 0;
    int n = 0;
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;
      const int e = (c >> 3) & 15, m = c & 7;
      const double v = e ? std::ldexp(1.0 + m / 8.0, e - 7) : std::ldexp(m / 8.0, -6);
      ss += v * v, ++n;
    }
    *scale = float(std / std::sqrt(ss / n));
    *bias = 0.f;
    return;
  }
  const double L = fmt == kQ4 ? 16 : 256;
  *scale = float(std * std::sqrt(12.0 / (L * L - 1)));
  // Q8 as `sala quantize --format int8` writes it (symmetric: codes q + 128, bias −128·s); Q4 affine.
  *bias = fmt == kQ8 ? -128.f * *scale : float(-*scale * (L - 1) / 2);
}

}  // namespace sala::qlayout
