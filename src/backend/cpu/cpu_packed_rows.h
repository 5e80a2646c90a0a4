// The CPU backend's decode-sized product of packed weights (N ≤ 8 rows of x, or any N when
// batch-invariant): each weight row decoded to f32 and dotted with the x rows, with AVX2, FMA and
// F16C where the CPU has them. The scalar path in cpu_quant_matmul.cpp is what runs otherwise.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace sala::cpu {

// Row o of a packed weight in the canonical layout: its codes, and its groups' scales and biases
// (biases null for fp8).
struct PackedRow {
  const uint8_t* codes;
  const float* scales;
  const float* biases;
};
inline PackedRow packed_row(const Weight& w, int64_t o) {
  const int64_t in = w.in(), groups = in / w.group;
  return {static_cast<const uint8_t*>(w.w.data) + o * (w.format == WeightFormat::Q4 ? in / 2 : in),
          static_cast<const float*>(w.scales) + o * groups,
          w.biases ? static_cast<const float*>(w.biases) + o * groups : nullptr};
}

// Whether this CPU and weight take the SIMD rows; if not, packed_rows_simd_unfit says why (the
// caller shows it once; empty when they fit).
bool packed_rows_simd_fits(const Weight& w);
std::string packed_rows_simd_unfit(const Weight& w);

// Whether the SIMD rows read x in another order than its own: int4 columns in blocks of 16, the
// even ones first (the order a block's 8 code bytes decode in). packed_rows_x makes that copy of
// N rows of x (at stride ldx), as rows of w.in() floats; other formats read x as it is.
bool packed_rows_permute_x(const Weight& w);
std::vector<float> packed_rows_x(const Weight& w, const float* x, int64_t ldx, int64_t N);

// y[n·ldy + o] = Σ_j x[n][j]·w[o][j] for the rows [o0, o1) and N rows of x at stride ldx (in the
// order packed_rows_permute_x says). Each row's sum is taken in a fixed order that depends on in
// alone — the same bits whatever N, the rows or the threads around it. Requires
// packed_rows_simd_fits.
void packed_rows_simd(const Weight& w, const float* x, int64_t ldx, int64_t N, float* y, int64_t ldy, int64_t o0,
                      int64_t o1);

// Row o decoded to f32 in its natural column order (the prefill tiles that sgemm multiplies); the
// same values the SIMD rows multiply. Requires packed_rows_simd_fits.
void packed_row_decode_simd(const Weight& w, int64_t o, float* dst);

}  // namespace sala::cpu
