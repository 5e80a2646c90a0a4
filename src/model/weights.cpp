#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "backend/quant_layout.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/quant.h"

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

// Assigns loaded tensors to their slots in ModelWeights by checkpoint name; load(name, gathered)
// is told whether the slot is the embedding table (gathered) or a matrix of a product.
template <typename Load>
ModelWeights assemble(const ModelConfig& c, Load&& load) {
  ModelWeights mw;
  mw.embed = load("model.embed_tokens.weight", true);  // gathered, not multiplied: stays dense
  mw.final_norm = load("model.norm.weight", false);
  mw.lm_head = load(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", false);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = layer_prefix(i), a = p + "self_attn.";
    LayerWeights lw;
    lw.kind = c.mixers[size_t(i)];
    lw.input_norm = load(p + "input_layernorm.weight", false);
    lw.post_norm = load(p + "post_attention_layernorm.weight", false);
    lw.q = load(a + "q_proj.weight", false);
    lw.k = load(a + "k_proj.weight", false);
    lw.v = load(a + "v_proj.weight", false);
    lw.o = load(a + "o_proj.weight", false);
    if (lw.kind == MixerKind::Sparse) {
      if (c.attn_use_output_gate) lw.o_gate = load(a + "o_gate.weight", false);
    } else {
      if (c.use_output_gate) lw.z = load(a + "z_proj.weight", false);
      if (c.qk_norm) {
        lw.q_norm = load(a + "q_norm.weight", false);
        lw.k_norm = load(a + "k_norm.weight", false);
      }
      if (c.use_output_norm) lw.o_norm = load(a + "o_norm.weight", false);
    }
    lw.gate = load(p + "mlp.gate_proj.weight", false);
    lw.up = load(p + "mlp.up_proj.weight", false);
    lw.down = load(p + "mlp.down_proj.weight", false);
    mw.layers.push_back(std::move(lw));
  }
  return mw;
}

}  // namespace

ModelWeights bind_weights(const ModelConfig& c, const Checkpoint& ckpt, Backend& backend) {
  // The quantization section lives in the config.json beside the weights (ModelConfig ignores it).
  QuantConfig q;
  if (!ckpt.files().empty()) q = load_quant_config(ckpt.files().front().parent_path());
  return bind_weights(c, ckpt, backend, q);
}

namespace {

// How one 2-D weight is stored in a (possibly quantized) checkpoint.
struct WeightPlan {
  QuantFormat format = QuantFormat::None;
  int group = 0, bits = 0;
  std::string scale, zero, bias;  // companion tensor names (zero/bias may be empty)
};

}  // namespace

ModelWeights bind_weights(const ModelConfig& c, const Checkpoint& ckpt, Backend& backend, const QuantConfig& q) {
  const auto expected = expected_tensors(c);
  std::map<std::string, const TensorSpec*> by_name;
  for (const auto& t : expected) by_name[t.name] = &t;
  std::set<std::string> companions;  // scale/zero/bias tensors claimed by an expected weight
  std::map<std::string, WeightPlan> plans;

  // Disabled steps may still ship their weights (spec §1.1): those are ignored, not unexpected.
  auto disabled_step = [&](const std::string& name) {
    for (const char* s : {"o_gate.weight", "z_proj.weight", "q_norm.weight", "k_norm.weight", "o_norm.weight"})
      if (name.size() > std::string(s).size() && name.ends_with(std::string(".") + s)) return true;
    return name == "lm_head.weight" && c.tie_word_embeddings;
  };
  // Companions of ignored tensors are ignored with them.
  auto companion_of_ignored = [&](const std::string& name) {
    for (const char* suf : {"_scale", "_zero"})
      if (name.ends_with(suf)) {
        const std::string w = name.substr(0, name.size() - std::string(suf).size());
        return ignorable(w) || disabled_step(w);
      }
    for (const char* suf : {".scales", ".biases"})
      if (name.ends_with(suf)) {
        const std::string w = name.substr(0, name.size() - std::string(suf).size()) + ".weight";
        return ignorable(w) || disabled_step(w);
      }
    return false;
  };

  std::vector<std::string> missing, unexpected, bad_shape;
  auto float_check = [&](const std::string& name, const TensorView& v, const Shape& shape, const char* what) {
    if (v.shape != shape)
      bad_shape.push_back(fmt::format("{} is {} (expected {}{})", name, shape_str(v.shape), shape_str(shape), what));
    else if (!dtype_is_float(v.dtype))
      bad_shape.push_back(fmt::format("{} has dtype {} (expected a float type)", name, dtype_name(v.dtype)));
  };
  auto packed_check = [&](const std::string& name, const TensorView& v, DType dt, const Shape& shape,
                          const std::string& logical) {
    if (v.dtype != dt || v.shape != shape)
      bad_shape.push_back(fmt::format("{} is {} {} (expected {} {}: {} packed as {})", name, dtype_name(v.dtype),
                                      shape_str(v.shape), dtype_name(dt), shape_str(shape), logical,
                                      quant_format_name(q.format)));
  };

  for (const auto& t : expected) {
    if (!ckpt.contains(t.name)) {
      missing.push_back(t.name);
      continue;
    }
    const TensorView& v = ckpt.get(t.name);
    if (t.is_vector || !q.quantized()) {
      float_check(t.name, v, t.shape, "");
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const std::string logical = shape_str(t.shape);
    const std::string base = t.name.substr(0, t.name.size() - std::string(".weight").size());
    if (q.format == QuantFormat::MLX) {
      const std::string sn = base + ".scales", bn = base + ".biases";
      if (!ckpt.contains(sn) && dtype_is_float(v.dtype)) {  // left unquantized
        float_check(t.name, v, t.shape, "");
        continue;
      }
      WeightPlan p{QuantFormat::MLX, q.group_size, q.bits, sn, "", bn};
      if (cols % q.group_size != 0 || (cols * q.bits) % 32 != 0) {
        bad_shape.push_back(fmt::format("{}: {} columns do not fit group_size {} of {} bits", t.name, cols,
                                        q.group_size, q.bits));
        continue;
      }
      packed_check(t.name, v, DType::U32, {rows, cols * q.bits / 32}, logical);
      const Shape ss{rows, cols / q.group_size};
      for (const std::string& cn : {sn, bn}) {
        companions.insert(cn);
        if (!ckpt.contains(cn))
          missing.push_back(cn);
        else
          float_check(cn, ckpt.get(cn), ss, fmt::format(" for {} with group_size {}", logical, q.group_size).c_str());
      }
      plans[t.name] = p;
      continue;
    }
    const std::string sn = t.name + "_scale", zn = t.name + "_zero";
    if (!ckpt.contains(sn) && dtype_is_float(v.dtype)) {  // kept in a float type (embeddings, lm_head)
      float_check(t.name, v, t.shape, "");
      continue;
    }
    companions.insert(sn);
    WeightPlan p{q.format, q.group_size, 0, sn, "", ""};
    Shape ss{rows};
    if (q.format == QuantFormat::INT4) {
      if (cols % q.group_size != 0) {
        bad_shape.push_back(
            fmt::format("{}: {} columns are not a multiple of group_size {}", t.name, cols, q.group_size));
        continue;
      }
      packed_check(t.name, v, DType::U8, {rows, cols / 2}, logical);
      ss = {rows, cols / q.group_size};
      if (ckpt.contains(zn)) {
        companions.insert(zn);
        p.zero = zn;
        const TensorView& z = ckpt.get(zn);
        if (z.dtype != DType::U8 || z.shape != ss)
          bad_shape.push_back(fmt::format("{} is {} {} (expected U8 {})", zn, dtype_name(z.dtype),
                                          shape_str(z.shape), shape_str(ss)));
      }
    } else {
      packed_check(t.name, v, q.format == QuantFormat::FP8 ? DType::F8_E4M3 : DType::I8, t.shape, logical);
    }
    if (!ckpt.contains(sn)) {
      missing.push_back(sn);
      continue;
    }
    const TensorView& s = ckpt.get(sn);
    const Shape s2{rows, 1};
    float_check(sn, s, (q.format != QuantFormat::INT4 && s.shape == s2) ? s2 : ss,
                q.format == QuantFormat::INT4
                    ? fmt::format(" for {} with group_size {}", logical, q.group_size).c_str()
                    : fmt::format(" for {}: one scale per output channel", logical).c_str());
    plans[t.name] = p;
  }
  for (const auto& [name, view] : ckpt.tensors())
    if (!by_name.count(name) && !companions.count(name) && !ignorable(name) && !disabled_step(name) &&
        !companion_of_ignored(name))
      unexpected.push_back(name);

  if (!missing.empty() || !unexpected.empty() || !bad_shape.empty()) {
    std::string msg = "checkpoint does not match config.json";
    if (q.quantized()) msg += fmt::format(" (quantization: {})", quant_format_name(q.format));
    msg += ":";
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

  std::vector<std::string> dequantized;
  int64_t rounded = 0, stored = 0;
  double max_rel = 0;
  ModelWeights mw = assemble(c, [&](const std::string& name, bool gathered) {
    const TensorView& v = ckpt.get(name);
    if (v.shape.size() == 1) return backend.load_vector(v);
    auto it = plans.find(name);
    if (it == plans.end()) return backend.load_weight(v);
    // One tensor at a time is converted on the host and freed: never the whole model twice.
    const WeightPlan& p = it->second;
    const TensorSpec& t = *by_name.at(name);
    const TensorView* zero = p.zero.empty() ? nullptr : &ckpt.get(p.zero);
    const TensorView* bias = p.bias.empty() ? nullptr : &ckpt.get(p.bias);
    if (gathered) {
      std::vector<float> w(size_t(shape_numel(t.shape)));
      dequantize_views(p.format, p.group, p.bits, t.shape[0], t.shape[1], v, ckpt.get(p.scale), zero, bias, w.data());
      dequantized.push_back(name);
      return backend.load_weight(TensorView{w.data(), DType::F32, t.shape});
    }
    const PackedMatrix pm = pack_views(p.format, p.group, p.bits, t.shape[0], t.shape[1], v, ckpt.get(p.scale), zero, bias);
    if (pm.group < pm.cols) {  // grouped: held as f16; note what the checkpoint stored finer
      auto count = [&](const std::vector<float>& values) {
        for (const float x : values) {
          const float r = qlayout::group_param(x);
          rounded += r != x;
          stored += 1;
          if (x != 0) max_rel = std::max(max_rel, std::fabs(double(r) - double(x)) / std::fabs(double(x)));
        }
      };
      count(pm.scales);
      if (bias) count(pm.biases);  // stored biases (MLX); int4's −s·z is the format's own
    }
    return backend.load_quantized_weight(pm.view(), name);
  });
  mw.dequantized = std::move(dequantized);
  mw.params_rounded = rounded, mw.params_stored = stored, mw.params_rounded_max_rel = max_rel;
  return mw;
}

RandomQuant parse_random_quant(const std::string& name) {
  if (name == "none" || name == "bf16" || name.empty()) return {};
  if (name == "fp8") return {WeightFormat::FP8, 0};
  if (name == "int8") return {WeightFormat::Q8, 0};
  if (name == "int4") return {WeightFormat::Q4, 64};
  fail("unknown weight quantization '{}' (known: none, fp8, int8, int4)", name);
}

ModelWeights random_weights(const ModelConfig& c, Backend& backend, uint64_t seed, const RandomQuant& quant) {
  const auto expected = expected_tensors(c);
  std::map<std::string, std::pair<const TensorSpec*, uint64_t>> by_name;
  for (size_t i = 0; i < expected.size(); ++i) by_name[expected[i].name] = {&expected[i], seed * 1000003ull + i};
  return assemble(c, [&](const std::string& name, bool gathered) {
    const auto& [t, stream] = by_name.at(name);
    if (quant.format != WeightFormat::Dense && !gathered && is_quantized_tensor(name, t->is_vector, quant.lm_head)) {
      const int64_t cols = t->shape[1];
      const int64_t group = quant.format != WeightFormat::FP8 && quant.group > 0 ? quant.group : cols;  // 0: per row
      SALA_CHECK(cols % group == 0, "random {} weights: {} has {} columns, not a multiple of group {}",
                 weight_format_name(quant.format), name, cols, group);
      return backend.random_quantized_weight(quant.format, t->shape[0], cols, group, init_std(c, *t), stream);
    }
    const float mean = t->is_vector ? 1.0f : 0.0f;
    return backend.random_weight(t->is_vector ? 1 : t->shape[0], t->is_vector ? t->shape[0] : t->shape[1], mean,
                                 init_std(c, *t), stream);
  });
}

namespace {

// A layer's matrices of products (absent ones have no data) and their checkpoint names after the
// layer prefix.
struct LayerMatrix {
  const char* name;
  Weight LayerWeights::*field;
};
constexpr LayerMatrix kLayerMatrices[] = {
    {"self_attn.q_proj.weight", &LayerWeights::q},   {"self_attn.k_proj.weight", &LayerWeights::k},
    {"self_attn.v_proj.weight", &LayerWeights::v},   {"self_attn.o_proj.weight", &LayerWeights::o},
    {"self_attn.o_gate.weight", &LayerWeights::o_gate}, {"self_attn.z_proj.weight", &LayerWeights::z},
    {"mlp.gate_proj.weight", &LayerWeights::gate},   {"mlp.up_proj.weight", &LayerWeights::up},
    {"mlp.down_proj.weight", &LayerWeights::down},
};

}  // namespace

void quantize_weights(const ModelConfig& c, ModelWeights& mw, Backend& backend, const QuantizeOptions& opt,
                      ThreadPool* pool) {
  SALA_CHECK(opt.format != QuantFormat::None, "quantize_weights: no format given");
  const int group = opt.format == QuantFormat::INT4 || opt.format == QuantFormat::MLX ? opt.group_size : 0;
  const bool zeros = opt.format == QuantFormat::INT4 && opt.zero_points;
  auto one = [&](Weight& w, const std::string& name) {
    if (!w.w.data || w.packed()) return;
    const int64_t rows = w.out(), cols = w.in();
    std::vector<float> host(size_t(rows * cols));
    backend.download(w.w, host.data());
    const QuantizedMatrix q = quantize_matrix(host.data(), rows, cols, opt.format, group, zeros, opt.bits, name, pool);
    host = {};
    w = Weight{};  // the dense copy is freed before the packed one is allocated
    w = backend.load_quantized_weight(pack_matrix(q).view(), name);
  };
  for (int i = 0; i < c.num_layers; ++i)
    for (const LayerMatrix& m : kLayerMatrices) one(mw.layers[size_t(i)].*m.field, layer_prefix(i) + m.name);
  if (opt.lm_head && !c.tie_word_embeddings) one(mw.lm_head, "lm_head.weight");
}

namespace {

// The matrices of products the decode step reads (lm_head only when untied, as matmul_weight_bytes).
std::vector<const Weight*> product_weights(const ModelConfig& c, const ModelWeights& mw) {
  std::vector<const Weight*> ws;
  for (const LayerWeights& l : mw.layers)
    for (const LayerMatrix& m : kLayerMatrices)
      if ((l.*m.field).w.data) ws.push_back(&(l.*m.field));
  if (!c.tie_word_embeddings) ws.push_back(&mw.lm_head);
  return ws;
}

}  // namespace

double weight_bytes_per_param(const ModelConfig& c, const ModelWeights& mw) {
  double bytes = 0, params = 0;
  for (const Weight* w : product_weights(c, mw)) {
    bytes += double(w->nbytes());
    params += double(w->out()) * double(w->in());
  }
  return params > 0 ? bytes / params : 0;
}

std::string describe_weight_formats(const ModelConfig& c, const ModelWeights& mw) {
  std::map<std::string, int> counts;
  double bytes = 0;
  for (const Weight* w : product_weights(c, mw)) {
    std::string key = w->packed() ? weight_format_name(w->format) : "dense " + std::string(dtype_name(w->w.dtype));
    if (w->format == WeightFormat::Q4 || (w->format == WeightFormat::Q8 && w->group != w->in()))
      key += fmt::format(" (group {}{})", w->group, w->zero_packed ? ", zero points packed in the scales" : "");
    else if (w->packed())
      key += " (per row)";
    counts[key]++;
    bytes += double(w->nbytes());
  }
  std::string s;
  for (const auto& [k, n] : counts) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", n, k);
  s += fmt::format(": {:.2f} GB of matrices, {:.3f} bytes/param", bytes / 1e9, weight_bytes_per_param(c, mw));
  if (!mw.dequantized.empty()) {
    s += "; dequantized at load (gathered, not multiplied):";
    for (const auto& n : mw.dequantized) s += " " + n;
  }
  if (mw.params_rounded > 0)
    s += fmt::format("; {} of {} group scales/biases rounded to f16 as the backends hold them (largest change {:.1e} "
                     "relative; the checkpoint stores them finer)",
                     mw.params_rounded, mw.params_stored, mw.params_rounded_max_rel);
  return s;
}

}  // namespace sala
