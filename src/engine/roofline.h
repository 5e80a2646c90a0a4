// Speed-of-light accounting for the whole model: bytes that one decode step must move and FLOPs
// one prefilled token costs, from the config alone (no measurement). `sala bench` divides these
// by the measured ceilings of the machine.
#pragma once
#include <cstdint>

#include "model/config.h"

namespace sala {

struct TokenCost {
  double weight_bytes = 0;  // matrices read once per decode step (shared by the batch)
  double state_bytes = 0;   // lightning states read + written, per sequence
  double kv_bytes = 0;      // sparse-layer keys/values/compressed keys read, per sequence
  double flops = 0;         // per token
  double bytes_per_step(int batch) const { return weight_bytes + batch * (state_bytes + kv_bytes); }
};

// Decode step of one token per sequence at `context` tokens; weights and caches in bf16 (2 bytes),
// states in fp32.
TokenCost decode_cost(const ModelConfig& c, int64_t context, double weight_bytes_per_param = 2.0);

// FLOPs per token of a prefill of `prompt` tokens (matmuls + attention averaged over the prompt).
double prefill_flops_per_token(const ModelConfig& c, int64_t prompt);

// Bytes of all weight matrices (bf16) excluding the embedding table, which decode only gathers.
double matmul_weight_bytes(const ModelConfig& c, double bytes_per_param = 2.0);

}  // namespace sala
