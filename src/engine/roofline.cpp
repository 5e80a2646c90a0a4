#include "engine/roofline.h"

#include <algorithm>

#include "model/weights.h"

namespace sala {

double matmul_weight_bytes(const ModelConfig& c, double bpp) {
  double params = 0;
  for (const auto& t : expected_tensors(c))
    if (!t.is_vector && t.name != "model.embed_tokens.weight") params += double(shape_numel(t.shape));
  return params * bpp;
}

// Keys one sparse-layer query attends to at position p (spec §4.7–4.8): all of them while dense,
// at most budget * block_size in the sparse regime.
static double attended_keys(const ModelConfig& c, int64_t p, bool sparse) {
  const int64_t T = p + 1;
  if (!sparse) return double(T);
  return double(std::min<int64_t>(T, int64_t(c.sparse.budget_blocks()) * c.sparse.block_size));
}

TokenCost decode_cost(const ModelConfig& c, int64_t context, double bpp) {
  TokenCost t;
  t.weight_bytes = matmul_weight_bytes(c, bpp) + double(c.hidden_size) * bpp;  // + one embedding row
  const int nl = c.count(MixerKind::Lightning), ns = c.count(MixerKind::Sparse);
  t.state_bytes = 2.0 * nl * c.lightning_heads * double(c.lightning_head_dim) * c.lightning_head_dim * 4;
  const double kv_row = double(c.num_kv_heads) * c.head_dim * 2;  // one token's K (or V) in bf16
  double per_layer = 2 * attended_keys(c, context - 1, context >= c.sparse.dense_len) * kv_row;
  if (context >= c.sparse.dense_len) per_layer += double(c.sparse.n1(context) + c.sparse.n2(context)) * kv_row;
  t.kv_bytes = ns * per_layer;
  t.flops = prefill_flops_per_token(c, 1);  // matmuls dominate; attention of one token added below
  t.flops += ns * 4.0 * c.num_heads * c.head_dim * attended_keys(c, context - 1, context >= c.sparse.dense_len);
  return t;
}

double prefill_flops_per_token(const ModelConfig& c, int64_t prompt) {
  double f = 2.0 * matmul_weight_bytes(c, 1.0);  // 2 FLOPs per weight
  const int nl = c.count(MixerKind::Lightning), ns = c.count(MixerKind::Sparse);
  const double d = c.lightning_head_dim;
  // Chunked GLA (chunk 64): intra-chunk scores and outputs + state read/update, per head.
  f += nl * c.lightning_heads * (2.0 * 64 * d * 2 + 2.0 * d * d * 2);
  // Sparse layers: QK and PV over the attended keys, averaged over the prompt's positions.
  double keys = 0;
  const int64_t samples = std::min<int64_t>(prompt, 64);
  for (int64_t i = 0; i < samples; ++i) keys += attended_keys(c, (prompt - 1) * (2 * i + 1) / (2 * samples), prompt >= c.sparse.dense_len);
  f += ns * 4.0 * c.num_heads * c.head_dim * (keys / double(samples));
  return f;
}

}  // namespace sala
