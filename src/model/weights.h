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
struct QuantConfig;

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
// A quantized checkpoint (config.json "quantization", docs/quantization.md) is dequantized to f32
// one tensor at a time on the host; packed shapes are checked against the logical ones. The
// quantization section is read from the config.json beside the checkpoint's files.
ModelWeights bind_weights(const ModelConfig& config, const Checkpoint& checkpoint, Backend& backend);
ModelWeights bind_weights(const ModelConfig& config, const Checkpoint& checkpoint, Backend& backend,
                          const QuantConfig& quant);

// Random weights generated on the backend (benchmarks of full-size shapes without a file), with
// the same scales `sala init` uses.
ModelWeights random_weights(const ModelConfig& config, Backend& backend, uint64_t seed);

// Standard deviation `sala init` uses for a tensor, so activations neither vanish nor explode.
float init_std(const ModelConfig& config, const TensorSpec& t);

}  // namespace sala
