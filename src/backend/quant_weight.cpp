// Backend-independent parts of packed weights: names, checks of the canonical host form, and the
// default random packed weight (built on the host, loaded through load_quantized_weight).
#include <cmath>

#include "backend/backend.h"
#include "backend/quant_layout.h"
#include "core/error.h"
#include "core/rng.h"

namespace sala {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Dense: return "dense";
    case WeightFormat::FP8: return "fp8";
    case WeightFormat::Q8: return "q8";
    case WeightFormat::Q4: return "q4";
  }
  return "?";
}

void QuantMatrixView::validate(const std::string& name) const {
  const char* f = weight_format_name(format);
  SALA_CHECK(format != WeightFormat::Dense, "{}: load_quantized_weight with a dense format", name);
  SALA_CHECK(rows > 0 && cols > 0, "{}: {} matrix of shape [{}, {}]", name, f, rows, cols);
  SALA_CHECK(group > 0 && cols % group == 0, "{}: {} group size {} does not divide the {} input columns", name, f,
             group, cols);
  SALA_CHECK(format != WeightFormat::Q4 || (cols % 2 == 0 && group % 2 == 0),
             "{}: q4 needs an even number of columns and group size (got {} / {})", name, cols, group);
  SALA_CHECK(format != WeightFormat::FP8 || group == cols, "{}: fp8 has one scale per row (group {} != {} columns)",
             name, group, cols);
  SALA_CHECK(codes.size() == code_bytes(), "{}: {} codes hold {} bytes, expected {} for [{}, {}]", name, f,
             codes.size(), code_bytes(), rows, cols);
  const size_t np = size_t(rows * groups());
  SALA_CHECK(scales.size() == np, "{}: {} scales hold {} values, expected {} ([{}, {}])", name, f, scales.size(), np,
             rows, groups());
  if (format == WeightFormat::FP8) {
    SALA_CHECK(biases.empty(), "{}: fp8 takes no biases", name);
    // e4m3fn has no infinities; S.1111.111 is NaN, which no quantizer writes (it saturates).
    for (size_t i = 0; i < codes.size(); ++i)
      SALA_CHECK((codes[i] & 0x7f) != 0x7f, "{}: fp8 code 0x{:02x} (NaN) at row {}, column {}", name, codes[i],
                 int64_t(i) / cols, int64_t(i) % cols);
  } else {
    SALA_CHECK(biases.size() == np, "{}: {} biases hold {} values, expected {}", name, f, biases.size(), np);
  }
  const bool f16 = group < cols;  // grouped weights hold their parameters in f16 (quant_layout.h)
  for (size_t i = 0; i < np; ++i) {
    const float s = scales[i], b = biases.empty() ? 0.f : biases[i];
    SALA_CHECK(std::isfinite(s) && std::isfinite(b), "{}: non-finite scale or bias at row {}, group {}", name,
               int64_t(i) / groups(), int64_t(i) % groups());
    SALA_CHECK(!f16 || (std::isfinite(qlayout::group_param(s)) && std::isfinite(qlayout::group_param(b))),
               "{}: scale {} or bias {} at row {}, group {} is beyond f16's range (grouped weights hold their "
               "parameters in f16)",
               name, s, b, int64_t(i) / groups(), int64_t(i) % groups());
  }
}

Weight Backend::random_quantized_weight(WeightFormat format, int64_t rows, int64_t cols, int64_t group, float std,
                                        uint64_t seed) {
  SALA_CHECK(format != WeightFormat::Dense, "random_quantized_weight: dense format");
  if (format == WeightFormat::FP8) group = cols;
  SALA_CHECK(group > 0 && cols % group == 0, "random_quantized_weight: group {} does not divide {} columns", group,
             cols);
  QuantMatrixView q;
  q.format = format;
  q.rows = rows, q.cols = cols, q.group = group;
  std::vector<uint8_t> codes(q.code_bytes());
  for (size_t i = 0; i < codes.size(); ++i) {
    uint8_t b = uint8_t(splitmix64(seed * 0x9e3779b97f4a7c15ull + i / 8) >> (8 * (i % 8)));
    if (format == WeightFormat::FP8 && (b & 0x7f) == 0x7f) b = uint8_t(b - 1);  // no NaN codes
    codes[i] = b;
  }
  float s0, b0;
  qlayout::random_params(int(format), std, &s0, &b0);
  const size_t np = size_t(rows * q.groups());
  std::vector<float> scales(np), biases(format == WeightFormat::FP8 ? 0 : np);
  for (size_t i = 0; i < np; ++i) {
    const float f = 0.75f + 0.5f * uniform01(seed ^ 0x5ca1eull, i);  // groups differ a little
    scales[i] = s0 * f;
    if (!biases.empty()) biases[i] = b0 * f;
  }
  q.codes = codes, q.scales = scales, q.biases = biases;
  return load_quantized_weight(q, "random");
}

}  // namespace sala
