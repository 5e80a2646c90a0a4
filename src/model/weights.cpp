#include "model/weights.h"

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "io/safetensors.h"

namespace sala {

namespace {

std::string layer_prefix(int i) { return "model.layers." + std::to_string(i) + "."; }

// Tensors a checkpoint may carry that the forward pass does not use (spec §1.3).
bool ignorable(const std::string& name) {
  return name.find("rotary_emb") != std::string::npos || name.find("compress") != std::string::npos;
}

}  // namespace

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  const int64_t D = c.hidden_size, I = c.intermediate_size, d = c.head_dim;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {c.vocab_size, D}, false});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = layer_prefix(i), a = p + "self_attn.";
    t.push_back({p + "input_layernorm.weight", {D}, true});
    t.push_back({p + "post_attention_layernorm.weight", {D}, true});
    if (c.mixers[size_t(i)] == MixerKind::Sparse) {
      t.push_back({a + "q_proj.weight", {c.num_heads * d, D}, false});
      t.push_back({a + "k_proj.weight", {c.num_kv_heads * d, D}, false});
      t.push_back({a + "v_proj.weight", {c.num_kv_heads * d, D}, false});
      t.push_back({a + "o_proj.weight", {D, c.num_heads * d}, false});
      if (c.attn_use_output_gate) t.push_back({a + "o_gate.weight", {c.num_heads * d, D}, false});
    } else {
      const int64_t ld = c.lightning_head_dim;
      t.push_back({a + "q_proj.weight", {c.lightning_heads * ld, D}, false});
      t.push_back({a + "k_proj.weight", {c.lightning_kv_heads * ld, D}, false});
      t.push_back({a + "v_proj.weight", {c.lightning_kv_heads * ld, D}, false});
      t.push_back({a + "o_proj.weight", {D, c.lightning_heads * ld}, false});
      if (c.use_output_gate) t.push_back({a + "z_proj.weight", {c.lightning_heads * ld, D}, false});
      if (c.qk_norm) {
        t.push_back({a + "q_norm.weight", {ld}, true});
        t.push_back({a + "k_norm.weight", {ld}, true});
      }
      if (c.use_output_norm) t.push_back({a + "o_norm.weight", {c.lightning_heads * ld}, true});
    }
    t.push_back({p + "mlp.gate_proj.weight", {I, D}, false});
    t.push_back({p + "mlp.up_proj.weight", {I, D}, false});
    t.push_back({p + "mlp.down_proj.weight", {D, I}, false});
  }
  t.push_back({"model.norm.weight", {D}, true});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, D}, false});
  return t;
}

float init_std(const ModelConfig& c, const TensorSpec& t) {
  if (t.is_vector) return 0.1f;  // around mean 1: norms that are not all-ones
  if (t.name == "model.embed_tokens.weight") return 1.0f / c.scale_emb;  // embedded rows have RMS ~1
  // lm_head: logits of std ~1 after the /logit_divisor scaling, so random models sample varied text.
  if (t.name == "lm_head.weight") return float(c.logit_divisor() / std::sqrt(double(t.shape[1])));
  return float(1.0 / std::sqrt(double(t.shape[1])));  // unit-variance outputs for unit inputs
}

namespace {

// Assigns loaded tensors to their slots in ModelWeights by checkpoint name.
template <typename Load>
ModelWeights assemble(const ModelConfig& c, Load&& load) {
  ModelWeights mw;
  mw.embed = load("model.embed_tokens.weight");
  mw.final_norm = load("model.norm.weight");
  mw.lm_head = load(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = layer_prefix(i), a = p + "self_attn.";
    LayerWeights lw;
    lw.kind = c.mixers[size_t(i)];
    lw.input_norm = load(p + "input_layernorm.weight");
    lw.post_norm = load(p + "post_attention_layernorm.weight");
    lw.q = load(a + "q_proj.weight");
    lw.k = load(a + "k_proj.weight");
    lw.v = load(a + "v_proj.weight");
    lw.o = load(a + "o_proj.weight");
    if (lw.kind == MixerKind::Sparse) {
      if (c.attn_use_output_gate) lw.o_gate = load(a + "o_gate.weight");
    } else {
      if (c.use_output_gate) lw.z = load(a + "z_proj.weight");
      if (c.qk_norm) {
        lw.q_norm = load(a + "q_norm.weight");
        lw.k_norm = load(a + "k_norm.weight");
      }
      if (c.use_output_norm) lw.o_norm = load(a + "o_norm.weight");
    }
    lw.gate = load(p + "mlp.gate_proj.weight");
    lw.up = load(p + "mlp.up_proj.weight");
    lw.down = load(p + "mlp.down_proj.weight");
    mw.layers.push_back(std::move(lw));
  }
  return mw;
}

}  // namespace

ModelWeights bind_weights(const ModelConfig& c, const Checkpoint& ckpt, Backend& backend) {
  const auto expected = expected_tensors(c);
  std::map<std::string, const TensorSpec*> by_name;
  for (const auto& t : expected) by_name[t.name] = &t;

  // Disabled steps may still ship their weights (spec §1.1): those are ignored, not unexpected.
  auto disabled_step = [&](const std::string& name) {
    for (const char* s : {"o_gate.weight", "z_proj.weight", "q_norm.weight", "k_norm.weight", "o_norm.weight"})
      if (name.size() > std::string(s).size() && name.ends_with(std::string(".") + s)) return true;
    return name == "lm_head.weight" && c.tie_word_embeddings;
  };

  std::vector<std::string> missing, unexpected, bad_shape;
  for (const auto& t : expected) {
    if (!ckpt.contains(t.name)) {
      missing.push_back(t.name);
      continue;
    }
    const TensorView& v = ckpt.get(t.name);
    if (v.shape != t.shape)
      bad_shape.push_back(fmt::format("{} is {} (expected {})", t.name, shape_str(v.shape), shape_str(t.shape)));
    else if (!dtype_is_float(v.dtype))
      bad_shape.push_back(fmt::format("{} has dtype {} (expected a float type)", t.name, dtype_name(v.dtype)));
  }
  for (const auto& [name, view] : ckpt.tensors())
    if (!by_name.count(name) && !ignorable(name) && !disabled_step(name)) unexpected.push_back(name);

  if (!missing.empty() || !unexpected.empty() || !bad_shape.empty()) {
    std::string msg = "checkpoint does not match config.json:";
    auto list = [&](const char* what, const std::vector<std::string>& items) {
      if (items.empty()) return;
      msg += fmt::format("\n  {} ({}):", what, items.size());
      for (size_t i = 0; i < items.size() && i < 20; ++i) msg += "\n    " + items[i];
      if (items.size() > 20) msg += fmt::format("\n    ... and {} more", items.size() - 20);
    };
    list("missing tensors", missing);
    list("unexpected tensors", unexpected);
    list("wrong shape or dtype", bad_shape);
    throw Error(msg);
  }

  return assemble(c, [&](const std::string& name) {
    const TensorView& v = ckpt.get(name);
    return v.shape.size() == 1 ? backend.load_vector(v) : backend.load_weight(v);
  });
}

ModelWeights random_weights(const ModelConfig& c, Backend& backend, uint64_t seed) {
  const auto expected = expected_tensors(c);
  std::map<std::string, std::pair<const TensorSpec*, uint64_t>> by_name;
  for (size_t i = 0; i < expected.size(); ++i) by_name[expected[i].name] = {&expected[i], seed * 1000003ull + i};
  return assemble(c, [&](const std::string& name) {
    const auto& [t, stream] = by_name.at(name);
    const float mean = t->is_vector ? 1.0f : 0.0f;
    return backend.random_weight(t->is_vector ? 1 : t->shape[0], t->is_vector ? t->shape[0] : t->shape[1], mean,
                                 init_std(c, *t), stream);
  });
}

}  // namespace sala
