// Memory of a model and its caches from the config, the cache geometry and the loaded weights (no
// measurement). `sala info --context` and every `sala bench` row use these, so they agree.
#pragma once
#include <cstdint>

#include "model/config.h"
#include "model/weights.h"

namespace sala {

struct CacheBytes {
  double kv = 0;          // sparse layers' K and V pages
  double compressed = 0;  // sparse layers' compressed keys K1 and K2 (stored per page)
  double states = 0;      // lightning states (fp32, independent of context)
  double total() const { return kv + compressed + states; }
};

// Caches held by `sequences` sequences of `context` tokens each, in whole pages of block_size
// tokens as the engine keeps them, one lightning state slot per sequence. K/V/K1/K2 take
// `bytes_per_value` each (CUDA bf16: 2, CPU f32: 4); states are fp32.
CacheBytes cache_bytes(const ModelConfig& c, int64_t context, int64_t sequences, double bytes_per_value);

// The pools an Engine allocates for max_sequences x max_context (engine.cpp: every sequence's
// pages, plus two state slots per sequence: the live one and a snapshot).
CacheBytes cache_pool_bytes(const ModelConfig& c, int64_t max_context, int64_t max_sequences, double bytes_per_value);

// Bytes of the weights' backend storage (each buffer counted once).
double weight_bytes(const ModelWeights& w);

}  // namespace sala
