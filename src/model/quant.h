// Quantized weights (docs/quantization.md): the formats `sala quantize` writes (fp8 e4m3 and int8
// with per-output-channel scales, int4 group-wise, symmetric or with zero points) and the MLX affine
// layout the original port publishes. Packing, unpacking, dequantization to f32, the
// "quantization" section of config.json, and the checkpoint converter.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend/backend.h"
#include "core/tensor.h"

namespace sala {

class Checkpoint;
class ThreadPool;

enum class QuantFormat { None, FP8, INT8, INT4, MLX };

std::string quant_format_name(QuantFormat f);  // "none", "fp8", "int8", "int4", "mlx"

// The "quantization" section of config.json.
//   ours: {"format": "fp8|int8|int4", "group_size": N}          (group_size: int4 only)
//   MLX:  {"group_size": 64, "bits": 4|8}                        (affine, w = scale * q + bias)
struct QuantConfig {
  QuantFormat format = QuantFormat::None;
  int group_size = 0;  // int4 and MLX
  int bits = 0;        // MLX: 4 or 8
  bool zero_points = false;  // int4 written with zero points (informational; loading looks at the tensors)
  bool quantized() const { return format != QuantFormat::None; }
};

// Parses the section of a whole config.json object (absent or null -> None). Errors name the
// source and the field, e.g. "config.json: field 'quantization.format' = "int3" must be ...".
QuantConfig parse_quant_config(const nlohmann::json& config, const std::string& source = "config.json");
// Reads dir/config.json (None when it has no section or there is no file).
QuantConfig load_quant_config(const std::filesystem::path& model_dir);
nlohmann::json quant_config_json(const QuantConfig& q);
// One line for people: "int4, groups of 64, zero points", "MLX affine, 4-bit, groups of 64".
std::string describe_quant_config(const QuantConfig& q);

// ---- packing ----

// int4 as two's complement nibbles, element 2j in the low nibble of byte j, 2j+1 in the high one.
inline uint8_t pack_int4(int lo, int hi) { return uint8_t((lo & 0xf) | ((hi & 0xf) << 4)); }
inline int unpack_int4_signed(uint8_t b, int which) {
  int v = which ? (b >> 4) : (b & 0xf);
  return v >= 8 ? v - 16 : v;
}
inline int unpack_int4_unsigned(uint8_t b, int which) { return which ? (b >> 4) : (b & 0xf); }
// MLX: element j of a group of 32/bits values sits at bits [j*bits, (j+1)*bits) of a uint32.
inline uint32_t unpack_mlx(uint32_t word, int bits, int j) {
  return (word >> (j * bits)) & ((1u << bits) - 1u);
}

// ---- one weight matrix ----

// A quantized [out, in] matrix in its on-disk form.
struct QuantizedMatrix {
  QuantFormat format = QuantFormat::None;
  int64_t rows = 0, cols = 0;
  int group_size = 0;  // int4 / MLX; fp8 and int8 are per output channel
  int bits = 0;        // MLX
  std::vector<uint8_t> data;     // F8_E4M3/I8 [rows, cols], U8 [rows, cols/2], or U32 words (MLX)
  std::vector<float> scales;     // [rows] or [rows, cols/group]
  std::vector<uint8_t> zeros;    // int4 with zero points: U8 [rows, cols/group]
  std::vector<float> biases;     // MLX: [rows, cols/group]

  DType data_dtype() const;
  Shape data_shape() const;
  Shape scale_shape() const;
};

// Quantizes row-major w[rows*cols]. Throws (naming `name`) when cols does not fit the format.
// With a pool, pieces of rows run in parallel (the same bytes). int4 groups take the best (least
// squared error) of a few fractions of their range (quant.cpp, kInt4Clips).
QuantizedMatrix quantize_matrix(const float* w, int64_t rows, int64_t cols, QuantFormat format, int group_size,
                                bool zero_points, int bits = 4, const std::string& name = "weight",
                                ThreadPool* pool = nullptr);
void dequantize_matrix(const QuantizedMatrix& q, float* out);

// Dequantizes views of the on-disk tensors (scales/biases of any float dtype; zeros may be null).
void dequantize_views(QuantFormat format, int group_size, int bits, int64_t rows, int64_t cols,
                      const TensorView& data, const TensorView& scales, const TensorView* zeros,
                      const TensorView* biases, float* out);

// ---- packed form for the backends (backend.h QuantMatrixView) ----

// A quantized matrix converted to the backends' canonical packed form (owning):
//   fp8          -> FP8, codes as stored, one scale per row
//   int8         -> Q8,  q + 128 (the byte with its top bit flipped), b = −128·s, group = in
//   int4 sym     -> Q4,  q + 8 (each nibble's top bit flipped), b = −8·s
//   int4 zero pt -> Q4,  q as stored, b = −s·z (f32 product)
//   MLX 4/8 bits -> Q4/Q8, the uint32 words' bytes as they are (little-endian), scales and biases
//                   widened to f32 (exact)
// The backends then hold grouped scales and biases rounded to f16 (backend.h); the int4 scales
// quantize_matrix writes, and MLX's bf16 ones, are f16 values already (so are int4's −s·z).
struct PackedMatrix {
  WeightFormat format = WeightFormat::Q4;
  int64_t rows = 0, cols = 0, group = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales, biases;
  QuantMatrixView view() const { return {format, rows, cols, group, codes, scales, biases}; }
};

// From the on-disk tensors (the arguments of dequantize_views).
PackedMatrix pack_views(QuantFormat format, int group_size, int bits, int64_t rows, int64_t cols,
                        const TensorView& data, const TensorView& scales, const TensorView* zeros,
                        const TensorView* biases);
PackedMatrix pack_matrix(const QuantizedMatrix& q);

// ---- error statistics ----

struct QuantError {
  double sum_sq_err = 0, sum_sq_ref = 0, max_abs = 0;
  int64_t n = 0;
  void add(const float* ref, const float* got, int64_t count);
  void merge(const QuantError& o);
  double rel_fro() const;  // ||w - w_q||_F / ||w||_F
};

// ---- checkpoint converter (`sala quantize`) ----

struct QuantizeOptions {
  QuantFormat format = QuantFormat::INT4;
  int group_size = 64;
  bool zero_points = true;  // int4: measured better than symmetric (docs/quantization.md)
  int bits = 4;  // MLX layout only (tests)
  bool lm_head = false;  // quantize an untied lm_head too (default: kept, see is_quantized_tensor)
};

struct QuantizeReport {
  struct Row {
    std::string name;
    Shape shape;
    std::string kept;  // empty when quantized, else why it was kept ("norm", "embedding", "lm_head")
    QuantError err;
  };
  std::vector<Row> rows;
  QuantError total;
  uint64_t bytes_in = 0, bytes_out = 0;
};

// Whether the converter quantizes an expected tensor: 2-D projections, and lm_head when asked;
// embeddings and norms stay as they are (bf16 in a bf16 checkpoint).
bool is_quantized_tensor(const std::string& name, bool is_vector, bool lm_head = false);

// Streams IN (a model directory) to OUT one tensor at a time: model.safetensors, config.json with
// the quantization section, generation_config.json and tokenizer files copied. `on_row` is called
// for each tensor as it is written. With format MLX it writes the MLX affine layout (tests).
QuantizeReport quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                   const QuantizeOptions& options,
                                   const std::function<void(const QuantizeReport::Row&)>& on_row = {});

}  // namespace sala
