// Packed weights (docs/quantization.md "Formats in memory"): the CPU packed matmul against the
// matmul of the dequantized f32 weight for every format, the canonical conversion of checkpoint
// formats, random packed weights, load errors, the CUDA tile layout emulated on the host (the
// decode GEMV's fragments, decoders and group flushes, without a GPU), and whole models: a
// quantized checkpoint loads packed and gives the logits of its dequantized copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>
#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_packed_rows.h"
#include "backend/quant_layout.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/replay.h"
#include "io/safetensors.h"
#include "model/loader.h"
#include "model/presets.h"
#include "model/quant.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"

using namespace sala;
namespace fs = std::filesystem;

namespace {

struct Format {
  const char* name;
  QuantFormat format;
  int group;
  bool zero_points;
  int bits;
};

std::vector<float> randn(size_t n, uint64_t seed, float std = 1.f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std * normal01(seed, i);
  return v;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += double(a[i] - ref[i]) * double(a[i] - ref[i]);
    den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

std::vector<float> cpu_matmul(CpuBackend& b, const Weight& w, const std::vector<float>& x, int64_t n) {
  auto xb = b.alloc(size_t(n * w.in()) * 4), yb = b.alloc(size_t(n * w.out()) * 4);
  Mat xm = xb->mat(DType::F32, n, w.in()), ym = yb->mat(DType::F32, n, w.out());
  b.upload(xm, x.data());
  b.matmul(xm, w, ym);
  std::vector<float> y(size_t(n * w.out()));
  b.download(ym, y.data());
  return y;
}

}  // namespace

// Every checkpoint format, shapes with odd group counts and rows, decode (N ≤ 8: per-row dot
// products) and prefill (N > 8: decoded tiles through sgemm) sizes.
TEST(PackedMatmul, EqualsDequantizedWeightEveryFormat) {
  CpuBackend b(2);
  const Format formats[] = {
      {"fp8", QuantFormat::FP8, 0, false, 4},        {"int8", QuantFormat::INT8, 0, false, 4},
      {"int4 g64 sym", QuantFormat::INT4, 64, false, 4}, {"int4 g32 zp", QuantFormat::INT4, 32, true, 4},
      {"mlx4 g64", QuantFormat::MLX, 64, false, 4},  {"mlx8 g32", QuantFormat::MLX, 32, false, 8},
  };
  struct Shape2 {
    int64_t out, in;
  };
  const Shape2 shapes[] = {{17, 192}, {64, 64}, {1, 320}, {40, 96}};
  int checked = 0;
  for (const Format& f : formats)
    for (const Shape2& s : shapes) {
      if (f.group && s.in % f.group) continue;
      const auto w = randn(size_t(s.out * s.in), 17 + uint64_t(s.in), 0.05f);
      const QuantizedMatrix q = quantize_matrix(w.data(), s.out, s.in, f.format, f.group, f.zero_points, f.bits);
      std::vector<float> deq(w.size());
      dequantize_matrix(q, deq.data());
      const Weight dense = b.load_weight(TensorView{deq.data(), DType::F32, {s.out, s.in}});
      const PackedMatrix pm = pack_matrix(q);
      const Weight packed = b.load_quantized_weight(pm.view(), f.name);
      ASSERT_TRUE(packed.packed());
      EXPECT_LT(packed.nbytes(), dense.nbytes() / 2);
      for (int64_t n : {1, 2, 8, 9, 33}) {
        const auto x = randn(size_t(n * s.in), 99 + uint64_t(n));
        const double e = rel_err(cpu_matmul(b, packed, x, n), cpu_matmul(b, dense, x, n));
        EXPECT_LT(e, 1e-6) << f.name << " N=" << n << " [" << s.out << ", " << s.in << "]";
        ++checked;
      }
    }
  EXPECT_GE(checked, 80);
}

// --fp8-prefill (W8A8): from 65 rows on, FP8 products quantize each activation row to e4m3 with
// s = max|x| / 448 and scale the fp8 dot products by s·s_w. Checked against a scalar reference
// written here (sums in double), on both CPU paths (sgemm tiles, batch-invariant dots); fewer
// rows and other formats are untouched by the switch.
TEST(PackedMatmul, Fp8PrefillQuantizesActivationsPerRow) {
  const int64_t out = 48, in = 160;
  const auto w = randn(size_t(out * in), 71, 0.05f);
  const QuantizedMatrix q = quantize_matrix(w.data(), out, in, QuantFormat::FP8, 0, false, 4);
  const QuantizedMatrix q8 = quantize_matrix(w.data(), out, in, QuantFormat::INT8, 0, false, 4);
  for (bool invariant : {false, true}) {
    CpuBackend b(2, invariant);
    const Weight packed = b.load_quantized_weight(pack_matrix(q).view(), "fp8");
    const Weight packed8 = b.load_quantized_weight(pack_matrix(q8).view(), "int8");
    for (int64_t n : {int64_t(64), kW8A8PrefillMinRows, int64_t(100)}) {
      auto x = randn(size_t(n * in), 5 + uint64_t(n));
      for (int64_t k = 0; k < in; ++k) x[size_t(3 * in + k)] = 0.f;  // an all-zero row: scale 1, output 0
      for (int64_t k = 0; k < in; ++k) x[size_t(5 * in + k)] *= 1e-3f;  // rows of very different ranges
      b.set_fp8_prefill(false);
      const auto weight_only = cpu_matmul(b, packed, x, n), int8_off = cpu_matmul(b, packed8, x, n);
      b.set_fp8_prefill(true);
      const auto got = cpu_matmul(b, packed, x, n);
      EXPECT_EQ(cpu_matmul(b, packed8, x, n), int8_off) << "int8 weights are not affected";
      if (n < kW8A8PrefillMinRows) {
        EXPECT_EQ(got, weight_only) << "N=" << n << ": below the threshold the product stays weight-only";
        continue;
      }
      std::vector<float> ref(size_t(n * out));
      for (int64_t r = 0; r < n; ++r) {
        float amax = 0.f;
        for (int64_t k = 0; k < in; ++k) amax = std::max(amax, std::fabs(x[size_t(r * in + k)]));
        const float sx = amax > 0.f ? amax / 448.f : 1.f;
        for (int64_t o = 0; o < out; ++o) {
          double acc = 0;
          for (int64_t k = 0; k < in; ++k)
            acc += double(fp8_e4m3_to_f32(f32_to_fp8_e4m3(x[size_t(r * in + k)] / sx))) *
                   double(fp8_e4m3_to_f32(q.data[size_t(o * in + k)]));
          ref[size_t(r * out + o)] = float(acc * sx * q.scales[size_t(o)]);
        }
      }
      EXPECT_LT(rel_err(got, ref), 1e-6) << "N=" << n << " invariant=" << invariant;
      for (int64_t o = 0; o < out; ++o) EXPECT_EQ(got[size_t(3 * out + o)], 0.f);
      // Activation rounding (3 mantissa bits) is visible against the weight-only product, and small.
      const double e = rel_err(got, weight_only);
      EXPECT_GT(e, 1e-3) << "N=" << n;
      EXPECT_LT(e, 0.05) << "N=" << n;
    }
  }
}

// --int8-prefill (W8A8 int8): from 65 rows on, int8 and int4 products quantize each activation
// row to int8 with s = max|x| / 127 (round to nearest even) and multiply exactly. Checked against
// a scalar reference written here (sums in double): per-row int8 weights as they are (s·code + b,
// symmetric or affine rows); int4 and grouped int8 weights requantized per row — each row as the
// bf16 values bf16(fma(s, code, b)) of the weight-only prefill, then int8 with max|w| / 127. Fewer
// rows and fp8 weights are untouched by the switch.
TEST(PackedMatmul, Int8PrefillQuantizesActivationsPerRow) {
  const int64_t out = 40, in = 192;
  const auto w = randn(size_t(out * in), 73, 0.05f);
  const QuantizedMatrix sym = quantize_matrix(w.data(), out, in, QuantFormat::INT8, 0, false, 4);
  const QuantizedMatrix mlx = quantize_matrix(w.data(), out, in, QuantFormat::MLX, 64, false, 8);
  const QuantizedMatrix q4 = quantize_matrix(w.data(), out, in, QuantFormat::INT4, 64, true, 4);
  const QuantizedMatrix fp8 = quantize_matrix(w.data(), out, in, QuantFormat::FP8, 0, false, 4);
  PackedMatrix affine = pack_matrix(sym);  // per-row Q8 with biases that are not −128·s
  for (int64_t o = 0; o < out; ++o) affine.biases[size_t(o)] = -120.f * affine.scales[size_t(o)] + 0.01f * float(o % 5);
  // The weight rows the product uses, as doubles: exact codes, or the requantized bf16 row.
  auto weight_rows = [&](const PackedMatrix& pm) {
    std::vector<double> rows(size_t(out * in));
    const int64_t G = pm.group, groups = in / G;
    for (int64_t o = 0; o < out; ++o) {
      std::vector<float> v(static_cast<size_t>(in));
      for (int64_t k = 0; k < in; ++k) {
        const int code = pm.format == WeightFormat::Q4 ? (pm.codes[size_t((o * in + k) / 2)] >> (4 * (k & 1))) & 0xf
                                                       : pm.codes[size_t(o * in + k)];
        const float s = pm.scales[size_t(o * groups + k / G)], b = pm.biases[size_t(o * groups + k / G)];
        if (pm.format == WeightFormat::Q8 && G == in) rows[size_t(o * in + k)] = double(s) * code + double(b);
        else v[size_t(k)] = round_bf16(std::fma(s, float(code), b));
      }
      if (pm.format == WeightFormat::Q8 && G == in) continue;
      float amax = 0.f;
      for (float f : v) amax = std::max(amax, std::fabs(f));
      const float so = amax > 0.f ? amax / 127.f : 1.f;
      for (int64_t k = 0; k < in; ++k)
        rows[size_t(o * in + k)] = std::clamp(std::nearbyint(double(v[size_t(k)] / so)), -127.0, 127.0) * double(so);
    }
    return rows;
  };
  const PackedMatrix packs[] = {pack_matrix(sym), affine, pack_matrix(mlx), pack_matrix(q4)};
  const char* names[] = {"int8 symmetric", "int8 affine", "int8 grouped (MLX)", "int4 g64"};
  for (bool invariant : {false, true}) {
    CpuBackend b(2, invariant);
    const Weight w_fp8 = b.load_quantized_weight(pack_matrix(fp8).view(), "fp8");
    for (int64_t n : {int64_t(64), kW8A8PrefillMinRows, int64_t(90)}) {
      auto x = randn(size_t(n * in), 9 + uint64_t(n));
      for (int64_t k = 0; k < in; ++k) x[size_t(2 * in + k)] = 0.f;     // an all-zero row: scale 1, output 0
      for (int64_t k = 0; k < in; ++k) x[size_t(4 * in + k)] *= 1e-3f;  // rows of very different ranges
      b.set_int8_prefill(false);
      const auto fp8_off = cpu_matmul(b, w_fp8, x, n);
      b.set_int8_prefill(true);
      EXPECT_EQ(cpu_matmul(b, w_fp8, x, n), fp8_off) << "fp8 weights are not affected";
      for (size_t p = 0; p < std::size(packs); ++p) {
        const Weight wt = b.load_quantized_weight(packs[p].view(), names[p]);
        b.set_int8_prefill(false);
        const auto off = cpu_matmul(b, wt, x, n);
        b.set_int8_prefill(true);
        const auto got = cpu_matmul(b, wt, x, n);
        if (n < kW8A8PrefillMinRows) {
          EXPECT_EQ(got, off) << names[p] << " N=" << n << ": below the threshold the product stays weight-only";
          continue;
        }
        const auto rows = weight_rows(packs[p]);
        std::vector<float> ref(size_t(n * out));
        for (int64_t r = 0; r < n; ++r) {
          float amax = 0.f;
          for (int64_t k = 0; k < in; ++k) amax = std::max(amax, std::fabs(x[size_t(r * in + k)]));
          const float sx = amax > 0.f ? amax / 127.f : 1.f;
          for (int64_t o = 0; o < out; ++o) {
            double acc = 0;
            for (int64_t k = 0; k < in; ++k)
              acc += std::clamp(std::nearbyint(double(x[size_t(r * in + k)] / sx)), -127.0, 127.0) *
                     rows[size_t(o * in + k)];
            ref[size_t(r * out + o)] = float(acc * sx);
          }
        }
        EXPECT_LT(rel_err(got, ref), 1e-6) << names[p] << " N=" << n << " invariant=" << invariant;
        for (int64_t o = 0; o < out; ++o) EXPECT_EQ(got[size_t(2 * out + o)], 0.f);
        // Activation rounding (int8 per row) is visible against the weight-only product, and small.
        const double e = rel_err(got, off);
        EXPECT_GT(e, 1e-4) << names[p] << " N=" << n;
        EXPECT_LT(e, 0.03) << names[p] << " N=" << n;
      }
    }
  }
}

// The canonical form decodes to the reference dequantization value by value (within f32 rounding).
TEST(PackedMatmul, CanonicalMappingMatchesDequantize) {
  CpuBackend b(1);
  const auto w = randn(8 * 64, 5, 0.3f);
  for (const Format& f : {Format{"int8", QuantFormat::INT8, 0, false, 4}, Format{"int4 sym", QuantFormat::INT4, 16, false, 4},
                          Format{"int4 zp", QuantFormat::INT4, 16, true, 4}, Format{"mlx8", QuantFormat::MLX, 16, false, 8}}) {
    const QuantizedMatrix q = quantize_matrix(w.data(), 8, 64, f.format, f.group, f.zero_points, f.bits);
    std::vector<float> deq(w.size());
    dequantize_matrix(q, deq.data());
    const Weight packed = b.load_quantized_weight(pack_matrix(q).view(), f.name);
    // Multiplying by the identity reads the decoded weight back, column by column.
    std::vector<float> eye(64 * 64, 0.f);
    for (int i = 0; i < 64; ++i) eye[size_t(i * 64 + i)] = 1.f;
    const auto y = cpu_matmul(b, packed, eye, 64);  // y[i, o] = W[o, i]
    for (int64_t o = 0; o < 8; ++o) {
      float rowmax = 0;
      for (int64_t i = 0; i < 64; ++i) rowmax = std::max(rowmax, std::fabs(deq[size_t(o * 64 + i)]));
      for (int64_t i = 0; i < 64; ++i) {
        // f32 rounding of the group's range (zero points: b = −s·z is rounded once)
        const float ref = deq[size_t(o * 64 + i)], got = y[size_t(i * 8 + o)];
        ASSERT_NEAR(got, ref, 4.8e-7f * rowmax) << f.name << " w[" << o << ", " << i << "]";
        if (f.format == QuantFormat::INT8 || (f.format == QuantFormat::INT4 && !f.zero_points))
          ASSERT_EQ(got, ref) << f.name << ": b = -z·s is exact, so is the value";
      }
    }
  }
}

// The decode-sized rows with AVX2/FMA/F16C (cpu_packed_rows.cpp): against sums in double of the
// dequantized weight (≤ 1e-6 relative, for x with and without a mean), and the one-row kernel (no
// row buffer) bit for bit the rows of 2..8-row products — batch invariance. Shapes with tails (per-row fp8 / int8 at 36 and 200 columns), int4
// in groups of 16, 32, 48, 64 and 128 (16 and 48 through the row buffer at every N), MLX 8-bit g32.
TEST(PackedMatmul, SimdRowsMatchDoubleSumsAndAreBatchInvariant) {
  CpuBackend b(2);
  {
    const QuantizedMatrix q = quantize_matrix(randn(64, 1).data(), 1, 64, QuantFormat::INT8, 0, false, 8);
    const std::string why = cpu::packed_rows_simd_unfit(b.load_quantized_weight(pack_matrix(q).view(), "probe"));
    if (!why.empty()) GTEST_SKIP() << "no SIMD rows here: " << why;
  }
  struct Case {
    Format f;
    int64_t out, in;
  };
  const Case cases[] = {
      {{"fp8", QuantFormat::FP8, 0, false, 4}, 17, 36},          {{"fp8", QuantFormat::FP8, 0, false, 4}, 33, 200},
      {{"int8", QuantFormat::INT8, 0, false, 4}, 17, 36},        {{"int8", QuantFormat::INT8, 0, false, 4}, 40, 4096},
      {{"int4 g16", QuantFormat::INT4, 16, true, 4}, 9, 96},     {{"int4 g32", QuantFormat::INT4, 32, true, 4}, 21, 224},
      {{"int4 g48", QuantFormat::INT4, 48, true, 4}, 9, 144},    {{"int4 g64 sym", QuantFormat::INT4, 64, false, 4}, 30, 512},
      {{"int4 g128", QuantFormat::INT4, 128, true, 4}, 40, 4096}, {{"mlx8 g32", QuantFormat::MLX, 32, false, 8}, 12, 160},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.f.name << " [" << c.out << ", " << c.in << "]");
    const auto w = randn(size_t(c.out * c.in), 41 + uint64_t(c.in), 0.05f);
    const QuantizedMatrix q = quantize_matrix(w.data(), c.out, c.in, c.f.format, c.f.group, c.f.zero_points, c.f.bits);
    const Weight packed = b.load_quantized_weight(pack_matrix(q).view(), c.f.name);
    ASSERT_EQ(cpu::packed_rows_simd_unfit(packed), "");
    // The weight as the backend holds it (group parameters rounded to f16), read back through the
    // prefill path (decoded tiles through sgemm): 64 identity rows at a time.
    std::vector<float> deq(size_t(c.out * c.in));
    for (int64_t i0 = 0; i0 < c.in; i0 += 64) {
      const int64_t k = std::min<int64_t>(64, c.in - i0), rows = std::max<int64_t>(k, 9);  // ≥ 9: not the SIMD rows
      std::vector<float> eye(size_t(rows * c.in), 0.f);
      for (int64_t i = 0; i < k; ++i) eye[size_t(i * c.in + i0 + i)] = 1.f;
      const auto cols = cpu_matmul(b, packed, eye, rows);
      for (int64_t i = 0; i < k; ++i)
        for (int64_t o = 0; o < c.out; ++o) deq[size_t(o * c.in + i0 + i)] = cols[size_t(i * c.out + o)];
    }
    const int64_t N = 8;
    // x centred and with a mean as large as its spread (the factored rows' bias term, b·Σx, then
    // cancels most of Σ s·q·x unless the codes are centred).
    for (const float mean : {0.f, 1.f}) {
      SCOPED_TRACE(testing::Message() << "x mean " << mean);
      auto x = randn(size_t(N * c.in), 7 + uint64_t(c.out));
      for (float& v : x) v += mean;
      const auto y8 = cpu_matmul(b, packed, x, N);
      double num = 0, den = 0;
      for (int64_t n = 0; n < N; ++n) {
        const std::vector<float> xn(x.begin() + n * c.in, x.begin() + (n + 1) * c.in);
        const auto y1 = cpu_matmul(b, packed, xn, 1);
        const auto y3 = cpu_matmul(b, packed, std::vector<float>(x.begin() + n * c.in, x.begin() + std::min(n + 3, N) * c.in),
                                   std::min<int64_t>(3, N - n));
        for (int64_t o = 0; o < c.out; ++o) {
          const float got = y8[size_t(n * c.out + o)];
          ASSERT_EQ(got, y1[size_t(o)]) << "row " << o << " of x row " << n << ": 1-row product differs from 8-row";
          ASSERT_EQ(got, y3[size_t(o)]) << "row " << o << " of x row " << n << ": 3-row product differs from 8-row";
          double ref = 0;
          for (int64_t j = 0; j < c.in; ++j) ref += double(xn[size_t(j)]) * double(deq[size_t(o * c.in + j)]);
          num += (double(got) - ref) * (double(got) - ref), den += ref * ref;
        }
      }
      EXPECT_LT(std::sqrt(num / den), 1e-6);
    }
  }
}

TEST(PackedMatmul, RandomQuantizedWeightsHaveTheRequestedSpread) {
  CpuBackend b(2);
  const int64_t out = 64, in = 256;
  const auto x = randn(size_t(4 * in), 3);
  for (WeightFormat f : {WeightFormat::FP8, WeightFormat::Q8, WeightFormat::Q4}) {
    const Weight w = b.random_quantized_weight(f, out, in, f == WeightFormat::Q4 ? 64 : in, 0.02f, 7);
    ASSERT_EQ(w.format, f);
    const auto y = cpu_matmul(b, w, x, 4);
    double ss = 0, mean = 0;
    for (float v : y) ss += double(v) * v, mean += v;
    const double sd = std::sqrt(ss / double(y.size())), expect = 0.02 * std::sqrt(double(in));
    EXPECT_GT(sd, 0.6 * expect) << weight_format_name(f);
    EXPECT_LT(sd, 1.5 * expect) << weight_format_name(f);
    EXPECT_LT(std::fabs(mean / double(y.size())), 0.3 * expect) << weight_format_name(f);
  }
}

TEST(PackedMatmul, LoadErrorsNameTheTensor) {
  CpuBackend b(1);
  auto err = [&](const QuantMatrixView& q) {
    try {
      b.load_quantized_weight(q, "layers.3.mlp.up_proj.weight");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  std::vector<uint8_t> codes(4 * 64, 0x11);
  std::vector<float> s(4, 1.f), bias(4, 0.f);
  QuantMatrixView q{WeightFormat::Q8, 4, 64, 64, codes, s, bias};
  EXPECT_EQ(err(q), "(loaded)");
  q.codes = std::span<const uint8_t>(codes).first(100);
  EXPECT_NE(err(q).find("layers.3.mlp.up_proj.weight: q8 codes hold 100 bytes, expected 256"), std::string::npos)
      << err(q);
  q.codes = codes;
  q.group = 48;
  EXPECT_NE(err(q).find("group size 48 does not divide the 64"), std::string::npos) << err(q);
  codes[70] = 0x7f;
  QuantMatrixView f8{WeightFormat::FP8, 4, 64, 64, codes, s, {}};
  EXPECT_NE(err(f8).find("fp8 code 0x7f (NaN) at row 1, column 6"), std::string::npos) << err(f8);
}

// ---- the CUDA tile layout, emulated on the host ----

namespace {

using namespace sala::qlayout;

// PTX mma.m16n8k16 (bf16 in, f32 accumulate) on fragments: A[lane][4], B[lane][2], C[lane][4].
void mma_emulate(float C[32][4], const uint32_t A[32][4], const uint32_t B[32][2]) {
  float a[16][16], bm[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h) a[g + 8 * (i % 2)][2 * t + h + 8 * (i / 2)] = bf16_to_f32(uint16_t(A[lane][i] >> (16 * h)));
    for (int i = 0; i < 2; ++i)
      for (int h = 0; h < 2; ++h) bm[2 * t + h + 8 * i][g] = bf16_to_f32(uint16_t(B[lane][i] >> (16 * h)));
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), n = 2 * t + i % 2;
      float s = 0;
      for (int k = 0; k < 16; ++k) s += a[row][k] * bm[k][n];
      C[lane][i] += s;
    }
  }
}

uint32_t pack2(float lo, float hi) { return uint32_t(f32_to_bf16(lo)) | uint32_t(f32_to_bf16(hi)) << 16; }
uint32_t f16x2_to_bf16x2(uint32_t h) { return pack2(f16_to_f32(uint16_t(h)), f16_to_f32(uint16_t(h >> 16))); }

// decode_a of quant_gemv.cu.
void decode_a(int fmt, const uint32_t c[4], int j, uint32_t a[4]) {
  if (fmt == kQ4) {
    for (int p = 0; p < 4; ++p) a[p] = q4_bf16x2(c[j], p);
  } else if (fmt == kQ8) {
    const uint32_t wg = c[2 * j], wg8 = c[2 * j + 1];
    a[0] = pack2(q8_f32(wg, 0), q8_f32(wg, 1));
    a[1] = pack2(q8_f32(wg8, 0), q8_f32(wg8, 1));
    a[2] = pack2(q8_f32(wg, 2), q8_f32(wg, 3));
    a[3] = pack2(q8_f32(wg8, 2), q8_f32(wg8, 3));
  } else {
    const uint32_t wg = c[2 * j], wg8 = c[2 * j + 1];
    a[0] = f16x2_to_bf16x2(fp8_f16x2(wg, 0));
    a[1] = f16x2_to_bf16x2(fp8_f16x2(wg8, 0));
    a[2] = f16x2_to_bf16x2(fp8_f16x2(wg, 1));
    a[3] = f16x2_to_bf16x2(fp8_f16x2(wg8, 1));
  }
}

// qgemv_kernel of quant_gemv.cu, warp by warp and lane by lane (kU tiles per iteration).
std::vector<float> emulate_qgemv(const QuantMatrixView& q, const std::vector<float>& x, int N, int W) {
  const int fmt = int(q.format), KT = tile_k(fmt), MT = KT / 16, kU = 4;
  // The parameter form the CUDA backend picks (zero-packed where it fits).
  const bool zpack = q.group < q.cols && zero_pack_fits(fmt, int64_t(q.scales.size()), q.scales.data(),
                                                        q.biases.empty() ? nullptr : q.biases.data());
  const TileGeom geo{fmt, q.rows, q.cols, q.group, zpack};
  std::vector<uint8_t> tiles(size_t(geo.code_bytes()));
  tile_codes(geo, q.codes.data(), tiles.data());
  std::vector<uint8_t> params(size_t(geo.param_bytes()));
  tile_params(geo, q.scales.data(), q.biases.empty() ? nullptr : q.biases.data(), params.data());
  const int64_t in = q.cols, G = q.group, ktiles = geo.ktiles(), groups = geo.groups();
  const bool per_row = G == in, tile_group = !per_row && G % KT == 0, bias = fmt != kFP8;
  std::vector<float> y(size_t(N * q.rows), 0.f);
  for (int64_t rb = 0; rb < geo.row_blocks(); ++rb) {
    std::vector<float> red(size_t(16 * 8), 0.f);
    for (int warp = 0; warp < W; ++warp) {
      float cf[32][4] = {}, cq[32][4] = {}, cx[32][4] = {};
      auto flush = [&](int64_t gi) {
        for (int lane = 0; lane < 32; ++lane) {
          float p[4];
          param_at(geo, params.data(), rb, gi, lane / 4, p);
          float s0 = p[0], b0 = p[1], s1 = p[2], b1 = p[3];
          if (fmt == kFP8) s0 *= 256.f, s1 *= 256.f;
          if (fmt == kQ4) b0 = std::fma(-128.f, s0, b0), b1 = std::fma(-128.f, s1, b1);
          const float s[4] = {s0, s0, s1, s1}, bb[4] = {b0, b0, b1, b1};
          for (int i = 0; i < 4; ++i) {
            cf[lane][i] = std::fma(s[i], cq[lane][i], cf[lane][i]);
            if (bias) cf[lane][i] = std::fma(bb[i], cx[lane][i], cf[lane][i]);
            cq[lane][i] = cx[lane][i] = 0.f;
          }
        }
      };
      for (int64_t kt = warp; kt < ktiles; kt += int64_t(W) * kU)
        for (int u = 0; u < kU; ++u) {
          const int64_t k = kt + u * W;
          if (k >= ktiles) break;
          for (int j = 0; j < MT; ++j) {
            const int64_t k0 = k * KT + 16 * j;
            if (k0 >= in) break;
            uint32_t A[32][4], B[32][2], ones[32][4];
            for (int lane = 0; lane < 32; ++lane) {
              const int g = lane / 4, t = lane % 4;
              uint32_t c[4];
              std::memcpy(c, &tiles[size_t(((rb * ktiles + k) * 32 + lane) * 16)], 16);
              decode_a(fmt, c, j, A[lane]);
              for (auto& o : ones[lane]) o = 0x3F803F80u;
              B[lane][0] = B[lane][1] = 0;
              if (g < N && k0 + 4 * t < in) {
                const float* xr = &x[size_t(g * in + k0 + 4 * t)];
                B[lane][0] = pack2(xr[0], xr[1]);
                B[lane][1] = pack2(xr[2], xr[3]);
              }
            }
            mma_emulate(cq, A, B);
            if (bias) mma_emulate(cx, ones, B);
            if (!per_row && !tile_group && ((k0 + 16) % G == 0 || j == MT - 1)) flush(k0 / G);
          }
          if (tile_group) flush(k * KT / G);
        }
      if (per_row) flush(0);
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        red[size_t(g * 8 + 2 * t)] += cf[lane][0];
        red[size_t(g * 8 + 2 * t + 1)] += cf[lane][1];
        red[size_t((g + 8) * 8 + 2 * t)] += cf[lane][2];
        red[size_t((g + 8) * 8 + 2 * t + 1)] += cf[lane][3];
      }
    }
    for (int row = 0; row < 16; ++row)
      for (int n = 0; n < N; ++n)
        if (rb * 16 + row < q.rows) y[size_t(n * q.rows + rb * 16 + row)] = red[size_t(row * 8 + n)];
  }
  return y;
}

}  // namespace

TEST(QuantTileLayout, CodeSlotsAreABijection) {
  for (int fmt : {kFP8, kQ4}) {
    const TileGeom g{fmt, 40, 192, 64};
    std::vector<int> seen(size_t(g.code_bytes()) * 2, 0);
    for (int64_t r = 0; r < 48; ++r)  // padded rows too
      for (int64_t k = 0; k < g.ktiles() * tile_k(fmt); ++k) {
        int64_t at;
        int shift;
        code_slot(g, r, k, &at, &shift);
        ASSERT_LT(at, g.code_bytes());
        seen[size_t(at * 2 + shift / 4)]++;
      }
    for (size_t i = 0; i < seen.size(); ++i)
      if (fmt == kQ4 || i % 2 == 0) ASSERT_EQ(seen[i], 1) << "fmt " << fmt << " slot " << i;
  }
}

TEST(QuantTileLayout, DecodersAreExact) {
  for (uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const uint32_t h = fp8_f16x2(c | (c << 8) | (c << 16) | (c << 24), 1);
    EXPECT_EQ(f16_to_f32(uint16_t(h)) * 256.f, fp8_e4m3_to_f32(uint8_t(c))) << c;
    EXPECT_EQ(f16_to_f32(uint16_t(h >> 16)) * 256.f, fp8_e4m3_to_f32(uint8_t(c))) << c;
    EXPECT_EQ(q8_f32(c << 16, 2), float(c));
  }
  for (uint32_t v = 0; v < 16; ++v)
    for (int p = 0; p < 4; ++p) {
      const uint32_t r = q4_bf16x2((v << (4 * p)) | ((15 - v) << (4 * p + 16)), p);
      EXPECT_EQ(bf16_to_f32(uint16_t(r)), 128.f + float(v));
      EXPECT_EQ(bf16_to_f32(uint16_t(r >> 16)), 128.f + float(15 - v));
    }
}

// Zero-packed parameters (int4 as `sala quantize` writes it, with zero points or symmetric): chosen
// exactly where every bias is −s·z, half the bytes, and the same values as the 8-byte form.
TEST(QuantTileLayout, ZeroPackedParams) {
  const auto w = randn(size_t(40 * 256), 5, 0.05f);
  for (const auto& [group, zero_points] : {std::pair{64, true}, std::pair{128, true}, std::pair{64, false}}) {
    const PackedMatrix pm =
        pack_matrix(quantize_matrix(w.data(), 40, 256, QuantFormat::INT4, group, zero_points, 4));
    const int64_t n = int64_t(pm.scales.size());
    ASSERT_TRUE(zero_pack_fits(kQ4, n, pm.scales.data(), pm.biases.data())) << group;
    const TileGeom wide{kQ4, 40, 256, group}, packed{kQ4, 40, 256, group, true};
    EXPECT_EQ(packed.param_bytes() * 2, wide.param_bytes());
    std::vector<uint8_t> pw(size_t(wide.param_bytes())), pp(size_t(packed.param_bytes()));
    tile_params(wide, pm.scales.data(), pm.biases.data(), pw.data());
    tile_params(packed, pm.scales.data(), pm.biases.data(), pp.data());
    for (int64_t rb = 0; rb < wide.row_blocks(); ++rb)
      for (int64_t gi = 0; gi < wide.groups(); ++gi)
        for (int lg = 0; lg < 8; ++lg) {
          float a[4], b[4];
          param_at(wide, pw.data(), rb, gi, lg, a);
          param_at(packed, pp.data(), rb, gi, lg, b);
          for (int i = 0; i < 4; ++i) ASSERT_EQ(a[i], b[i]) << "group " << group << " rb " << rb << " gi " << gi;
        }
    // Not packable: a bias off the −s·z grid, a scale with more than 7 significant bits.
    std::vector<float> sc(pm.scales), bi(pm.biases);
    bi[3] += 0.25f * sc[3];
    EXPECT_FALSE(zero_pack_fits(kQ4, n, sc.data(), bi.data()));
    bi = pm.biases, sc[5] = f16_to_f32(uint16_t(f32_to_f16(sc[5]) | 1u)), bi[5] = -sc[5] * 8.f;
    EXPECT_FALSE(zero_pack_fits(kQ4, n, sc.data(), bi.data()));
  }
  // MLX affine and 8-bit weights keep the 8-byte form.
  const PackedMatrix mlx = pack_matrix(quantize_matrix(w.data(), 40, 256, QuantFormat::MLX, 64, false, 4));
  EXPECT_FALSE(zero_pack_fits(kQ4, int64_t(mlx.scales.size()), mlx.scales.data(), mlx.biases.data()));
  const PackedMatrix q8 = pack_matrix(quantize_matrix(w.data(), 40, 256, QuantFormat::MLX, 64, false, 8));
  EXPECT_FALSE(zero_pack_fits(kQ8, int64_t(q8.scales.size()), q8.scales.data(), q8.biases.data()));
  // The ring GEMV's folded biases (quant_gemv_ring.cu): −s·(1024 + z), −s·(64 + z) from the bits of
  // 1024 + z and 64 + z, exactly what fma(−1024, s, −s·z) and fma(−64, s, −s·z) give.
  for (uint32_t z = 0; z < 16; ++z) {
    EXPECT_EQ(bits_to_float(0x44800000u | (z << 13)), 1024.f + float(z));
    EXPECT_EQ(bits_to_float(0x42800000u | (z << 17)), 64.f + float(z));
    for (float s : {3.0517578e-5f, 0.0078125f, 0.01171875f, 1.984375f}) {
      EXPECT_EQ(-s * (1024.f + float(z)), std::fma(-1024.f, s, -s * float(z)));
      EXPECT_EQ(-s * (64.f + float(z)), std::fma(-64.f, s, -s * float(z)));
    }
  }
}

// The decode GEMV's arithmetic on the tile layout equals the CPU packed matmul: per-row groups
// (with in % 16 != 0), groups of one tile or several, groups smaller than a tile, groups not a
// multiple of the tile (Q8 g48), 4 and 16 warps, N = 1, 3, 8.
TEST(QuantTileLayout, EmulatedGemvMatchesCpu) {
  CpuBackend b(2);
  struct Case {
    const char* name;
    Format f;
    int64_t out, in;
  };
  const Case cases[] = {
      {"fp8 per row, in 36", {"", QuantFormat::FP8, 0, false, 4}, 17, 36},
      {"fp8 per row", {"", QuantFormat::FP8, 0, false, 4}, 40, 160},
      {"int8 per row", {"", QuantFormat::INT8, 0, false, 4}, 33, 96},
      {"int4 g64 zp", {"", QuantFormat::INT4, 64, true, 4}, 33, 320},
      {"int4 g16 sym", {"", QuantFormat::INT4, 16, false, 4}, 20, 96},
      {"int4 g128 zp", {"", QuantFormat::INT4, 128, true, 4}, 16, 384},
      {"mlx4 g32", {"", QuantFormat::MLX, 32, false, 4}, 24, 160},
      {"mlx8 g32", {"", QuantFormat::MLX, 32, false, 8}, 9, 96},
      {"mlx8 g48", {"", QuantFormat::MLX, 48, false, 8}, 18, 144},
  };
  for (const Case& c : cases) {
    const auto w = randn(size_t(c.out * c.in), 23 + uint64_t(c.in), 0.05f);
    const QuantizedMatrix q = quantize_matrix(w.data(), c.out, c.in, c.f.format, c.f.group, c.f.zero_points, c.f.bits);
    const PackedMatrix pm = pack_matrix(q);
    const Weight packed = b.load_quantized_weight(pm.view(), c.name);
    for (int n : {1, 3, 8}) {
      auto x = randn(size_t(n * c.in), 7 + uint64_t(n));
      for (auto& v : x) v = round_bf16(v);  // the GPU multiplies bf16 activations
      const auto ref = cpu_matmul(b, packed, x, n);
      for (int W : {4, 16}) {
        // Q4 accumulates Σx·(128 + q) and removes 128·Σx with the bias: ~3 bits of the fp32
        // accumulator are lost to that cancellation (still ~1000× under the bf16 output rounding).
        const double tol = pm.format == WeightFormat::Q4 ? 1e-5 : 2e-6;
        const double e = rel_err(emulate_qgemv(pm.view(), x, n, W), ref);
        EXPECT_LT(e, tol) << c.name << " N=" << n << " warps=" << W;
      }
    }
  }
}

// ---- whole models ----

namespace {

struct TmpDir {
  fs::path path;
  TmpDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("sala_qmm_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

std::vector<float> logits(const fs::path& dir, const std::vector<int32_t>& seq, ModelWeights* formats = nullptr,
                          std::string* description = nullptr) {
  CpuBackend backend(2);
  LoadedModel m = load_model(dir.string(), backend, {.max_batch_tokens = 16, .max_logit_rows = 16});
  if (description) *description = describe_weight_formats(m.config, m.model->weights());
  if (formats) {
    const ModelWeights& w = m.model->weights();
    formats->dequantized = w.dequantized;
    formats->params_rounded = w.params_rounded, formats->params_stored = w.params_stored;
    formats->params_rounded_max_rel = w.params_rounded_max_rel;
    formats->embed.format = w.embed.format;
    formats->lm_head.format = w.lm_head.format;
    for (const auto& l : w.layers) {
      LayerWeights lw;
      lw.q.format = l.q.format, lw.o.format = l.o.format, lw.gate.format = l.gate.format, lw.down.format = l.down.format;
      formats->layers.push_back(lw);
    }
  }
  Engine engine(*m.model, {.max_sequences = 1, .max_context = int64_t(seq.size())});
  // Prompt chunks of 16 (packed prefill path), then 40 decode steps (per-row path).
  return replay(engine, {seq}, {int64_t(seq.size()) - 40, 16, true})[0];
}

// A float copy of a (quantized) checkpoint: every quantized tensor dequantized by the reference.
void write_dequantized(const fs::path& src, const fs::path& dst) {
  fs::create_directories(dst);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  const QuantConfig qc = parse_quant_config(cfg);
  cfg.erase("quantization");
  std::ofstream(dst / "config.json") << cfg.dump(2);
  const ModelConfig mc = ModelConfig::load(src);
  Checkpoint ck(src);
  SafetensorsWriter out;
  std::vector<std::vector<float>> keep;
  for (const TensorSpec& t : expected_tensors(mc)) {
    const std::string base = t.name.substr(0, t.name.size() - 7);  // without ".weight"
    const bool ours = ck.contains(t.name + "_scale"), mlx = ck.contains(base + ".scales");
    if (!ours && !mlx) {
      out.add(t.name, ck.get(t.name));
      continue;
    }
    keep.emplace_back(size_t(shape_numel(t.shape)));
    const TensorView* zero = ck.contains(t.name + "_zero") ? &ck.get(t.name + "_zero") : nullptr;
    const TensorView* bias = mlx ? &ck.get(base + ".biases") : nullptr;
    dequantize_views(qc.format, qc.group_size, qc.bits, t.shape[0], t.shape[1], ck.get(t.name),
                     ck.get(mlx ? base + ".scales" : t.name + "_scale"), zero, bias, keep.back().data());
    out.add(t.name, TensorView{keep.back().data(), DType::F32, t.shape});
  }
  out.write(dst / "model.safetensors");
}

}  // namespace

TEST(PackedModel, QuantizedCheckpointsLoadPackedAndMatchTheirDequantizedCopy) {
  TmpDir tmp;
  const ModelConfig cfg = preset_config("tiny");
  write_random_checkpoint(tmp.path / "f32", cfg, {.seed = 3, .dtype = DType::F32});
  std::vector<int32_t> seq(120);
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = int32_t(3 + (i * 37 + 11) % 500);
  struct Case {
    const char* name;
    QuantizeOptions opt;
    WeightFormat expect;
  };
  const Case cases[] = {{"fp8", {QuantFormat::FP8, 0, false, 4}, WeightFormat::FP8},
                        {"int8", {QuantFormat::INT8, 0, false, 4}, WeightFormat::Q8},
                        {"int4", {QuantFormat::INT4, 32, true, 4}, WeightFormat::Q4},
                        {"int4sym", {QuantFormat::INT4, 64, false, 4}, WeightFormat::Q4},
                        {"mlx8", {QuantFormat::MLX, 32, false, 8}, WeightFormat::Q8}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    quantize_checkpoint(tmp.path / "f32", tmp.path / c.name, c.opt);
    write_dequantized(tmp.path / c.name, tmp.path / (std::string(c.name) + "_deq"));
    ModelWeights formats;
    const auto packed = logits(tmp.path / c.name, seq, &formats);
    const auto dense = logits(tmp.path / (std::string(c.name) + "_deq"), seq);
    for (const auto& l : formats.layers)
      for (WeightFormat f : {l.q.format, l.o.format, l.gate.format, l.down.format}) EXPECT_EQ(f, c.expect);
    EXPECT_EQ(formats.embed.format, WeightFormat::Dense);
    EXPECT_EQ(formats.lm_head.format, WeightFormat::Dense);  // the converter keeps lm_head
    EXPECT_TRUE(formats.dequantized.empty());
    EXPECT_LT(rel_err(packed, dense), 2e-5);
  }
}

// Group scales stored finer than f16 (an int4 checkpoint of before 2026-11-27 kept them in f32) are
// held rounded to f16: the model computes exactly what the checkpoint with those rounded scales
// gives, and says how many it rounded.
TEST(PackedModel, FinerGroupScalesAreRoundedToF16AndNoted) {
  TmpDir tmp;
  const ModelConfig cfg = preset_config("tiny");
  write_random_checkpoint(tmp.path / "f32", cfg, {.seed = 5, .dtype = DType::F32});
  quantize_checkpoint(tmp.path / "f32", tmp.path / "int4", {QuantFormat::INT4, 32, false, 4});
  // The same codes with f32 scales off the f16 grid (× (1 + 3e-5)), and with those rounded back.
  for (const bool rounded : {false, true}) {
    Checkpoint ck(tmp.path / "int4");
    SafetensorsWriter w;
    std::vector<std::vector<float>> keep;
    for (const auto& [name, v] : ck.tensors()) {
      if (name.size() < 6 || name.substr(name.size() - 6) != "_scale") {
        w.add(name, v);
        continue;
      }
      keep.emplace_back(size_t(v.numel()));
      convert_to_f32(v.data, v.dtype, keep.back().data(), keep.back().size());
      for (float& x : keep.back()) x = rounded ? qlayout::group_param(x * 1.00003f) : x * 1.00003f;
      w.add(name, TensorView{keep.back().data(), DType::F32, v.shape});
    }
    const fs::path dir = tmp.path / (rounded ? "rounded" : "finer");
    fs::create_directories(dir);
    fs::copy_file(tmp.path / "int4" / "config.json", dir / "config.json");
    w.write(dir / "model.safetensors");
  }
  std::vector<int32_t> seq(60);
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = int32_t(3 + (i * 29 + 5) % 500);
  ModelWeights finer_w, rounded_w;
  std::string finer_d, rounded_d;
  const auto finer = logits(tmp.path / "finer", seq, &finer_w, &finer_d);
  const auto rounded = logits(tmp.path / "rounded", seq, &rounded_w, &rounded_d);
  EXPECT_EQ(finer, rounded);
  EXPECT_GT(finer_w.params_rounded, finer_w.params_stored / 2);  // (a few may land on the grid)
  EXPECT_EQ(rounded_w.params_rounded, 0);
  EXPECT_GT(finer_w.params_rounded_max_rel, 0);
  EXPECT_LE(finer_w.params_rounded_max_rel, 1.0 / 2048);
  EXPECT_NE(finer_d.find("rounded to f16"), std::string::npos) << finer_d;
  EXPECT_EQ(rounded_d.find("rounded to f16"), std::string::npos) << rounded_d;
}

// MLX checkpoints may quantize the embedding and lm_head: the lm_head then stays packed, the
// embedding table is dequantized at load and listed.
TEST(PackedModel, QuantizedLmHeadStaysPackedEmbeddingIsDequantized) {
  TmpDir tmp;
  const ModelConfig cfg = preset_config("tiny");
  write_random_checkpoint(tmp.path / "f32", cfg, {.seed = 4, .dtype = DType::F32});
  quantize_checkpoint(tmp.path / "f32", tmp.path / "mlx", {QuantFormat::MLX, 64, false, 4});
  // Add the embedding and lm_head in the MLX layout.
  {
    Checkpoint ck(tmp.path / "mlx");
    SafetensorsWriter w;
    std::vector<QuantizedMatrix> keep;
    std::vector<std::vector<uint16_t>> halves;
    for (const auto& [name, v] : ck.tensors()) {
      if (name != "model.embed_tokens.weight" && name != "lm_head.weight") {
        w.add(name, v);
        continue;
      }
      std::vector<float> f(size_t(v.numel()));
      convert_to_f32(v.data, v.dtype, f.data(), f.size());
      keep.push_back(quantize_matrix(f.data(), v.shape[0], v.shape[1], QuantFormat::MLX, 64, false, 4, name));
      const QuantizedMatrix& q = keep.back();
      const std::string base = name.substr(0, name.size() - 7);
      w.add(name, TensorView{q.data.data(), DType::U32, q.data_shape()});
      for (const auto* src : {&q.scales, &q.biases}) {
        halves.emplace_back(src->size());
        convert_from_f32(src->data(), DType::BF16, halves.back().data(), src->size());
      }
      w.add(base + ".scales", TensorView{halves[halves.size() - 2].data(), DType::BF16, q.scale_shape()});
      w.add(base + ".biases", TensorView{halves.back().data(), DType::BF16, q.scale_shape()});
    }
    fs::create_directories(tmp.path / "mlx_all");
    fs::copy_file(tmp.path / "mlx" / "config.json", tmp.path / "mlx_all" / "config.json");
    w.write(tmp.path / "mlx_all" / "model.safetensors");
  }
  write_dequantized(tmp.path / "mlx_all", tmp.path / "mlx_all_deq");
  std::vector<int32_t> seq(80);
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = int32_t(5 + (i * 13) % 400);
  ModelWeights formats;
  const auto packed = logits(tmp.path / "mlx_all", seq, &formats);
  const auto dense = logits(tmp.path / "mlx_all_deq", seq);
  EXPECT_EQ(formats.lm_head.format, WeightFormat::Q4);
  EXPECT_EQ(formats.embed.format, WeightFormat::Dense);
  ASSERT_EQ(formats.dequantized.size(), 1u);
  EXPECT_EQ(formats.dequantized[0], "model.embed_tokens.weight");
  EXPECT_LT(rel_err(packed, dense), 2e-5);
}

TEST(PackedModel, RandomQuantizedWeightsRunAndDescribeThemselves) {
  CpuBackend b(2);
  const ModelConfig cfg = preset_config("tiny");
  for (const char* q : {"fp8", "int8", "int4"}) {
    ModelWeights w = random_weights(cfg, b, 1, parse_random_quant(q));
    EXPECT_TRUE(w.layers[0].gate.packed()) << q;
    EXPECT_FALSE(w.lm_head.packed()) << q;
    const std::string d = describe_weight_formats(cfg, w);
    EXPECT_NE(d.find(q == std::string("int4") ? "q4 (group 64)" : q == std::string("int8") ? "q8 (per row)" : "fp8 (per row)"),
              std::string::npos)
        << d;
    EXPECT_LT(weight_bytes_per_param(cfg, w), 4.0) << d;
    Model m(cfg, std::move(w), b, {.max_batch_tokens = 16, .max_logit_rows = 16});
    Engine e(m, {.max_sequences = 1, .max_context = 64});
    std::vector<int32_t> toks(20, 7);
    const auto out = replay(e, {toks}, {-1, 8, true})[0];
    for (float v : out) ASSERT_TRUE(std::isfinite(v)) << q;
  }
  EXPECT_THROW(parse_random_quant("int3"), Error);
}
