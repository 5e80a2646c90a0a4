// CPU backend: packed weights (docs/quantization.md). They stay in the canonical layout of
// QuantMatrixView (codes row-major, f32 scales/biases per group) and matmul decodes them on the
// fly: decode (N ≤ kRowDotMax) takes each output row's N dot products from its codes (with
// AVX2/FMA/F16C where the CPU has them: cpu_packed_rows.cpp; otherwise here, decoding the row into
// a per-thread f32 row one weight at a time); prefill decodes blocks of rows into a bounded f32
// tile and hands each tile to sgemm. No dequantized copy of a whole matrix is ever kept.
//
// Decoded values equal dequantize_views' within f32 rounding: here w = s·q + b is evaluated in
// double and rounded once, which is exact for the integer formats (b = −z·s with z = 128 or 8 is
// exact, so s·q + b = s·(q − z) exactly) and one rounding for zero points and MLX biases; the
// SIMD tile decode's f32 FMA rounds the same exact sum once.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dot.h"
#include "backend/cpu/cpu_packed_rows.h"
#include "backend/quant_layout.h"
#include "core/dtype.h"
#include "core/error.h"

#ifdef SALA_HAS_OPENBLAS
#include <cblas.h>
#endif

namespace sala {

namespace {

constexpr int64_t kRowDotMax = 8;            // at most this many rows: per-row dot products
constexpr int64_t kTileFloats = int64_t(1) << 20;  // prefill tile: 4 MiB of decoded rows

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int c = 0; c < 256; ++c) a[size_t(c)] = fp8_e4m3_to_f32(uint8_t(c));
    return a;
  }();
  return t;
}

// W8A8: the scale of an activation row, max|x| / qmax (1 for an all-zero row; the CUDA kernels'
// rule, IEEE division).
float row_scale(const float* x, int64_t n, float qmax) {
  float amax = 0.f;
  for (int64_t k = 0; k < n; ++k) amax = std::max(amax, std::fabs(x[k]));
  return amax > 0.f ? amax / qmax : 1.f;
}

// Row o of a packed weight as f32 values.
void decode_row(const Weight& w, int64_t o, float* dst) {
  const int64_t in = w.in(), G = w.group, groups = in / G;
  const auto [c, sc, bi] = cpu::packed_row(w, o);
  switch (w.format) {
    case WeightFormat::FP8: {
      const auto& t = fp8_table();
      const float s = sc[0];
      for (int64_t j = 0; j < in; ++j) dst[j] = s * t[c[j]];
      return;
    }
    case WeightFormat::Q8: {
      for (int64_t g = 0; g < groups; ++g) {
        const double s = sc[g], b = bi[g];
        for (int64_t j = g * G; j < (g + 1) * G; ++j) dst[j] = float(s * double(c[j]) + b);
      }
      return;
    }
    case WeightFormat::Q4: {
      for (int64_t g = 0; g < groups; ++g) {
        const double s = sc[g], b = bi[g];
        for (int64_t j = g * G; j < (g + 1) * G; j += 2) {
          const uint8_t v = c[j / 2];
          dst[j] = float(s * double(v & 0xf) + b);
          dst[j + 1] = float(s * double(v >> 4) + b);
        }
      }
      return;
    }
    case WeightFormat::Dense: break;
  }
  fail("cpu matmul: weight format {} is not packed", weight_format_name(w.format));
}

}  // namespace

Weight CpuBackend::load_quantized_weight(const QuantMatrixView& q, const std::string& name) {
  q.validate(name);
  const size_t code_bytes = (q.code_bytes() + 63) / 64 * 64, np = size_t(q.rows * q.groups());
  const size_t bytes = code_bytes + np * 4 * (q.biases.empty() ? 1 : 2);
  Weight w;
  w.storage = alloc(bytes);
  auto* base = static_cast<uint8_t*>(w.storage->data());
  std::memcpy(base, q.codes.data(), q.code_bytes());
  float* sc = reinterpret_cast<float*>(base + code_bytes);
  std::copy(q.scales.begin(), q.scales.end(), sc);
  if (!q.biases.empty()) std::copy(q.biases.begin(), q.biases.end(), sc + np);
  if (q.group < q.cols)  // grouped: the f16 values every backend multiplies by (backend.h)
    for (size_t i = 0; i < np * (q.biases.empty() ? 1 : 2); ++i) sc[i] = qlayout::group_param(sc[i]);
  w.w = Mat{base, DType::U8, q.rows, q.cols};
  w.format = q.format;
  w.group = q.group;
  w.scales = sc;
  w.biases = q.biases.empty() ? nullptr : sc + np;
  w.packed_bytes = q.code_bytes() + np * 4 * (q.biases.empty() ? 1 : 2);
  if (!cpu::packed_rows_simd_fits(w)) {
    static std::once_flag noted;
    std::call_once(noted, [&] {
      std::fprintf(stderr, "note: cpu: %s: packed products decode one weight at a time (%s): expect slower decode\n",
                   name.c_str(), cpu::packed_rows_simd_unfit(w).c_str());
    });
  }
  return w;
}

void CpuBackend::matmul_packed(const Mat& x, const Weight& w, Mat y) {
  SALA_CHECK(x.dtype == DType::F32 && y.dtype == DType::F32, "cpu matmul: x and y must be f32 (got {}, {})",
             dtype_name(x.dtype), dtype_name(y.dtype));
  const int64_t N = x.rows, out = w.out(), in = w.in();
  if (fp8_prefill_ && w.format == WeightFormat::FP8 && N >= kW8A8PrefillMinRows) return matmul_fp8_activations(x, w, y);
  if (int8_prefill_ && (w.format == WeightFormat::Q8 || w.format == WeightFormat::Q4) && N >= kW8A8PrefillMinRows)
    return matmul_int8_activations(x, w, y);
  const float* a = static_cast<const float*>(x.data);
  float* c = static_cast<float*>(y.data);
  bool rows_dot = N <= kRowDotMax || batch_invariant_;  // batch-invariant: no sgemm (cpu_backend.h)
#ifndef SALA_HAS_OPENBLAS
  rows_dot = true;  // no sgemm: the per-row loop at every N
#endif
  const bool simd = cpu::packed_rows_simd_fits(w);
  if (rows_dot && simd) {  // x prepared 64 rows at a time: int4's permuted copy stays small at any N
    for (int64_t n0 = 0; n0 < N; n0 += 64) {
      const cpu::PackedRowsX xr = cpu::packed_rows_x(w, a + n0 * x.cols, x.cols, std::min<int64_t>(64, N - n0));
      pool_.parallel_for(out, [&](int64_t o0, int64_t o1) {
        cpu::packed_rows_simd(w, xr, c + n0 * y.cols, y.cols, o0, o1);
      });
    }
    return;
  }
  if (rows_dot) {
    pool_.parallel_for(out, [&](int64_t o0, int64_t o1) {
      std::vector<float> row(static_cast<size_t>(in));
      for (int64_t o = o0; o < o1; ++o) {
        decode_row(w, o, row.data());
        for (int64_t n = 0; n < N; ++n) c[n * y.cols + o] = cpu::dot(a + n * x.cols, row.data(), in);
      }
    });
    return;
  }
#ifdef SALA_HAS_OPENBLAS
  // Prefill: decode a block of rows (threads), multiply it (OpenBLAS threads), next block.
  const int64_t block = std::clamp<int64_t>(kTileFloats / in, 16, out);
  std::vector<float> tile(static_cast<size_t>(block * in));
  for (int64_t o0 = 0; o0 < out; o0 += block) {
    const int64_t nb = std::min(block, out - o0);
    pool_.parallel_for(nb, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if (simd)
          cpu::packed_row_decode_simd(w, o0 + r, tile.data() + r * in);
        else
          decode_row(w, o0 + r, tile.data() + r * in);
      }
    });
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(nb), int(in), 1.0f, a, int(x.cols), tile.data(),
                int(in), 0.0f, c + o0, int(y.cols));
  }
#endif
}

// --fp8-prefill (W8A8): each row of x quantized to e4m3 with its own scale s_x = max|x| / 448
// (round to nearest even of x / s_x, as the CUDA kernel and cuBLASLt's fp8 inputs), then
// y[n, o] = (Σ_k q_x[n, k]·q_w[o, k]) · s_x[n] · s_w[o] with the e4m3 values exact in f32.
void CpuBackend::matmul_fp8_activations(const Mat& x, const Weight& w, Mat y) {
  const int64_t N = x.rows, out = w.out(), in = w.in();
  SALA_CHECK(w.group == in, "cpu fp8 prefill: FP8 weight with {} groups per row (expected one scale per row)",
             in / w.group);
  const auto& t = fp8_table();
  const float* a = static_cast<const float*>(x.data);
  std::vector<float> xq(static_cast<size_t>(N * in)), sx(static_cast<size_t>(N));
  pool_.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* xr = a + n * x.cols;
      const float s = row_scale(xr, in, 448.f);
      sx[size_t(n)] = s;
      for (int64_t k = 0; k < in; ++k) xq[size_t(n * in + k)] = t[f32_to_fp8_e4m3(xr[k] / s)];
    }
  });
  const auto* codes = static_cast<const uint8_t*>(w.w.data);
  const float* sw = static_cast<const float*>(w.scales);
  float* c = static_cast<float*>(y.data);
#ifdef SALA_HAS_OPENBLAS
  if (!batch_invariant_) {  // blocks of unscaled rows through sgemm, then the two scales
    const int64_t block = std::clamp<int64_t>(kTileFloats / in, 16, out);
    std::vector<float> tile(static_cast<size_t>(block * in));
    for (int64_t o0 = 0; o0 < out; o0 += block) {
      const int64_t nb = std::min(block, out - o0);
      pool_.parallel_for(nb, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k = 0; k < in; ++k) tile[size_t(r * in + k)] = t[codes[(o0 + r) * in + k]];
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(nb), int(in), 1.0f, xq.data(), int(in),
                  tile.data(), int(in), 0.0f, c + o0, int(y.cols));
    }
    pool_.parallel_for(N, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t o = 0; o < out; ++o) c[n * y.cols + o] = c[n * y.cols + o] * sx[size_t(n)] * sw[o];
    });
    return;
  }
#endif
  pool_.parallel_for(out, [&](int64_t o0, int64_t o1) {
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t k = 0; k < in; ++k) row[size_t(k)] = t[codes[o * in + k]];
      for (int64_t n = 0; n < N; ++n)
        c[n * y.cols + o] = cpu::dot(xq.data() + n * in, row.data(), in) * sx[size_t(n)] * sw[o];
    }
  });
}

// --int8-prefill (W8A8 int8): each row of x quantized to int8 with s_x = max|x| / 127 (1 for an
// all-zero row) and q = round-to-nearest-even(x / s_x) — the CUDA kernel's rounding, in IEEE f32.
// The weight rows as int8 with one scale s_o and offset c_o each (w ≈ s_o·q_w + c_o):
//   per-row Q8: q_w = code − 128 exactly, c = 128·s + b (zero for symmetric rows);
//   Q4 and grouped Q8: requantized — the row as the bf16 values the weight-only prefill multiplies
//   (bf16(fma(s, code, b)) per group), then int8 like an activation row (s_o = max|w| / 127), c = 0.
// Then exact int32 sums acc = Σ_k q_x·q_w and
//   y[n, o] = fma(c_o, s_x[n]·Σ_k q_x[n, k], (acc·s_o)·s_x[n])
// in f32, the CUDA epilogue's order, so the two backends agree bit for bit.
void CpuBackend::matmul_int8_activations(const Mat& x, const Weight& w, Mat y) {
  const int64_t N = x.rows, out = w.out(), in = w.in(), G = w.group;
  SALA_CHECK((w.format == WeightFormat::Q8 || w.format == WeightFormat::Q4) && w.biases,
             "cpu int8 prefill: weight format {} (expected int8 or int4)", weight_format_name(w.format));
  const bool exact = w.format == WeightFormat::Q8 && G == in;
  const float* a = static_cast<const float*>(x.data);
  std::vector<int8_t> xq(static_cast<size_t>(N * in));
  std::vector<float> sx(static_cast<size_t>(N)), sxsum(static_cast<size_t>(N));
  const auto quantize_row = [](const float* v, int64_t n, float s, int8_t* q) {
    int64_t sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      const float r = std::clamp(std::nearbyint(v[k] / s), -127.f, 127.f);
      q[k] = int8_t(r);
      sum += int64_t(r);
    }
    return sum;
  };
  pool_.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* xr = a + n * x.cols;
      const float s = row_scale(xr, in, 127.f);
      sx[size_t(n)] = s;
      sxsum[size_t(n)] = s * float(quantize_row(xr, in, s, xq.data() + n * in));
    }
  });
  const auto* codes = static_cast<const uint8_t*>(w.w.data);
  const float* sw = static_cast<const float*>(w.scales);
  const float* bw = static_cast<const float*>(w.biases);
  float* c = static_cast<float*>(y.data);
  pool_.parallel_for(out, [&](int64_t o0, int64_t o1) {
    std::vector<int8_t> row(static_cast<size_t>(in));
    std::vector<float> vals(static_cast<size_t>(in));
    for (int64_t o = o0; o < o1; ++o) {
      float so = sw[o], co = 0.f;
      if (exact) {
        for (int64_t k = 0; k < in; ++k) row[size_t(k)] = int8_t(int(codes[o * in + k]) - 128);
        co = std::fma(128.f, sw[o], bw[o]);  // one rounding; 0 for symmetric rows
      } else {
        for (int64_t k = 0; k < in; ++k) {
          const int64_t g = o * (in / G) + k / G;
          const int code = w.format == WeightFormat::Q4 ? (codes[(o * in + k) / 2] >> (4 * (k & 1))) & 0xf
                                                        : codes[o * in + k];
          vals[size_t(k)] = round_bf16(std::fma(sw[g], float(code), bw[g]));
        }
        so = row_scale(vals.data(), in, 127.f);
        quantize_row(vals.data(), in, so, row.data());
      }
      for (int64_t n = 0; n < N; ++n) {
        const int8_t* q = xq.data() + n * in;
        int32_t acc = 0;
        for (int64_t k = 0; k < in; ++k) acc += int32_t(q[k]) * int32_t(row[size_t(k)]);
        c[n * y.cols + o] = std::fma(co, sxsum[size_t(n)], (float(acc) * so) * sx[size_t(n)]);
      }
    }
  });
}

}  // namespace sala
