// The CPU backend's decode-sized product of packed weights (N ≤ 8 rows of x, or any N when
// batch-invariant): each weight row's codes dotted with the x rows, with AVX2, FMA and F16C where
// the CPU has them. The scalar path in cpu_quant_matmul.cpp is what runs otherwise.
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

// x as the SIMD rows read it: int4 columns in blocks of 16, the even ones first (the order a
// block's 8 code bytes decode in), a copy; other formats x in place. With Σx of each of its groups
// (formats with biases) for the bias terms.
struct PackedRowsX {
  const float* x;  // the caller's N rows of `in` floats at stride ldx
  int64_t ldx, N, in;
  std::vector<float> copy;        // int4: the permuted rows, `in` floats apart
  std::vector<float> group_sums;  // [N, groups]
  // Row n as the SIMD rows read it.
  const float* row(int64_t n) const { return copy.empty() ? x + n * ldx : copy.data() + n * in; }
};
PackedRowsX packed_rows_x(const Weight& w, const float* x, int64_t ldx, int64_t N);

// y[n·ldy + o] = Σ_j x[n][j]·w[o][j] for the rows [o0, o1). Each row's sum is taken in a fixed
// order that depends on the shape alone — the same bits whatever N, the rows or the threads
// around it. Requires packed_rows_simd_fits.
void packed_rows_simd(const Weight& w, const PackedRowsX& x, float* y, int64_t ldy, int64_t o0, int64_t o1);

// Row o decoded to f32 in its natural column order (the prefill tiles that sgemm multiplies):
// s·q + b by one FMA, fp8 s·e4m3. Requires packed_rows_simd_fits.
void packed_row_decode_simd(const Weight& w, int64_t o, float* dst);

}  // namespace sala::cpu
