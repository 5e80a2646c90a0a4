// AVX2 + FMA + F16C rows of packed weights (cpu_packed_rows.h), chosen at run time so that the
// build stays x86-64 baseline. A row is decoded into a thread's f32 buffer 8 or 16 weights per
// step, then dotted with each x row by four 8-lane FMA chains; with one x row the decoded weights
// go straight into the chains (fused_row: the same operations, no buffer).
//
// Why (bench/cpu_quant_gemv_bench.cpp, 4096×4096 from DRAM, two threads of an AMD EPYC): the
// scalar decode (s·q + b in double, one weight at a time) ran int4 at 2.8 G weights/s — no faster
// than the f32 matrix eight times its size — fp8 at 2.9 and int8 at 4.5; these rows 24, 20 and
// 22–24 (5–9×; a 9B int4 decode step 3.2 s → 0.39 s; bench/results/2026-11-27-cpu-packed-rows.md).
//
// Decoded values: int8 / int4 s·q + b by one fused multiply-add in f32 (one rounding; the scalar
// path's double evaluation rounds once too, so they agree wherever that sum is exact in double —
// every integer format and zero point; an MLX bias 2²¹ times smaller than s·q could differ in the
// last bit); fp8 as the e4m3 bits shifted into an f16 (e4m3·2⁻⁸, exact, subnormals included) times
// 256·s: the same product s·e4m3 rounded once, the scalar path's bits.
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

// The four chains' 32 partial sums in a fixed tree.
SALA_SIMD inline float sum_chains(__m256 c0, __m256 c1, __m256 c2, __m256 c3) {
  const __m256 c = _mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// Σ a[j]·b[j] in a fixed order: four 8-lane chains over blocks of 32, one over the last blocks of
// 8, a fixed tree across lanes, then the tail in order.
SALA_SIMD float dot(const float* a, const float* b, int64_t n) {
  __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), c0);
    c1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), c1);
    c2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 16), _mm256_loadu_ps(b + j + 16), c2);
    c3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 24), _mm256_loadu_ps(b + j + 24), c3);
  }
  for (; j + 8 <= n; j += 8) c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), c0);
  float s = sum_chains(c0, c1, c2, c3);
  for (; j < n; ++j) s = std::fma(a[j], b[j], s);
  return s;
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

// Row o of w as f32: NATURAL in column order, else in the order packed_rows_x puts x in (int4:
// each block of 16 columns evens then odds).
template <bool NATURAL>
SALA_SIMD void decode_row(const Weight& w, int64_t o, float* dst) {
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
          if constexpr (NATURAL) {  // lanes: lo = columns 0–3 | 8–11, hi = 4–7 | 12–15
            const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
            _mm256_storeu_ps(dst + j, _mm256_permute2f128_ps(lo, hi, 0x20));
            _mm256_storeu_ps(dst + j + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
          } else {
            _mm256_storeu_ps(dst + j, even);
            _mm256_storeu_ps(dst + j + 8, odd);
          }
        }
      }
      return;
    }
    case WeightFormat::Dense: break;
  }
}

// The 8 weights of row o at position j (a multiple of 8, in packed_rows_x's order), decoded
// exactly as decode_row does; s, b: their group's scale and bias (fp8: s only).
SALA_SIMD inline __m256 weights8(WeightFormat f, const uint8_t* row_codes, int64_t j, __m256 s, __m256 b) {
  if (f == WeightFormat::FP8) return _mm256_mul_ps(s, fp8x8_scaled(row_codes + j));
  if (f == WeightFormat::Q8) return _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(bytes8(row_codes + j)), b);
  const __m256i v = bytes8(row_codes + (j & ~int64_t(15)) / 2);  // Q4: evens at j % 16 = 0, odds at 8
  const __m256i q = (j & 8) ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(15));
  return _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(q), b);
}

// One row's sum for one x row without the row buffer: dot(xp, decode_row(o)) operation for
// operation — the same chains, tree and tail — so the same bits. Needs every 32-column block in
// one group (one group per row, or groups of a multiple of 32 columns).
SALA_SIMD float fused_row(const Weight& w, int64_t o, const float* xp) {
  const int64_t in = w.in(), G = w.group, groups = in / G;
  const WeightFormat f = w.format;
  const auto [codes, sc, bi] = packed_row(w, o);
  __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
  __m256 s, b;
  int64_t j = 0;
  // One loop over the row's 32-column blocks (a loop per group ran int4 g64/g128 ~30% slower).
  for (; j + 32 <= in; j += 32) {
    const int64_t g = groups == 1 ? 0 : j / G;
    s = _mm256_set1_ps(f == WeightFormat::FP8 ? sc[0] * 256.f : sc[g]), b = _mm256_set1_ps(bi ? bi[g] : 0.f);
    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + j), weights8(f, codes, j, s, b), c0);
    c1 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + j + 8), weights8(f, codes, j + 8, s, b), c1);
    c2 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + j + 16), weights8(f, codes, j + 16, s, b), c2);
    c3 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + j + 24), weights8(f, codes, j + 24, s, b), c3);
  }
  if (j + 8 <= in) {  // per-row formats only: one group
    s = _mm256_set1_ps(f == WeightFormat::FP8 ? sc[0] * 256.f : sc[0]), b = _mm256_set1_ps(bi ? bi[0] : 0.f);
    for (; j + 8 <= in; j += 8) c0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + j), weights8(f, codes, j, s, b), c0);
  }
  float sum = sum_chains(c0, c1, c2, c3);
  for (; j < in; ++j) {  // per-row fp8 / int8 only (int4 rows are whole blocks of 16)
    const float v = f == WeightFormat::FP8 ? sc[0] * fp8_e4m3_to_f32(codes[j]) : std::fma(sc[0], float(codes[j]), bi[0]);
    sum = std::fma(xp[j], v, sum);
  }
  return sum;
}

}  // namespace

bool packed_rows_simd_fits(const Weight& w) {
  return cpu_has_simd() && w.format != WeightFormat::Dense && (w.format != WeightFormat::Q4 || w.group % 16 == 0);
}

std::string packed_rows_simd_unfit(const Weight& w) {  // which condition of packed_rows_simd_fits fails
  if (packed_rows_simd_fits(w)) return {};
  if (!cpu_has_simd())
    return std::getenv("SALA_CPU_PACKED_SIMD") ? "SALA_CPU_PACKED_SIMD=0" : "this CPU lacks AVX2, FMA or F16C";
  if (w.format == WeightFormat::Dense) return "not a packed weight";
  return "int4 groups of " + std::to_string(w.group) + " columns (the SIMD rows take multiples of 16)";
}

bool packed_rows_permute_x(const Weight& w) { return w.format == WeightFormat::Q4; }

std::vector<float> packed_rows_x(const Weight& w, const float* x, int64_t ldx, int64_t N) {
  const int64_t in = w.in();
  std::vector<float> xp(size_t(N * in));
  for (int64_t n = 0; n < N; ++n) {
    const float* src = x + n * ldx;
    float* dst = xp.data() + n * in;
    for (int64_t j = 0; j < in; j += 16)
      for (int i = 0; i < 8; ++i) dst[j + i] = src[j + 2 * i], dst[j + 8 + i] = src[j + 2 * i + 1];
  }
  return xp;
}

SALA_SIMD void packed_rows_simd(const Weight& w, const float* xp, int64_t ldx, int64_t N, float* y, int64_t ldy,
                                int64_t o0, int64_t o1) {
  const int64_t in = w.in();
  if (N == 1 && (w.group == in || w.group % 32 == 0)) {  // the batch-1 step: no row buffer
    for (int64_t o = o0; o < o1; ++o) y[o] = fused_row(w, o, xp);
    return;
  }
  thread_local std::vector<float> row;
  row.resize(size_t(in));
  for (int64_t o = o0; o < o1; ++o) {
    decode_row<false>(w, o, row.data());
    for (int64_t n = 0; n < N; ++n) y[n * ldy + o] = dot(xp + n * ldx, row.data(), in);
  }
}

SALA_SIMD void packed_row_decode_simd(const Weight& w, int64_t o, float* dst) { decode_row<true>(w, o, dst); }

}  // namespace sala::cpu
