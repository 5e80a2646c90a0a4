#include "model/config.h"

#include <charconv>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_file.h"

namespace sala {

using nlohmann::json;

namespace {

// Typed access to the fields of one JSON object. A missing or null field takes the default; a
// field of the wrong type is an error naming the field (never a nlohmann exception).
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string prefix = "")
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const json* find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const char* key) const { return find(key) != nullptr; }

  [[noreturn]] void bad(const char* key, const json& v, const char* expected) const {
    fail("{}: field '{}{}' = {} must be {}", source_, prefix_, key, v.dump(), expected);
  }

  int as_int(const char* key, const json& v) const {
    // Python tools sometimes write 4096.0; accept integral floats.
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (d == std::floor(d) && std::fabs(d) <= std::numeric_limits<int>::max()) return int(d);
    } else if (v.is_number_integer()) {
      if (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
                                 : v.get<int64_t>() >= std::numeric_limits<int>::min() &&
                                       v.get<int64_t>() <= std::numeric_limits<int>::max())
        return v.get<int>();
    }
    bad(key, v, "an integer");
  }
  int get_int(const char* key, int def) const {
    const json* v = find(key);
    return v ? as_int(key, *v) : def;
  }
  double get_double(const char* key, double def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_number()) bad(key, *v, "a number");
    return v->get<double>();
  }
  bool get_bool(const char* key, bool def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) bad(key, *v, "true or false");
    return v->get<bool>();
  }
  std::string get_string(const char* key, const std::string& def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_string()) bad(key, *v, "a string");
    return v->get<std::string>();
  }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

MixerKind parse_mixer(const std::string& name, size_t index, const std::string& source) {
  if (name == "minicpm4") return MixerKind::Sparse;
  if (name == "lightning" || name == "lightning_attn" || name == "lightning-attn") return MixerKind::Lightning;
  fail("{}: field 'mixer_types[{}]' = \"{}\" is not a known mixer (expected \"minicpm4\" or \"lightning-attn\")",
       source, index, name);
}

// The shortest decimal that reads back as the same float, as a double: 1e-6f is written as
// 1e-06 rather than 9.999999974752427e-07.
double float_for_json(float f) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof buf, f);
  return std::strtod(std::string(buf, res.ptr).c_str(), nullptr);
}

// ALiBi slopes in double (spec §3.5): a geometric series for a power of two; otherwise the
// series of the next lower power of two m, then every second slope of the 2m series.
std::vector<double> alibi_slopes(int n) {
  auto power_of_two = [](int m) {
    double start = std::pow(2.0, -std::pow(2.0, -(std::log2(double(m)) - 3)));
    std::vector<double> s(static_cast<size_t>(m));
    for (int i = 0; i < m; ++i) s[size_t(i)] = start * std::pow(start, i);
    return s;
  };
  int m = 1;
  while (m * 2 <= n) m *= 2;
  std::vector<double> slopes = power_of_two(m);
  if (m != n) {
    std::vector<double> extra = alibi_slopes(2 * m);
    for (size_t i = 0; int(slopes.size()) < n; i += 2) slopes.push_back(extra[i]);
  }
  return slopes;
}

}  // namespace

std::string mixer_name(MixerKind k) { return k == MixerKind::Sparse ? "minicpm4" : "lightning-attn"; }

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: must be a JSON object, got {}", source, j.type_name());
  Fields f(j, source);
  ModelConfig c;
  c.vocab_size = f.get_int("vocab_size", 73448);
  c.hidden_size = f.get_int("hidden_size", 4096);
  c.intermediate_size = f.get_int("intermediate_size", 16384);
  c.num_layers = f.get_int("num_hidden_layers", 32);
  c.num_heads = f.get_int("num_attention_heads", 32);
  c.num_kv_heads = f.get_int("num_key_value_heads", c.num_heads);
  // head_dim: absent -> 128, explicit null -> hidden_size / num_attention_heads (the published class).
  if (!j.contains("head_dim"))
    c.head_dim = 128;
  else
    c.head_dim = f.get_int("head_dim", c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  c.lightning_heads = f.get_int("lightning_nh", c.num_heads);
  c.lightning_kv_heads = f.get_int("lightning_nkv", c.num_kv_heads);  // spec: not lightning_nh
  c.lightning_head_dim = f.get_int("lightning_head_dim", c.head_dim);
  c.rms_norm_eps = float(f.get_double("rms_norm_eps", 1e-6));
  c.rope_theta = f.get_double("rope_theta", 10000.0);
  c.scale_emb = float(f.get_double("scale_emb", 12.0));
  c.scale_depth = float(f.get_double("scale_depth", 1.4));
  c.dim_model_base = f.get_int("dim_model_base", 256);
  c.lightning_scale = f.get_string("lightning_scale", "1/sqrt(d)");
  c.attn_use_output_gate = f.get_bool("attn_use_output_gate", true);
  c.attn_use_rope = f.get_bool("attn_use_rope", false);
  c.lightning_use_rope = f.get_bool("lightning_use_rope", true);
  c.qk_norm = f.get_bool("qk_norm", true);
  c.use_output_norm = f.get_bool("use_output_norm", true);
  c.use_output_gate = f.get_bool("use_output_gate", true);
  c.tie_word_embeddings = f.get_bool("tie_word_embeddings", false);
  c.bos_token_id = f.get_int("bos_token_id", 1);
  c.pad_token_id = f.get_int("pad_token_id", 2);
  c.max_position_embeddings = f.get_int("max_position_embeddings", 524288);
  // Newer transformers write "dtype" instead of "torch_dtype".
  c.torch_dtype = f.get_string("torch_dtype", f.get_string("dtype", "bfloat16"));
  c.random_weights = f.get_bool("sala_random_weights", false);

  if (const json* eos = f.find("eos_token_id")) {
    if (eos->is_array()) {
      if (eos->empty()) f.bad("eos_token_id", *eos, "an integer or a non-empty list of integers");
      c.eos_token_ids.clear();
      for (size_t i = 0; i < eos->size(); ++i)
        c.eos_token_ids.push_back(f.as_int(fmt::format("eos_token_id[{}]", i).c_str(), (*eos)[i]));
    } else {
      c.eos_token_ids = {f.as_int("eos_token_id", *eos)};
    }
  }

  const json* mixers = f.find("mixer_types");
  if (!mixers) fail("{}: field 'mixer_types' is missing (it is mandatory: one entry per layer)", source);
  if (!mixers->is_array()) f.bad("mixer_types", *mixers, "a list of strings");
  for (size_t i = 0; i < mixers->size(); ++i) {
    const json& m = (*mixers)[i];
    if (!m.is_string()) f.bad(fmt::format("mixer_types[{}]", i).c_str(), m, "a string");
    c.mixers.push_back(parse_mixer(m.get<std::string>(), i, source));
  }

  if (const json* sc = f.find("sparse_config")) {
    if (!sc->is_object()) f.bad("sparse_config", *sc, "an object");
    Fields s(*sc, source, "sparse_config.");
    SparseConfig& sp = c.sparse;
    sp.kernel_size = s.get_int("kernel_size", 32);
    sp.kernel_stride = s.get_int("kernel_stride", 16);
    sp.init_blocks = s.get_int("init_blocks", 1);
    sp.block_size = s.get_int("block_size", 64);
    sp.window_size = s.get_int("window_size", 2048);
    sp.topk = s.get_int("topk", 64);
    sp.use_nope = s.get_bool("use_nope", false);
    sp.dense_len = s.get_int("dense_len", 8192);
  }

  c.validate(source);
  return c;
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](const char* field, int v) {
    if (v <= 0) fail("{}: field '{}' = {} must be positive", source, field, v);
  };
  auto multiple = [&](const char* field, int v, const char* of_field, int of) {
    if (v % of != 0) fail("{}: field '{}' = {} must be a multiple of {} ({})", source, field, v, of_field, of);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_layers);
  positive("num_attention_heads", num_heads);
  positive("num_key_value_heads", num_kv_heads);
  positive("head_dim", head_dim);
  positive("lightning_nh", lightning_heads);
  positive("lightning_nkv", lightning_kv_heads);
  positive("lightning_head_dim", lightning_head_dim);
  positive("dim_model_base", dim_model_base);
  positive("max_position_embeddings", max_position_embeddings);

  multiple("num_attention_heads", num_heads, "num_key_value_heads", num_kv_heads);
  // The reference builds lightning layers from num_attention_heads/head_dim and ignores the
  // lightning_* fields; an engine honouring either must see them agree.
  if (lightning_heads != num_heads)
    fail("{}: field 'lightning_nh' = {} must equal num_attention_heads ({})", source, lightning_heads, num_heads);
  if (lightning_head_dim != head_dim)
    fail("{}: field 'lightning_head_dim' = {} must equal head_dim ({})", source, lightning_head_dim, head_dim);
  multiple("lightning_nh", lightning_heads, "lightning_nkv", lightning_kv_heads);
  if (head_dim % 2 != 0) fail("{}: field 'head_dim' = {} must be even (RoPE rotates pairs)", source, head_dim);
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps))
    fail("{}: field 'rms_norm_eps' = {} must be positive", source, rms_norm_eps);
  if (!(rope_theta > 0) || !std::isfinite(rope_theta))
    fail("{}: field 'rope_theta' = {} must be positive", source, rope_theta);

  if (mixers.size() != size_t(num_layers))
    fail("{}: field 'mixer_types' has {} entries but num_hidden_layers = {}", source, mixers.size(), num_layers);

  const SparseConfig& s = sparse;
  positive("sparse_config.kernel_size", s.kernel_size);
  positive("sparse_config.kernel_stride", s.kernel_stride);
  positive("sparse_config.block_size", s.block_size);
  positive("sparse_config.window_size", s.window_size);
  positive("sparse_config.topk", s.topk);
  positive("sparse_config.dense_len", s.dense_len);
  if (s.init_blocks < 0)
    fail("{}: field 'sparse_config.init_blocks' = {} must not be negative", source, s.init_blocks);
  multiple("sparse_config.kernel_size", s.kernel_size, "kernel_stride", s.kernel_stride);
  multiple("sparse_config.block_size", s.block_size, "kernel_stride", s.kernel_stride);
  // Pooling chunk scores into blocks (spec §4.6) needs the level-2 stride and the block size to
  // tile each other.
  if (s.block_size % s.k2_stride() != 0 && s.k2_stride() % s.block_size != 0)
    fail("{}: field 'sparse_config.block_size' = {} and 4*kernel_stride ({}) must divide one another", source,
         s.block_size, s.k2_stride());
  multiple("sparse_config.window_size", s.window_size, "block_size", s.block_size);

  if (bos_token_id < 0 || bos_token_id >= vocab_size)
    fail("{}: field 'bos_token_id' = {} must be in [0, vocab_size = {})", source, bos_token_id, vocab_size);
  for (size_t i = 0; i < eos_token_ids.size(); ++i)
    if (eos_token_ids[i] < 0 || eos_token_ids[i] >= vocab_size)
      fail("{}: field 'eos_token_id[{}]' = {} must be in [0, vocab_size = {})", source, i, eos_token_ids[i],
           vocab_size);
}

double ModelConfig::residual_scale() const { return double(scale_depth) / std::sqrt(double(num_layers)); }

double ModelConfig::lightning_qk_scale() const {
  if (lightning_scale == "1/sqrt(d)") return 1.0 / std::sqrt(double(head_dim));
  if (lightning_scale == "1/d") return 1.0 / double(head_dim);
  return 1.0;
}

int ModelConfig::count(MixerKind kind) const {
  int n = 0;
  for (MixerKind m : mixers) n += m == kind;
  return n;
}

int ModelConfig::kind_index(int layer) const {
  if (layer < 0 || size_t(layer) >= mixers.size())
    fail("layer index {} out of range (model has {} layers)", layer, mixers.size());
  int n = 0;
  for (int i = 0; i < layer; ++i) n += mixers[size_t(i)] == mixers[size_t(layer)];
  return n;
}

std::vector<float> ModelConfig::lightning_log_decay() const {
  std::vector<double> slopes = alibi_slopes(lightning_heads);
  std::vector<float> g(slopes.size());
  for (size_t h = 0; h < slopes.size(); ++h) g[h] = -float(slopes[h]);  // rounded to f32, then negated
  return g;
}

json ModelConfig::to_json() const {
  json mixer_types = json::array();
  for (MixerKind m : mixers) mixer_types.push_back(mixer_name(m));
  json j = {
      {"architectures", json::array({"MiniCPMSALAForCausalLM"})},
      {"model_type", "minicpm_sala"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads},
      {"num_key_value_heads", num_kv_heads},
      {"head_dim", head_dim},
      {"lightning_nh", lightning_heads},
      {"lightning_nkv", lightning_kv_heads},
      {"lightning_head_dim", lightning_head_dim},
      {"rms_norm_eps", float_for_json(rms_norm_eps)},
      {"rope_theta", rope_theta},
      {"scale_emb", float_for_json(scale_emb)},
      {"scale_depth", float_for_json(scale_depth)},
      {"dim_model_base", dim_model_base},
      {"lightning_scale", lightning_scale},
      {"attn_use_output_gate", attn_use_output_gate},
      {"attn_use_rope", attn_use_rope},
      {"lightning_use_rope", lightning_use_rope},
      {"qk_norm", qk_norm},
      {"use_output_norm", use_output_norm},
      {"use_output_gate", use_output_gate},
      {"tie_word_embeddings", tie_word_embeddings},
      {"bos_token_id", bos_token_id},
      {"eos_token_id", eos_token_ids},
      {"pad_token_id", pad_token_id},
      {"max_position_embeddings", max_position_embeddings},
      {"mixer_types", mixer_types},
      {"sparse_config",
       {{"kernel_size", sparse.kernel_size},
        {"kernel_stride", sparse.kernel_stride},
        {"init_blocks", sparse.init_blocks},
        {"block_size", sparse.block_size},
        {"window_size", sparse.window_size},
        {"topk", sparse.topk},
        {"use_nope", sparse.use_nope},
        {"dense_len", sparse.dense_len}}},
      {"torch_dtype", torch_dtype},
  };
  if (random_weights) j["sala_random_weights"] = true;
  return j;
}

ModelConfig ModelConfig::load(const std::filesystem::path& path) {
  std::filesystem::path file = std::filesystem::is_directory(path) ? path / "config.json" : path;
  if (!std::filesystem::exists(file)) fail("model config '{}' does not exist", file.string());
  return from_json(read_json_file(file), file.string());
}

}  // namespace sala
