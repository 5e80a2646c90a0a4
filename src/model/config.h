// The typed model configuration (spec §1.1), parsed from config.json and validated.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace sala {

enum class MixerKind { Sparse, Lightning };

struct SparseConfig {
  int kernel_size = 32;    // K1 window (tokens)
  int kernel_stride = 16;  // K1 stride
  int init_blocks = 1;     // leading blocks always selected
  int block_size = 64;     // selection granularity = KV page size
  int window_size = 2048;  // local window in tokens (window_size / block_size forced blocks before qb)
  int topk = 64;           // free picks; budget = topk + window_size/block_size
  bool use_nope = false;   // only meaningful with RoPE on; ignored
  int dense_len = 8192;    // dense iff T < dense_len

  int k2_size() const { return 4 * kernel_size; }
  int k2_stride() const { return 4 * kernel_stride; }
  int local_blocks() const { return window_size / block_size; }
  int budget_blocks() const { return topk + local_blocks(); }
  // Number of complete compressed chunks over T tokens (spec §4.4).
  int64_t n1(int64_t T) const { return T < kernel_size ? 0 : (T - kernel_size) / kernel_stride + 1; }
  int64_t n2(int64_t T) const { return T < k2_size() ? 0 : (T - k2_size()) / k2_stride() + 1; }
};

struct ModelConfig {
  int vocab_size = 73448;
  int hidden_size = 4096;
  int intermediate_size = 16384;
  int num_layers = 32;
  int num_heads = 32;     // query heads, both kinds
  int num_kv_heads = 2;   // KV heads of sparse layers
  int head_dim = 128;
  int lightning_heads = 32;
  int lightning_kv_heads = 32;
  int lightning_head_dim = 128;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  float scale_emb = 12.0f;
  float scale_depth = 1.4f;
  int dim_model_base = 256;
  std::string lightning_scale = "1/sqrt(d)";
  bool attn_use_output_gate = true;
  bool attn_use_rope = false;
  bool lightning_use_rope = true;
  bool qk_norm = true;
  bool use_output_norm = true;
  bool use_output_gate = true;
  bool tie_word_embeddings = false;
  int bos_token_id = 1;
  std::vector<int> eos_token_ids = {2, 73440};
  int pad_token_id = 2;
  int max_position_embeddings = 524288;
  std::vector<MixerKind> mixers;
  SparseConfig sparse;
  std::string torch_dtype = "bfloat16";
  bool random_weights = false;  // written by `sala init`; every loader says so

  // Derived values.
  double residual_scale() const;  // scale_depth / sqrt(num_layers)
  double logit_divisor() const { return double(hidden_size) / dim_model_base; }
  double lightning_qk_scale() const;  // from lightning_scale
  int sparse_group() const { return num_heads / num_kv_heads; }
  int count(MixerKind kind) const;
  // Index of layer i among layers of its own kind (cache slots are per kind).
  int kind_index(int layer) const;
  std::vector<float> lightning_log_decay() const;  // g[h] = -slope[h] (spec §3.5)

  static ModelConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  static ModelConfig load(const std::filesystem::path& path);  // a file or a model directory
  nlohmann::json to_json() const;
  void validate(const std::string& source) const;  // throws naming the field and value
};

std::string mixer_name(MixerKind k);

}  // namespace sala
