// Binding a checkpoint's tensors to the model's layers (spec §1.3), with shape checks. Missing and
// unexpected tensors are reported together in one error.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace sala {

class Checkpoint;
class ThreadPool;
struct QuantConfig;
struct QuantizeOptions;

struct LayerWeights {
  MixerKind kind = MixerKind::Lightning;
  Weight input_norm, post_norm;
  Weight q, k, v, o;      // both kinds
  Weight o_gate;          // sparse layers (attn_use_output_gate)
  Weight z;               // lightning output gate (use_output_gate)
  Weight q_norm, k_norm;  // lightning qk_norm, [1, head_dim]
  Weight o_norm;          // lightning use_output_norm, [1, heads*dim]
  Weight gate, up, down;  // SwiGLU MLP
};

struct ModelWeights {
  Weight embed, final_norm, lm_head;
  std::vector<LayerWeights> layers;
  // Checkpoint tensors stored quantized but loaded dense: the embedding table (a gather reads one
  // row per token, so packing it would save memory, not bandwidth). Listed by load_model_verbose.
  std::vector<std::string> dequantized;
  // Group scales and biases the checkpoint stores beyond f16's precision (f32 ones, as `sala
  // quantize` wrote before 2026-11-27), which the backends round to f16 (backend.h): how many of
  // how many, and the largest relative change. Listed by describe_weight_formats.
  int64_t params_rounded = 0, params_stored = 0;
  double params_rounded_max_rel = 0;
};

// One expected tensor: its checkpoint name and shape.
struct TensorSpec {
  std::string name;
  Shape shape;
  bool is_vector;  // 1-D norm weight
};

// Every tensor the config requires, in checkpoint naming (spec §1.3).
std::vector<TensorSpec> expected_tensors(const ModelConfig& config);

// Checks names and shapes (ignoring "*rotary_emb*" and "*compress*" tensors and weights of
// disabled steps) and uploads every tensor through the backend.
// A quantized checkpoint (config.json "quantization", docs/quantization.md) keeps its matrices
// packed (Backend::load_quantized_weight, one tensor converted at a time on the host); a quantized
// embedding table is dequantized (ModelWeights::dequantized). Packed shapes are checked against
// the logical ones. The quantization section is read from the config.json beside the checkpoint.
ModelWeights bind_weights(const ModelConfig& config, const Checkpoint& checkpoint, Backend& backend);
ModelWeights bind_weights(const ModelConfig& config, const Checkpoint& checkpoint, Backend& backend,
                          const QuantConfig& quant);

// Random weights generated on the backend (benchmarks of full-size shapes without a file), with
// the same scales `sala init` uses. With a packed format, the tensors `sala quantize` quantizes
// (every projection; lm_head when asked; not embeddings, norms) are random packed codes instead.
struct RandomQuant {
  WeightFormat format = WeightFormat::Dense;
  int64_t group = 0;     // Q4 (64 from parse_random_quant), Q8 in groups (MLX 8-bit); 0: one scale per row
  bool lm_head = false;  // an untied lm_head packed too (`sala quantize --lm-head`)
};
// "none"/"bf16" (dense), "fp8", "int8" (Q8 per row), "int4" (Q4, group 64); else an error.
RandomQuant parse_random_quant(const std::string& name);
ModelWeights random_weights(const ModelConfig& config, Backend& backend, uint64_t seed, const RandomQuant& quant = {});

// The dense matrices of `weights` quantized in place, each as `sala quantize` quantizes its tensor
// (quantize_matrix on the values the backend holds: bf16 on CUDA, f32 on CPU; rows on `pool`),
// then packed on the backend: the projections, and an untied lm_head with options.lm_head. One
// matrix is on the host at a time. What `sala quant-quality` measures without writing a checkpoint.
void quantize_weights(const ModelConfig& config, ModelWeights& weights, Backend& backend,
                      const QuantizeOptions& options, ThreadPool* pool = nullptr);

// One line on how the matrices are held, e.g. "224 q4 (group 64), 1 dense: 5.31 GB, 0.59 bytes/param";
// plus the tensors dequantized at load, if any.
std::string describe_weight_formats(const ModelConfig& config, const ModelWeights& weights);
// Bytes per parameter the decode step reads for its matrices (the roofline's weight term):
// the actual bytes of every projection and the lm_head (untied), over their parameter count.
double weight_bytes_per_param(const ModelConfig& config, const ModelWeights& weights);

// Standard deviation `sala init` uses for a tensor, so activations neither vanish nor explode.
float init_std(const ModelConfig& config, const TensorSpec& t);

}  // namespace sala
