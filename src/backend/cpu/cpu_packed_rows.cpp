// AVX2 + FMA + F16C rows of packed weights (cpu_packed_rows.h), chosen at run time so that the
// build stays x86-64 baseline. A row's sum is factored as Σ_g s_g·Σ q·x + Σ_g b'_g·Σx: its codes
// are turned into f32 8 or 16 at a time and dotted with x by four 8-lane FMA chains per group,
// each group's sum scaled once, and the bias terms taken against Σx per group, computed once per
// x row. One x row reads the codes straight from the packed row; several decode the row's codes
// once into a buffer (the same values, the same operations: the same bits whatever N).
//
// Why (bench/cpu_quant_gemv_bench.cpp, 4096×4096 from DRAM, two threads of an AMD EPYC): the
// scalar decode (s·q + b in double, one weight at a time) ran int4 at 2.8 G weights/s — no faster
// than the f32 matrix eight times its size — fp8 at 2.9 and int8 at 4.5; rows that decoded each
// weight (s·q + b by one FMA) and then dotted it, 24, 20 and 22–24
// (bench/results/2026-11-27-cpu-packed-rows.md); factored — one FMA per weight instead of two —
// fp8 1.27×, int8 1.13×, int4 1.10–1.18× that (bench/results/2026-11-27-cpu-factored-rows.md).
//
// Rounding: the weight s·q + b is never rounded on its own; each group's Σ q·x is (exact codes
// times x, f32 sums), then its product with s. The codes are centred — int8 q − 128, int4 q − 8,
// the bias b' = b + centre·s — because with the raw codes the bias term b·Σx cancels most of Σ s·q·x
// when x has a mean: int4 g128 then erred by 9e-6 against 2e-7 with x of mean 1 and spread 1
// (centring int4 costs two integer operations per 16 codes; PackedMatmul.SimdRows… checks ≤ 1e-6).
#include "backend/cpu/cpu_packed_rows.h"

#include <immintrin.h>

#include <cmath>
#include <cstdlib>

#include "core/dtype.h"

namespace sala::cpu {

namespace {

bool cpu_has_simd() {
  static const bool ok = [] {
    const char* e = std::getenv("SALA_CPU_PACKED_SIMD");  // 0: the scalar rows (tests, A/B runs)
    if (e && *e == '0') return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }();
  return ok;
}

#define SALA_SIMD __attribute__((target("avx2,fma,f16c")))

// The 8 lanes' sum in a fixed tree.
SALA_SIMD inline float sum_lanes(__m256 c) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// 8 code bytes as 8 int32 lanes.
SALA_SIMD inline __m256i bytes8(const uint8_t* c) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
}

// 8 e4m3 codes as f32 times 2⁻⁸: each byte sign-extended and shifted into an f16's bits (sign at
// bit 15, the exponent and mantissa at 13..7; bit 14, a copy of the sign, cleared) — e4m3·2⁻⁸ exactly,
// subnormals included — then widened.
SALA_SIMD inline __m256 fp8x8_scaled(const uint8_t* c) {
  const __m128i v = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
  return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(v, 7), _mm_set1_epi16(int16_t(0xBF80))));
}

// The codes the rows multiply x by, as f32 (exact): int8 q − 128, int4 q − 8 (centred, above),
// fp8 e4m3·2⁻⁸. Int4 in x's order (packed_rows_x): each block of 16 columns evens then odds.
constexpr int kQ8Centre = 128, kQ4Centre = 8;

SALA_SIMD inline __m256 q8x8_centred(const uint8_t* c) {
  const __m128i v = _mm_xor_si128(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)), _mm_set1_epi8(char(0x80)));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

// Codes straight from the packed row (the one-row product).
struct PackedCodes {
  WeightFormat f;
  const uint8_t* c;
  // 8 codes at column j (a multiple of 8).
  SALA_SIMD __m256 at8(int64_t j) const {
    if (f == WeightFormat::FP8) return fp8x8_scaled(c + j);
    if (f == WeightFormat::Q8) return q8x8_centred(c + j);
    const __m256i v = bytes8(c + (j & ~int64_t(15)) / 2);
    const __m256i q = (j & 8) ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(kQ4Centre)));
  }
  // 32 codes at column j (a multiple of 16): int4 decodes its two blocks of 16 without testing j.
  SALA_SIMD void at32(int64_t j, __m256 q[4]) const {
    if (f != WeightFormat::Q4) {
      for (int i = 0; i < 4; ++i) q[i] = at8(j + 8 * i);
      return;
    }
    const __m256i v0 = bytes8(c + j / 2), v1 = bytes8(c + j / 2 + 8), low = _mm256_set1_epi32(15);
    const __m256i z = _mm256_set1_epi32(kQ4Centre);
    q[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v0, low), z));
    q[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v0, 4), z));
    q[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v1, low), z));
    q[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v1, 4), z));
  }
  float at1(int64_t j) const {  // per-row tails (fp8, int8)
    return f == WeightFormat::FP8 ? fp8_e4m3_to_f32(c[j]) * (1.f / 256.f) : float(int(c[j]) - kQ8Centre);
  }
};

// The same codes decoded once into a row buffer (several x rows): the same values.
struct BufferedCodes {
  const float* r;
  SALA_SIMD __m256 at8(int64_t j) const { return _mm256_loadu_ps(r + j); }
  SALA_SIMD void at32(int64_t j, __m256 q[4]) const {
    for (int i = 0; i < 4; ++i) q[i] = _mm256_loadu_ps(r + j + 8 * i);
  }
  float at1(int64_t j) const { return r[j]; }
};

SALA_SIMD void decode_codes(const Weight& w, int64_t o, float* dst) {
  const PackedCodes pc{w.format, packed_row(w, o).codes};
  const int64_t in = w.in();
  int64_t j = 0;
  if (w.format == WeightFormat::Q4)
    for (; j + 32 <= in; j += 32) {
      __m256 q[4];
      pc.at32(j, q);
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(dst + j + 8 * i, q[i]);
    }
  for (; j + 8 <= in; j += 8) _mm256_storeu_ps(dst + j, pc.at8(j));
  for (; j < in; ++j) dst[j] = pc.at1(j);
}

// One row's sum against one x row, factored: Σ_g s_g·(Σ_{j∈g} q_j·x_j) + Σ_g b'_g·(Σ_{j∈g} x_j),
// b' = b + centre·s the bias of the centred codes (fp8: none). Per group, four 8-lane FMA chains
// over blocks of 32 columns, one over the blocks of 8 left, their sum times s_g into one running
// vector; then a fixed tree across lanes, the per-row tail, and the bias terms in a fixed order —
// an order that depends on the shape alone, whichever codes source (same values) feeds it.
template <int64_t GC, class Codes>
SALA_SIMD float row_sum(const Weight& w, int64_t o, const float* x, const float* gsum, const Codes& codes) {
  const int64_t in = w.in(), G = GC ? GC : w.group, groups = in / G;
  const WeightFormat f = w.format;
  const auto [c, sc, bi] = packed_row(w, o);
  const float unit = f == WeightFormat::FP8 ? 256.f : 1.f;  // fp8 codes carry 2⁻⁸ (exact)
  __m256 total = _mm256_setzero_ps();
  int64_t j = 0;
  for (int64_t g = 0; g < groups; ++g) {
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    const int64_t end = j + G;
    for (; j + 32 <= end; j += 32) {
      __m256 q[4];
      codes.at32(j, q);
      c0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), q[0], c0);
      c1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j + 8), q[1], c1);
      c2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j + 16), q[2], c2);
      c3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j + 24), q[3], c3);
    }
    for (; j + 8 <= end; j += 8) c0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), codes.at8(j), c0);
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3));
    total = _mm256_fmadd_ps(_mm256_set1_ps(sc[g] * unit), sum, total);
  }
  float y = sum_lanes(total);
  if (j < in) {  // per-row fp8 / int8 only (int4 groups are whole blocks of 16)
    float t = 0.f;
    for (; j < in; ++j) t = std::fma(x[j], codes.at1(j), t);
    y = std::fma(sc[0] * unit, t, y);
  }
  if (bi) {
    const float centre = float(f == WeightFormat::Q8 ? kQ8Centre : kQ4Centre);
    __m256 bt = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
      const __m256 b = _mm256_fmadd_ps(_mm256_set1_ps(centre), _mm256_loadu_ps(sc + g), _mm256_loadu_ps(bi + g));
      bt = _mm256_fmadd_ps(b, _mm256_loadu_ps(gsum + g), bt);
    }
    float bs = sum_lanes(bt);
    for (; g < groups; ++g) bs = std::fma(std::fma(centre, sc[g], bi[g]), gsum[g], bs);
    y += bs;
  }
  return y;
}

// GC: the group's columns when known at compile time (0: w.group).
template <int64_t GC>
SALA_SIMD void rows(const Weight& w, const PackedRowsX& x, const float* gs, float* y, int64_t ldy, int64_t o0,
                    int64_t o1) {
  const int64_t in = w.in(), groups = in / w.group;
  if (x.N == 1) {  // the batch-1 step: codes straight from the packed row
    for (int64_t o = o0; o < o1; ++o) y[o] = row_sum<GC>(w, o, x.row(0), gs, PackedCodes{w.format, packed_row(w, o).codes});
    return;
  }
  thread_local std::vector<float> row;
  row.resize(size_t(in));
  for (int64_t o = o0; o < o1; ++o) {
    decode_codes(w, o, row.data());
    for (int64_t n = 0; n < x.N; ++n)
      y[n * ldy + o] = row_sum<GC>(w, o, x.row(n), gs ? gs + n * groups : nullptr, BufferedCodes{row.data()});
  }
}

// The group sizes the rows take: whole blocks of 16 columns for int4 (8 code bytes), of 8 for
// grouped 8-bit weights, any length for per-row ones (their tail is summed one by one).
int64_t group_multiple(const Weight& w) {
  if (w.format == WeightFormat::Q4) return 16;
  return w.group == w.in() ? 1 : 8;
}

}  // namespace

bool packed_rows_simd_fits(const Weight& w) {
  return cpu_has_simd() && w.format != WeightFormat::Dense && w.group % group_multiple(w) == 0;
}

std::string packed_rows_simd_unfit(const Weight& w) {  // which condition of packed_rows_simd_fits fails
  if (packed_rows_simd_fits(w)) return {};
  if (!cpu_has_simd())
    return std::getenv("SALA_CPU_PACKED_SIMD") ? "SALA_CPU_PACKED_SIMD=0" : "this CPU lacks AVX2, FMA or F16C";
  if (w.format == WeightFormat::Dense) return "not a packed weight";
  return "groups of " + std::to_string(w.group) + " columns (the SIMD rows take multiples of " +
         std::to_string(group_multiple(w)) + ")";
}

PackedRowsX packed_rows_x(const Weight& w, const float* x, int64_t ldx, int64_t N) {
  const int64_t in = w.in(), G = w.group, groups = in / G;
  PackedRowsX r{x, ldx, N, in, {}, {}};
  if (w.format == WeightFormat::Q4) {  // each block of 16 columns: evens, then odds
    r.copy.resize(size_t(N * in));
    for (int64_t n = 0; n < N; ++n) {
      const float* src = x + n * ldx;
      float* dst = r.copy.data() + n * in;
      for (int64_t j = 0; j < in; j += 16)
        for (int i = 0; i < 8; ++i) dst[j + i] = src[j + 2 * i], dst[j + 8 + i] = src[j + 2 * i + 1];
    }
  }
  if (w.biases) {  // Σx per group, in column order
    r.group_sums.resize(size_t(N * groups));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        float t = 0.f;
        for (int64_t j = g * G; j < (g + 1) * G; ++j) t += x[n * ldx + j];
        r.group_sums[size_t(n * groups + g)] = t;
      }
  }
  return r;
}

SALA_SIMD void packed_rows_simd(const Weight& w, const PackedRowsX& x, float* y, int64_t ldy, int64_t o0, int64_t o1) {
  const float* gs = x.group_sums.empty() ? nullptr : x.group_sums.data();
  // The common group sizes with their block loops unrolled (int4 g64 ran 6% slower than the
  // per-weight decode without).
  if (w.group == 64) return rows<64>(w, x, gs, y, ldy, o0, o1);
  if (w.group == 128) return rows<128>(w, x, gs, y, ldy, o0, o1);
  rows<0>(w, x, gs, y, ldy, o0, o1);
}

SALA_SIMD void packed_row_decode_simd(const Weight& w, int64_t o, float* dst) {
  const int64_t in = w.in(), G = w.group, groups = in / G;
  const auto [c, sc, bi] = packed_row(w, o);
  switch (w.format) {
    case WeightFormat::FP8: {
      const float s = sc[0];
      const __m256 s256 = _mm256_set1_ps(s * 256.f);  // exact: a power of two
      int64_t j = 0;
      for (; j + 8 <= in; j += 8) _mm256_storeu_ps(dst + j, _mm256_mul_ps(s256, fp8x8_scaled(c + j)));
      for (; j < in; ++j) dst[j] = s * fp8_e4m3_to_f32(c[j]);
      return;
    }
    case WeightFormat::Q8: {
      for (int64_t g = 0; g < groups; ++g) {
        const __m256 s = _mm256_set1_ps(sc[g]), b = _mm256_set1_ps(bi[g]);
        int64_t j = g * G;
        const int64_t end = (g + 1) * G;
        for (; j + 8 <= end; j += 8) _mm256_storeu_ps(dst + j, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(bytes8(c + j)), b));
        for (; j < end; ++j) dst[j] = std::fma(sc[g], float(c[j]), bi[g]);
      }
      return;
    }
    case WeightFormat::Q4: {  // groups of 16k columns: a block of 16 is 8 bytes, evens then odds
      const __m256i low = _mm256_set1_epi32(15);
      for (int64_t g = 0; g < groups; ++g) {
        const __m256 s = _mm256_set1_ps(sc[g]), b = _mm256_set1_ps(bi[g]);
        for (int64_t j = g * G; j < (g + 1) * G; j += 16) {
          const __m256i v = bytes8(c + j / 2);
          const __m256 even = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_and_si256(v, low)), b);
          const __m256 odd = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), b);
          // lanes: lo = columns 0–3 | 8–11, hi = 4–7 | 12–15
          const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
          _mm256_storeu_ps(dst + j, _mm256_permute2f128_ps(lo, hi, 0x20));
          _mm256_storeu_ps(dst + j + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
        }
      }
      return;
    }
    case WeightFormat::Dense: break;
  }
}

}  // namespace sala::cpu
