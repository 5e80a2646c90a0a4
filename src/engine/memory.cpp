#include "engine/memory.h"

#include <algorithm>
#include <unordered_set>

namespace sala {

namespace {

// Pages of `context` tokens for one sequence, and the cache bytes of that many pages plus `slots`
// lightning state slots (layouts of backend.h: K1/K2 rows per page are block/stride, block/4stride).
CacheBytes pages_bytes(const ModelConfig& c, int64_t pages, int64_t slots, double bpv) {
  const auto& s = c.sparse;
  const int ns = c.count(MixerKind::Sparse), nl = c.count(MixerKind::Lightning);
  const double row = double(c.num_kv_heads) * c.head_dim * bpv;  // one token's K (or V)
  const int k1_per_page = std::max(1, s.block_size / s.kernel_stride);
  const int k2_per_page = std::max(1, s.block_size / (4 * s.kernel_stride));
  CacheBytes b;
  b.kv = 2.0 * ns * double(pages) * s.block_size * row;
  b.compressed = double(ns) * double(pages) * (k1_per_page + k2_per_page) * row;
  b.states = double(slots) * nl * c.lightning_heads * double(c.lightning_head_dim) * c.lightning_head_dim * 4;
  return b;
}

int64_t pages_of(const ModelConfig& c, int64_t context) {
  return (context + c.sparse.block_size - 1) / c.sparse.block_size;
}

}  // namespace

CacheBytes cache_bytes(const ModelConfig& c, int64_t context, int64_t sequences, double bpv) {
  return pages_bytes(c, pages_of(c, context) * sequences, sequences, bpv);
}

CacheBytes cache_pool_bytes(const ModelConfig& c, int64_t max_context, int64_t max_sequences, double bpv) {
  return pages_bytes(c, pages_of(c, max_context) * max_sequences, 2 * max_sequences, bpv);
}

double weight_bytes(const ModelWeights& w) {
  std::unordered_set<const Buffer*> seen;
  double total = 0;
  auto add = [&](const Weight& x) {
    if (x.storage && seen.insert(x.storage.get()).second) total += double(x.storage->size());
  };
  add(w.embed), add(w.final_norm), add(w.lm_head);
  for (const LayerWeights& l : w.layers)
    for (const Weight* x : {&l.input_norm, &l.post_norm, &l.q, &l.k, &l.v, &l.o, &l.o_gate, &l.z, &l.q_norm,
                            &l.k_norm, &l.o_norm, &l.gate, &l.up, &l.down})
      add(*x);
  return total;
}

}  // namespace sala
