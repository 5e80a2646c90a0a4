#include "model/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/quant_layout.h"
#include "core/error.h"
#include "core/threads.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace sala {

namespace fs = std::filesystem;
using nlohmann::json;

std::string quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::None: return "none";
    case QuantFormat::FP8: return "fp8";
    case QuantFormat::INT8: return "int8";
    case QuantFormat::INT4: return "int4";
    case QuantFormat::MLX: return "mlx";
  }
  return "?";
}

namespace {

int quant_int(const json& q, const char* key, const std::string& source) {
  const json& v = q.at(key);
  if (v.is_number_integer()) return v.get<int>();
  if (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())) return int(v.get<double>());
  fail("{}: field 'quantization.{}' = {} must be an integer", source, key, v.dump());
}

}  // namespace

QuantConfig parse_quant_config(const json& config, const std::string& source) {
  QuantConfig qc;
  if (!config.is_object() || !config.contains("quantization") || config["quantization"].is_null()) return qc;
  const json& q = config["quantization"];
  if (!q.is_object()) fail("{}: field 'quantization' = {} must be an object", source, q.dump());
  if (q.contains("format")) {
    const json& f = q["format"];
    const std::string name = f.is_string() ? f.get<std::string>() : "";
    if (name == "fp8") qc.format = QuantFormat::FP8;
    else if (name == "int8") qc.format = QuantFormat::INT8;
    else if (name == "int4") qc.format = QuantFormat::INT4;
    else fail("{}: field 'quantization.format' = {} must be one of \"fp8\", \"int8\", \"int4\"", source, f.dump());
    if (qc.format == QuantFormat::INT4) {
      if (!q.contains("group_size")) fail("{}: field 'quantization.group_size' is missing (required for int4)", source);
      qc.group_size = quant_int(q, "group_size", source);
      if (qc.group_size <= 0 || qc.group_size % 2 != 0)
        fail("{}: field 'quantization.group_size' = {} must be a positive even number", source, qc.group_size);
    }
    if (q.contains("zero_points") && q["zero_points"].is_boolean()) qc.zero_points = q["zero_points"].get<bool>();
    return qc;
  }
  if (q.contains("bits")) {  // MLX affine
    qc.format = QuantFormat::MLX;
    qc.bits = quant_int(q, "bits", source);
    if (qc.bits != 4 && qc.bits != 8)
      fail("{}: field 'quantization.bits' = {} is not supported (MLX layouts of 4 or 8 bits load)", source, qc.bits);
    if (!q.contains("group_size")) fail("{}: field 'quantization.group_size' is missing", source);
    qc.group_size = quant_int(q, "group_size", source);
    if (qc.group_size <= 0 || qc.group_size % (32 / qc.bits) != 0)
      fail("{}: field 'quantization.group_size' = {} must be a positive multiple of {}", source, qc.group_size,
           32 / qc.bits);
    if (q.contains("mode") && q["mode"] != "affine")
      fail("{}: field 'quantization.mode' = {} is not supported (only \"affine\")", source, q["mode"].dump());
    return qc;
  }
  fail("{}: field 'quantization' has neither 'format' (fp8|int8|int4) nor 'bits' (MLX)", source);
}

QuantConfig load_quant_config(const fs::path& dir) {
  const fs::path file = fs::is_directory(dir) ? dir / "config.json" : dir;
  if (!fs::exists(file)) return {};
  return parse_quant_config(read_json_file(file), file.string());
}

json quant_config_json(const QuantConfig& q) {
  switch (q.format) {
    case QuantFormat::None: return nullptr;
    case QuantFormat::MLX: return {{"group_size", q.group_size}, {"bits", q.bits}};
    case QuantFormat::INT4:
      return {{"format", "int4"}, {"group_size", q.group_size}, {"zero_points", q.zero_points}};
    default: return {{"format", quant_format_name(q.format)}};
  }
}

std::string describe_quant_config(const QuantConfig& q) {
  switch (q.format) {
    case QuantFormat::None: return "none";
    case QuantFormat::MLX: return fmt::format("MLX affine, {}-bit, groups of {}", q.bits, q.group_size);
    case QuantFormat::INT4:
      return fmt::format("int4, groups of {}, {}", q.group_size, q.zero_points ? "zero points" : "symmetric");
    default: return quant_format_name(q.format) + ", one scale per output channel";
  }
}

// ---- one matrix ----

DType QuantizedMatrix::data_dtype() const {
  switch (format) {
    case QuantFormat::FP8: return DType::F8_E4M3;
    case QuantFormat::INT8: return DType::I8;
    case QuantFormat::INT4: return DType::U8;
    case QuantFormat::MLX: return DType::U32;
    default: return DType::F32;
  }
}

Shape QuantizedMatrix::data_shape() const {
  switch (format) {
    case QuantFormat::INT4: return {rows, cols / 2};
    case QuantFormat::MLX: return {rows, cols * bits / 32};
    default: return {rows, cols};
  }
}

Shape QuantizedMatrix::scale_shape() const {
  if (format == QuantFormat::INT4 || format == QuantFormat::MLX) return {rows, cols / group_size};
  return {rows};
}

namespace {

// An int4 group scale as stored. The backends multiply by f16 scales and biases (backend.h), and
// int4's bias is −s·z (symmetric: z = 8): so the scale is an f16 value of 7 significant bits
// (rounded up: the range asked for is covered), whose products with z ≤ 15 fit f16's 11 — the bias
// the backends hold is then exactly the checkpoint's s·(q − z) — and whose f16 ends in four zero
// bits, where the CUDA backend keeps z (quant_layout.h, zero-packed parameters: 4 bytes per row
// pair and group instead of 8). Below f16's normal range, a multiple of 2^-20 for the same four
// bits. (A coarser grid by < 0.8%: far under the int4 rounding itself.) 1 where the scale would
// be 0 (an all-zero or vanishing group).
float int4_scale(float s) {
  if (s > 0) s = qlayout::int4_scale_7_bits(s);
  const float r = qlayout::group_param(s);
  SALA_CHECK(std::isfinite(r), "int4 group scale {} is beyond f16's range (weights that large are not a model's)", s);
  return r > 0 ? r : 1.f;
}

// The fractions of a group's range (int4) whose squared error the quantizer compares: rounding to
// nearest on the full range spends codes on the group's extremes, and a slightly narrower grid is
// finer for the rest. On Gaussian groups these five take the squared error 7% (64 columns) to 10%
// (128) below the full range alone; a finer sweep of 13 gains under 1% more.
constexpr float kInt4Clips[] = {1.f, 0.95f, 0.9f, 0.85f, 0.8f};

void check_fits(QuantFormat format, int64_t cols, int group, int bits, const std::string& name) {
  if (format == QuantFormat::INT4 || format == QuantFormat::MLX) {
    SALA_CHECK(group > 0 && cols % group == 0, "{}: {} input columns are not a multiple of the group size {}", name,
               cols, group);
    if (format == QuantFormat::INT4) SALA_CHECK(group % 2 == 0, "{}: int4 group size {} must be even", name, group);
    if (format == QuantFormat::MLX)
      SALA_CHECK((bits == 4 || bits == 8) && group % (32 / bits) == 0, "{}: MLX bits {} / group {} unsupported", name,
                 bits, group);
  }
}

}  // namespace

QuantizedMatrix quantize_matrix(const float* w, int64_t rows, int64_t cols, QuantFormat format, int group,
                                bool zero_points, int bits, const std::string& name, ThreadPool* pool) {
  check_fits(format, cols, group, bits, name);
  QuantizedMatrix q;
  q.format = format;
  q.rows = rows;
  q.cols = cols;
  q.group_size = (format == QuantFormat::INT4 || format == QuantFormat::MLX) ? group : 0;
  q.bits = format == QuantFormat::MLX ? bits : 0;
  const Shape ds = q.data_shape(), ss = q.scale_shape();
  q.data.assign(size_t(shape_numel(ds)) * dtype_size(q.data_dtype()), 0);
  q.scales.assign(size_t(shape_numel(ss)), 0.f);
  if (format == QuantFormat::INT4 && zero_points) q.zeros.assign(size_t(rows * (cols / group)), 0);
  if (format == QuantFormat::MLX) q.biases.assign(size_t(rows * (cols / group)), 0.f);
  // Rows are independent (per-row scales or groups within a row; an MLX word never spans rows):
  // pieces of rows on the pool give the same bytes as one pass.
  auto quantize_rows = [&](int64_t r0, int64_t r1) {
    switch (format) {
      case QuantFormat::FP8:
      case QuantFormat::INT8: {
        const float qmax = format == QuantFormat::FP8 ? 448.f : 127.f;
        for (int64_t r = r0; r < r1; ++r) {
          const float* row = w + r * cols;
          float amax = 0;
          for (int64_t j = 0; j < cols; ++j) amax = std::max(amax, std::fabs(row[j]));
          const float scale = amax > 0 ? amax / qmax : 1.f;
          q.scales[size_t(r)] = scale;
          uint8_t* dst = q.data.data() + r * cols;
          for (int64_t j = 0; j < cols; ++j) {
            const float x = row[j] / scale;
            if (format == QuantFormat::FP8) {
              dst[j] = f32_to_fp8_e4m3(x);
            } else {
              const int v = int(std::clamp(std::nearbyint(x), -127.f, 127.f));
              dst[j] = uint8_t(int8_t(v));
            }
          }
        }
        break;
      }
      case QuantFormat::INT4: {
        const int64_t groups = cols / group;
        std::vector<int> vals(static_cast<size_t>(group)), best(static_cast<size_t>(group));  // a group's codes
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t g = 0; g < groups; ++g) {
            const float* x = w + r * cols + g * group;
            uint8_t* dst = q.data.data() + (r * cols + g * group) / 2;
            float amax = 0, mn = x[0], mx = x[0];
            for (int j = 0; j < group; ++j)
              amax = std::max(amax, std::fabs(x[j])), mn = std::min(mn, x[j]), mx = std::max(mx, x[j]);
            mn = std::min(mn, 0.f), mx = std::max(mx, 0.f);  // zero points: zero stays exactly representable
            // The group's range shrunk by each of kInt4Clips, the one with the least squared error
            // kept (ties: the wider); the scale is rounded as stored (int4_scale) before its codes
            // are chosen, so the codes are the best ones for the scale that is used.
            double best_err = -1;
            float best_scale = 1.f;
            int best_zero = 0;
            const float lo = zero_points ? 0.f : -8.f, hi = zero_points ? 15.f : 7.f;
            for (const float clip : kInt4Clips) {
              const float scale =
                  int4_scale(zero_points ? clip * (mx - mn) / 15.f : clip * amax / 7.f);
              const int zero = zero_points ? int(std::clamp(std::nearbyint(-clip * mn / scale), 0.f, 15.f)) : 0;
              double err = 0;
              for (int j = 0; j < group; ++j) {
                const int v = int(std::clamp(std::nearbyint(x[j] / scale) + float(zero), lo, hi));
                const double d = double(scale) * double(v - zero) - double(x[j]);
                vals[size_t(j)] = v, err += d * d;
              }
              if (best_err < 0 || err < best_err) best_err = err, best_scale = scale, best_zero = zero, best.swap(vals);
            }
            q.scales[size_t(r * groups + g)] = best_scale;
            if (zero_points) q.zeros[size_t(r * groups + g)] = uint8_t(best_zero);
            for (int j = 0; j < group; j += 2) dst[j / 2] = pack_int4(best[size_t(j)], best[size_t(j + 1)]);
          }
        break;
      }
      case QuantFormat::MLX: {
        // Scales and biases are rounded through bf16 (what MLX stores) before the codes are chosen.
        const int64_t groups = cols / group;
        const uint32_t qmax = (1u << bits) - 1u;
        const int per_word = 32 / bits;
        auto* words = reinterpret_cast<uint32_t*>(q.data.data());
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t g = 0; g < groups; ++g) {
            const float* x = w + r * cols + g * group;
            float mn = x[0], mx = x[0];
            for (int j = 0; j < group; ++j) mn = std::min(mn, x[j]), mx = std::max(mx, x[j]);
            float scale = round_bf16(mx > mn ? (mx - mn) / float(qmax) : 1.f);
            const float bias = round_bf16(mn);
            if (scale == 0) scale = 1.f;
            q.scales[size_t(r * groups + g)] = scale;
            q.biases[size_t(r * groups + g)] = bias;
            for (int j = 0; j < group; ++j) {
              const uint32_t v = uint32_t(std::clamp(std::nearbyint((x[j] - bias) / scale), 0.f, float(qmax)));
              const int64_t e = r * cols + g * group + j;
              uint32_t word_le;
              std::memcpy(&word_le, &words[e / per_word], 4);
              word_le |= v << ((e % per_word) * bits);
              std::memcpy(&words[e / per_word], &word_le, 4);
            }
          }
        break;
      }
      case QuantFormat::None: fail("{}: quantize_matrix with format none", name);
    }
  };
  if (pool && rows > 1)
    pool->parallel_for(rows, quantize_rows);
  else
    quantize_rows(0, rows);
  return q;
}

void dequantize_views(QuantFormat format, int group, int bits, int64_t rows, int64_t cols, const TensorView& data,
                      const TensorView& scales_v, const TensorView* zeros_v, const TensorView* biases_v,
                      float* out) {
  std::vector<float> scales(size_t(scales_v.numel()));
  convert_to_f32(scales_v.data, scales_v.dtype, scales.data(), scales.size());
  const auto* bytes = static_cast<const uint8_t*>(data.data);
  switch (format) {
    case QuantFormat::FP8:
    case QuantFormat::INT8:
      for (int64_t r = 0; r < rows; ++r) {
        const float s = scales[size_t(r)];
        for (int64_t j = 0; j < cols; ++j) {
          const uint8_t b = bytes[r * cols + j];
          out[r * cols + j] = s * (format == QuantFormat::FP8 ? fp8_e4m3_to_f32(b) : float(int8_t(b)));
        }
      }
      break;
    case QuantFormat::INT4: {
      const int64_t groups = cols / group;
      const auto* zeros = zeros_v ? static_cast<const uint8_t*>(zeros_v->data) : nullptr;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t gi = r * groups + j / group, e = r * cols + j;
          const uint8_t b = bytes[e / 2];
          const float v = zeros ? float(unpack_int4_unsigned(b, int(e & 1)) - int(zeros[gi]))
                                : float(unpack_int4_signed(b, int(e & 1)));
          out[e] = scales[size_t(gi)] * v;
        }
      break;
    }
    case QuantFormat::MLX: {
      SALA_CHECK(biases_v, "MLX dequantization needs biases");
      std::vector<float> biases(size_t(biases_v->numel()));
      convert_to_f32(biases_v->data, biases_v->dtype, biases.data(), biases.size());
      const int64_t groups = cols / group;
      const int per_word = 32 / bits;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t e = r * cols + j, gi = r * groups + j / group;
          const uint8_t* wp = bytes + (e / per_word) * 4;
          const uint32_t word = uint32_t(wp[0]) | uint32_t(wp[1]) << 8 | uint32_t(wp[2]) << 16 | uint32_t(wp[3]) << 24;
          out[e] = scales[size_t(gi)] * float(unpack_mlx(word, bits, int(e % per_word))) + biases[size_t(gi)];
        }
      break;
    }
    case QuantFormat::None: fail("dequantize with format none");
  }
}

void dequantize_matrix(const QuantizedMatrix& q, float* out) {
  TensorView data{q.data.data(), q.data_dtype(), q.data_shape()};
  TensorView scales{q.scales.data(), DType::F32, q.scale_shape()};
  TensorView zeros{q.zeros.data(), DType::U8, q.scale_shape()};
  TensorView biases{q.biases.data(), DType::F32, q.scale_shape()};
  dequantize_views(q.format, q.group_size, q.bits, q.rows, q.cols, data, scales, q.zeros.empty() ? nullptr : &zeros,
                   q.biases.empty() ? nullptr : &biases, out);
}

// ---- packed form ----

PackedMatrix pack_views(QuantFormat format, int group, int bits, int64_t rows, int64_t cols, const TensorView& data,
                        const TensorView& scales_v, const TensorView* zeros_v, const TensorView* biases_v) {
  static_assert(std::endian::native == std::endian::little, "MLX words are read as little-endian bytes");
  PackedMatrix p;
  p.rows = rows, p.cols = cols;
  p.scales.resize(size_t(scales_v.numel()));
  convert_to_f32(scales_v.data, scales_v.dtype, p.scales.data(), p.scales.size());
  const auto* bytes = static_cast<const uint8_t*>(data.data);
  p.codes.assign(bytes, bytes + data.nbytes());
  const size_t np = p.scales.size();
  switch (format) {
    case QuantFormat::FP8:
      p.format = WeightFormat::FP8;
      p.group = cols;
      break;
    case QuantFormat::INT8:
      p.format = WeightFormat::Q8;
      p.group = cols;
      for (auto& c : p.codes) c ^= 0x80;  // two's complement q -> q + 128
      p.biases.resize(np);
      for (size_t i = 0; i < np; ++i) p.biases[i] = -128.f * p.scales[i];
      break;
    case QuantFormat::INT4: {
      p.format = WeightFormat::Q4;
      p.group = group;
      p.biases.resize(np);
      if (!zeros_v) {
        for (auto& c : p.codes) c ^= 0x88;  // both nibbles: q -> q + 8
        for (size_t i = 0; i < np; ++i) p.biases[i] = -8.f * p.scales[i];
      } else {
        const auto* z = static_cast<const uint8_t*>(zeros_v->data);
        for (size_t i = 0; i < np; ++i) p.biases[i] = -p.scales[i] * float(z[i]);
      }
      break;
    }
    case QuantFormat::MLX:
      SALA_CHECK(biases_v && (bits == 4 || bits == 8), "MLX packing needs biases and 4 or 8 bits");
      p.format = bits == 4 ? WeightFormat::Q4 : WeightFormat::Q8;
      p.group = group;
      p.biases.resize(np);
      convert_to_f32(biases_v->data, biases_v->dtype, p.biases.data(), np);
      break;
    case QuantFormat::None: fail("pack_views with format none");
  }
  return p;
}

PackedMatrix pack_matrix(const QuantizedMatrix& q) {
  TensorView data{q.data.data(), q.data_dtype(), q.data_shape()};
  TensorView scales{q.scales.data(), DType::F32, q.scale_shape()};
  TensorView zeros{q.zeros.data(), DType::U8, q.scale_shape()};
  TensorView biases{q.biases.data(), DType::F32, q.scale_shape()};
  return pack_views(q.format, q.group_size, q.bits, q.rows, q.cols, data, scales, q.zeros.empty() ? nullptr : &zeros,
                    q.biases.empty() ? nullptr : &biases);
}

// ---- error statistics ----

void QuantError::add(const float* ref, const float* got, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const double d = double(got[i]) - double(ref[i]);
    sum_sq_err += d * d;
    sum_sq_ref += double(ref[i]) * double(ref[i]);
    max_abs = std::max(max_abs, std::fabs(d));
  }
  n += count;
}

void QuantError::merge(const QuantError& o) {
  sum_sq_err += o.sum_sq_err;
  sum_sq_ref += o.sum_sq_ref;
  max_abs = std::max(max_abs, o.max_abs);
  n += o.n;
}

double QuantError::rel_fro() const { return sum_sq_ref > 0 ? std::sqrt(sum_sq_err / sum_sq_ref) : 0.0; }

// ---- converter ----

bool is_quantized_tensor(const std::string& name, bool is_vector, bool lm_head) {
  return !is_vector && name != "model.embed_tokens.weight" && (lm_head || name != "lm_head.weight");
}

QuantizeReport quantize_checkpoint(const fs::path& in, const fs::path& out, const QuantizeOptions& opt,
                                   const std::function<void(const QuantizeReport::Row&)>& on_row) {
  SALA_CHECK(opt.format != QuantFormat::None, "quantize: no format given");
  const std::string config_file = (in / "config.json").string();
  SALA_CHECK(fs::exists(config_file), "quantize: '{}' has no config.json", in.string());
  std::error_code ec;
  SALA_CHECK(!fs::exists(out) || !fs::equivalent(in, out, ec), "quantize: OUT must differ from IN");
  json raw = read_json_file(config_file);  // written out again with a quantization section
  SALA_CHECK(!parse_quant_config(raw, config_file).quantized(),
             "quantize: '{}' is already quantized (its config.json has a quantization section)", in.string());
  const ModelConfig config = ModelConfig::from_json(raw, config_file);
  Checkpoint ckpt(in);

  auto report = std::make_shared<QuantizeReport>();
  auto pool = std::make_shared<ThreadPool>();  // rows of one matrix at a time in parallel
  SafetensorsWriter writer;
  for (const auto& [k, v] : ckpt.metadata()) writer.set_metadata(k, v);
  writer.set_metadata("sala_quantization", quant_format_name(opt.format));

  std::set<std::string> done;
  auto record = [report, on_row](QuantizeReport::Row row) {
    report->total.merge(row.err);
    if (on_row) on_row(row);
    report->rows.push_back(std::move(row));
  };
  auto copy_through = [&](const std::string& name, const char* why) {
    const TensorView v = ckpt.get(name);
    report->bytes_in += v.nbytes();
    report->bytes_out += v.nbytes();
    writer.add(name, v.dtype, v.shape, [v, name, why, record](uint8_t* dst) {
      std::memcpy(dst, v.data, v.nbytes());
      record({name, v.shape, why, {}});
    });
  };

  for (const TensorSpec& t : expected_tensors(config)) {
    SALA_CHECK(ckpt.contains(t.name), "quantize: {} is missing from {}", t.name, in.string());
    done.insert(t.name);
    const TensorView v = ckpt.get(t.name);
    SALA_CHECK(dtype_is_float(v.dtype) && v.shape == t.shape, "quantize: {} is {} {} (expected a float {})", t.name,
               dtype_name(v.dtype), shape_str(v.shape), shape_str(t.shape));
    if (!is_quantized_tensor(t.name, t.is_vector, opt.lm_head)) {
      copy_through(t.name, t.is_vector ? "norm" : t.name == "lm_head.weight" ? "lm_head" : "embedding");
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const int group = opt.format == QuantFormat::INT4 || opt.format == QuantFormat::MLX ? opt.group_size : 0;
    check_fits(opt.format, cols, group, opt.bits, t.name);
    QuantizedMatrix shape_of;
    shape_of.format = opt.format;
    shape_of.rows = rows;
    shape_of.cols = cols;
    shape_of.group_size = group;
    shape_of.bits = opt.bits;
    // The matrix is quantized when its data is written; scales (and zeros/biases), written right
    // after, are taken from the same state, which is then freed: one tensor in memory at a time.
    auto state = std::make_shared<QuantizedMatrix>();
    const bool zeros = opt.format == QuantFormat::INT4 && opt.zero_points;
    const bool mlx = opt.format == QuantFormat::MLX;
    const std::string base = t.name.substr(0, t.name.size() - std::string(".weight").size());
    report->bytes_in += v.nbytes();
    writer.add(t.name, shape_of.data_dtype(), shape_of.data_shape(), [=](uint8_t* dst) {
      std::vector<float> w(size_t(v.numel()));
      convert_to_f32(v.data, v.dtype, w.data(), w.size());
      *state = quantize_matrix(w.data(), rows, cols, opt.format, group, zeros, opt.bits, t.name, pool.get());
      std::vector<float> back(w.size());
      dequantize_matrix(*state, back.data());
      QuantError err;
      err.add(w.data(), back.data(), int64_t(w.size()));
      std::memcpy(dst, state->data.data(), state->data.size());
      state->data = {};
      record({t.name, t.shape, "", err});
    });
    const Shape ss = shape_of.scale_shape();
    const DType sdt = mlx ? DType::BF16 : opt.format == QuantFormat::INT4 ? DType::F16 : DType::F32;
    report->bytes_out += shape_numel(shape_of.data_shape()) * dtype_size(shape_of.data_dtype()) +
                         shape_numel(ss) * dtype_size(sdt) * (mlx ? 2 : 1) + (zeros ? shape_numel(ss) : 0);
    writer.add(mlx ? base + ".scales" : t.name + "_scale", sdt, ss, [=](uint8_t* dst) {
      convert_from_f32(state->scales.data(), sdt, dst, state->scales.size());
      state->scales = {};
    });
    if (zeros)
      writer.add(t.name + "_zero", DType::U8, ss, [=](uint8_t* dst) {
        std::memcpy(dst, state->zeros.data(), state->zeros.size());
        state->zeros = {};
      });
    if (mlx)
      writer.add(base + ".biases", DType::BF16, ss, [=](uint8_t* dst) {
        convert_from_f32(state->biases.data(), DType::BF16, dst, state->biases.size());
        state->biases = {};
      });
  }
  // Tensors the forward pass does not use (rotary tables, weights of disabled steps) pass through.
  for (const auto& [name, v] : ckpt.tensors())
    if (!done.count(name)) copy_through(name, "unused");

  fs::create_directories(out);
  writer.write(out / "model.safetensors");
  QuantConfig qc;
  qc.format = opt.format;
  qc.group_size = opt.format == QuantFormat::INT4 || opt.format == QuantFormat::MLX ? opt.group_size : 0;
  qc.bits = opt.bits;
  qc.zero_points = opt.zero_points;
  raw["quantization"] = quant_config_json(qc);
  {
    const fs::path tmp = out / "config.json.tmp";
    std::ofstream f(tmp);
    SALA_CHECK(f.good(), "cannot write {}", tmp.string());
    f << raw.dump(2) << "\n";
    f.close();
    fs::rename(tmp, out / "config.json");
  }
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                           "special_tokens_map.json", "added_tokens.json"})
    if (fs::exists(in / name)) fs::copy_file(in / name, out / name, fs::copy_options::overwrite_existing);
  return std::move(*report);
}

}  // namespace sala
