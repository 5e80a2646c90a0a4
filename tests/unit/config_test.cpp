// ModelConfig: the public checkpoint's config.json, defaults, round trip, and validation messages.
#include "model/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sala {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A byte-identical copy of ../shared/models/minicpm-sala/config.json (the repo must build and test alone).
const fs::path kRealModelDir = fs::path(SALA_TEST_DATA) / "data" / "model";

json real_config_json() {
  std::ifstream in(kRealModelDir / "config.json");
  return json::parse(in);
}

// A minimal config: every field at its default, `layers` sparse layers.
json minimal_json(int layers = 32) {
  return json{{"mixer_types", std::vector<std::string>(size_t(layers), "minicpm4")}};
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected sala::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected sala::Error, nothing was thrown";
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (text) << "' lacks '" << (part) << "'"

// Parsing `j` fails with a message naming the source and each of `parts`.
void expect_config_error(const json& j, std::initializer_list<std::string> parts) {
  std::string msg = error_of([&] { ModelConfig::from_json(j, "test/config.json"); });
  EXPECT_CONTAINS(msg, "test/config.json");
  for (const auto& p : parts) EXPECT_CONTAINS(msg, p);
}

TEST(ConfigReal, ParsesPublicCheckpointConfig) {
  ModelConfig c = ModelConfig::load(kRealModelDir);
  EXPECT_EQ(c.vocab_size, 73448);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 16384);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.sparse_group(), 16);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.lightning_heads, 32);
  EXPECT_EQ(c.lightning_kv_heads, 32);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>({2, 73440}));
  EXPECT_EQ(c.torch_dtype, "bfloat16");  // from "dtype": newer transformers drop "torch_dtype"
  EXPECT_FALSE(c.random_weights);
  EXPECT_EQ(c.sparse.window_size, 2048);
  EXPECT_EQ(c.sparse.dense_len, 8192);

  ASSERT_EQ(c.mixers.size(), 32u);
  std::vector<int> sparse;
  for (int i = 0; i < 32; ++i)
    if (c.mixers[size_t(i)] == MixerKind::Sparse) sparse.push_back(i);
  EXPECT_EQ(sparse, std::vector<int>({0, 9, 16, 17, 22, 29, 30, 31}));
  EXPECT_EQ(c.count(MixerKind::Sparse), 8);
  EXPECT_EQ(c.count(MixerKind::Lightning), 24);
  EXPECT_EQ(c.kind_index(0), 0);
  EXPECT_EQ(c.kind_index(9), 1);
  EXPECT_EQ(c.kind_index(31), 7);
  EXPECT_EQ(c.kind_index(1), 0);
  EXPECT_EQ(c.kind_index(10), 8);
  EXPECT_EQ(c.kind_index(28), 23);

  EXPECT_NEAR(c.residual_scale(), 0.24748737341529164, 1e-7);
  EXPECT_DOUBLE_EQ(c.logit_divisor(), 16.0);
  EXPECT_NEAR(c.lightning_qk_scale(), 0.0883883476, 1e-9);

  // Loading the file directly gives the same config.
  EXPECT_EQ(ModelConfig::load(kRealModelDir / "config.json").to_json(), c.to_json());
}

TEST(ConfigReal, LightningLogDecayMatchesSpec) {
  ModelConfig c = ModelConfig::load(kRealModelDir);
  std::vector<float> g = c.lightning_log_decay();
  ASSERT_EQ(g.size(), 32u);
  EXPECT_NEAR(g[0], -0.840896f, 1e-6);
  EXPECT_NEAR(g[2], -0.594604f, 1e-6);
  EXPECT_EQ(g[3], -0.5f);
  EXPECT_NEAR(g[16], -0.0525560f, 1e-7);
  EXPECT_NEAR(g[26], -0.00929068f, 1e-8);
  EXPECT_EQ(g[31], -0.00390625f);
  for (int h = 0; h < 32; ++h) EXPECT_EQ(g[size_t(h)], -float(std::pow(2.0, -(h + 1) / 4.0))) << h;
  EXPECT_NEAR(std::exp(g[0]), 0.431324, 1e-6);
  EXPECT_NEAR(std::exp(g[31]), 0.996101, 1e-6);
}

TEST(ConfigDefaults, AbsentFieldsTakeSpecDefaults) {
  ModelConfig c = ModelConfig::from_json(minimal_json());
  EXPECT_EQ(c.vocab_size, 73448);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 16384);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 32);  // = num_attention_heads
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.lightning_heads, 32);
  EXPECT_EQ(c.lightning_kv_heads, 32);
  EXPECT_EQ(c.lightning_head_dim, 128);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FLOAT_EQ(c.scale_emb, 12.0f);
  EXPECT_FLOAT_EQ(c.scale_depth, 1.4f);
  EXPECT_EQ(c.dim_model_base, 256);
  EXPECT_EQ(c.lightning_scale, "1/sqrt(d)");
  EXPECT_TRUE(c.attn_use_output_gate);
  EXPECT_FALSE(c.attn_use_rope);
  EXPECT_TRUE(c.lightning_use_rope);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.use_output_norm);
  EXPECT_TRUE(c.use_output_gate);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>({2, 73440}));
  EXPECT_EQ(c.sparse.kernel_size, 32);
  EXPECT_EQ(c.sparse.kernel_stride, 16);
  EXPECT_EQ(c.sparse.init_blocks, 1);
  EXPECT_EQ(c.sparse.block_size, 64);
  EXPECT_EQ(c.sparse.window_size, 2048);
  EXPECT_EQ(c.sparse.topk, 64);
  EXPECT_FALSE(c.sparse.use_nope);
  EXPECT_EQ(c.sparse.dense_len, 8192);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_FALSE(c.random_weights);
}

TEST(ConfigDefaults, DerivedDefaultsFollowOtherFields) {
  json j = minimal_json(2);
  j["num_hidden_layers"] = 2;
  j["hidden_size"] = 1024;
  j["num_attention_heads"] = 16;
  j["num_key_value_heads"] = 4;
  j["head_dim"] = nullptr;  // null: hidden_size / num_attention_heads
  j["sparse_config"] = {{"topk", 8}};
  ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.lightning_head_dim, 64);
  EXPECT_EQ(c.lightning_heads, 16);
  EXPECT_EQ(c.lightning_kv_heads, 4);  // = num_key_value_heads, not lightning_nh
  EXPECT_EQ(c.sparse.topk, 8);
  EXPECT_EQ(c.sparse.block_size, 64);  // other sparse keys keep their defaults

  j.erase("head_dim");  // absent (not null): the fixed default 128
  EXPECT_EQ(ModelConfig::from_json(j).head_dim, 128);
}

TEST(ConfigDefaults, MixerAliasesAndEosForms) {
  json j = minimal_json(4);
  j["num_hidden_layers"] = 4;
  j["mixer_types"] = {"minicpm4", "lightning", "lightning_attn", "lightning-attn"};
  j["eos_token_id"] = 7;
  ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.mixers, std::vector<MixerKind>({MixerKind::Sparse, MixerKind::Lightning, MixerKind::Lightning,
                                              MixerKind::Lightning}));
  EXPECT_EQ(c.eos_token_ids, std::vector<int>({7}));
  EXPECT_EQ(mixer_name(MixerKind::Sparse), "minicpm4");
  EXPECT_EQ(mixer_name(MixerKind::Lightning), "lightning-attn");
  EXPECT_EQ(c.kind_index(3), 2);
  EXPECT_THROW(c.kind_index(4), Error);
  EXPECT_THROW(c.kind_index(-1), Error);
}

TEST(ConfigDefaults, LightningScaleVariants) {
  json j = minimal_json();
  j["lightning_scale"] = "1/d";
  EXPECT_DOUBLE_EQ(ModelConfig::from_json(j).lightning_qk_scale(), 1.0 / 128);
  j["lightning_scale"] = "none";
  EXPECT_DOUBLE_EQ(ModelConfig::from_json(j).lightning_qk_scale(), 1.0);
}

TEST(ConfigDefaults, NonPowerOfTwoHeadsUseAlibiInterleave) {
  json j = minimal_json(1);
  j["num_hidden_layers"] = 1;
  j["num_attention_heads"] = 12;
  j["num_key_value_heads"] = 12;
  j["hidden_size"] = 12 * 64;
  j["head_dim"] = 64;
  std::vector<float> g = ModelConfig::from_json(j).lightning_log_decay();
  // 8 slopes of the 8-head series 2^-(i+1), then slopes 0, 2, 4, 6 of the 16-head series 2^-(i+1)/2.
  std::vector<double> expected = {0.5, 0.25, 0.125, 0.0625, 1.0 / 32, 1.0 / 64, 1.0 / 128, 1.0 / 256,
                                  std::pow(2.0, -0.5), std::pow(2.0, -1.5), std::pow(2.0, -2.5), std::pow(2.0, -3.5)};
  ASSERT_EQ(g.size(), expected.size());
  for (size_t h = 0; h < g.size(); ++h) EXPECT_EQ(g[h], -float(expected[h])) << h;
}

TEST(ConfigRoundTrip, ToJsonReadsBackIdentically) {
  ModelConfig real = ModelConfig::load(kRealModelDir);
  json written = real.to_json();
  EXPECT_EQ(written["architectures"], json({"MiniCPMSALAForCausalLM"}));
  EXPECT_EQ(written["model_type"], "minicpm_sala");
  EXPECT_EQ(written["mixer_types"][1], "lightning-attn");
  EXPECT_EQ(written["rms_norm_eps"].get<double>(), 1e-6);  // shortest float spelling, not 9.99e-07
  EXPECT_FALSE(written.contains("sala_random_weights"));
  EXPECT_EQ(ModelConfig::from_json(written).to_json(), written);

  // Every field away from its default survives too.
  json j = real_config_json();
  j["num_hidden_layers"] = 3;
  j["mixer_types"] = {"lightning", "minicpm4", "lightning"};
  j["vocab_size"] = 1000;
  j["eos_token_id"] = {5, 9};
  j["bos_token_id"] = 3;
  j["pad_token_id"] = 0;
  j["hidden_size"] = 256;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 1;
  j["lightning_nh"] = 4;
  j["lightning_nkv"] = 2;
  j["head_dim"] = 64;
  j["lightning_head_dim"] = 64;
  j["rms_norm_eps"] = 1e-5;
  j["rope_theta"] = 50000.5;
  j["scale_emb"] = 3.5;
  j["scale_depth"] = 2.25;
  j["dim_model_base"] = 64;
  j["lightning_scale"] = "1/d";
  for (const char* flag : {"attn_use_output_gate", "lightning_use_rope", "qk_norm", "use_output_norm",
                           "use_output_gate"})
    j[flag] = false;
  j["attn_use_rope"] = true;
  j["tie_word_embeddings"] = true;
  j["max_position_embeddings"] = 4096;
  j["sparse_config"] = {{"kernel_size", 16}, {"kernel_stride", 8}, {"init_blocks", 0}, {"block_size", 16},
                        {"window_size", 64}, {"topk", 3}, {"use_nope", true}, {"dense_len", 100}};
  j["sala_random_weights"] = true;
  ModelConfig c = ModelConfig::from_json(j);
  EXPECT_TRUE(c.random_weights);
  EXPECT_EQ(c.lightning_kv_heads, 2);
  json out = c.to_json();
  EXPECT_EQ(out["sala_random_weights"], true);
  ModelConfig back = ModelConfig::from_json(out);
  EXPECT_EQ(back.to_json(), out);
  EXPECT_EQ(back.rms_norm_eps, c.rms_norm_eps);
  EXPECT_EQ(back.scale_depth, c.scale_depth);
  EXPECT_EQ(back.rope_theta, 50000.5);
  EXPECT_EQ(back.sparse.use_nope, true);
  EXPECT_EQ(back.sparse.init_blocks, 0);
  EXPECT_EQ(back.mixers, c.mixers);
}

TEST(ConfigLoad, ErrorsNameThePath) {
  fs::path dir = fs::temp_directory_path() / fmt::format("sala_cfg_{}", ::getpid());
  fs::create_directories(dir);
  EXPECT_CONTAINS(error_of([&] { ModelConfig::load(dir); }), (dir / "config.json").string());
  std::ofstream(dir / "config.json") << "{\"vocab_size\": ";
  EXPECT_CONTAINS(error_of([&] { ModelConfig::load(dir); }), (dir / "config.json").string());
  std::ofstream(dir / "config.json") << minimal_json(2).dump();
  std::string msg = error_of([&] { ModelConfig::load(dir); });
  EXPECT_CONTAINS(msg, (dir / "config.json").string());
  EXPECT_CONTAINS(msg, "mixer_types");
  fs::remove_all(dir);
}

// Validation: each message names the field and the bad value.

TEST(ConfigValidate, MixerTypes) {
  json j = real_config_json();
  j["mixer_types"].erase(0);
  expect_config_error(j, {"'mixer_types'", "31", "32"});

  j = real_config_json();
  j["mixer_types"][3] = "mamba";
  expect_config_error(j, {"'mixer_types[3]'", "mamba"});

  j = real_config_json();
  j["mixer_types"][5] = 1;
  expect_config_error(j, {"'mixer_types[5]'", "1"});

  j = real_config_json();
  j.erase("mixer_types");
  expect_config_error(j, {"'mixer_types'", "missing"});

  j = real_config_json();
  j["mixer_types"] = "minicpm4";
  expect_config_error(j, {"'mixer_types'", "minicpm4"});
}

TEST(ConfigValidate, Heads) {
  json j = real_config_json();
  j["num_key_value_heads"] = 3;
  expect_config_error(j, {"'num_attention_heads' = 32", "num_key_value_heads (3)"});

  j = real_config_json();
  j["lightning_nh"] = 16;
  expect_config_error(j, {"'lightning_nh' = 16", "32"});

  j = real_config_json();
  j["lightning_head_dim"] = 64;
  expect_config_error(j, {"'lightning_head_dim' = 64", "128"});

  j = real_config_json();
  j["lightning_nkv"] = 5;
  expect_config_error(j, {"'lightning_nh' = 32", "lightning_nkv (5)"});

  j = real_config_json();
  j["head_dim"] = 127;
  j["lightning_head_dim"] = 127;
  expect_config_error(j, {"'head_dim' = 127", "even"});

  j = real_config_json();
  j["num_attention_heads"] = 0;
  expect_config_error(j, {"'num_attention_heads' = 0", "positive"});

  j = real_config_json();
  j["hidden_size"] = -4;
  expect_config_error(j, {"'hidden_size' = -4"});

  j = real_config_json();
  j["rms_norm_eps"] = 0;
  expect_config_error(j, {"'rms_norm_eps' = 0"});
}

TEST(ConfigValidate, SparseConfig) {
  auto with = [](const char* key, const json& value) {
    json j = real_config_json();
    j["sparse_config"][key] = value;
    return j;
  };
  expect_config_error(with("block_size", 40),
                      {"field 'sparse_config.block_size' = 40 must be a multiple of kernel_stride (16)"});
  expect_config_error(with("block_size", 48), {"'sparse_config.block_size' = 48", "4*kernel_stride (64)"});
  expect_config_error(with("kernel_size", 40), {"'sparse_config.kernel_size' = 40", "kernel_stride (16)"});
  expect_config_error(with("window_size", 100), {"'sparse_config.window_size' = 100", "block_size (64)"});
  expect_config_error(with("kernel_stride", 0), {"'sparse_config.kernel_stride' = 0", "positive"});
  expect_config_error(with("topk", -1), {"'sparse_config.topk' = -1"});
  expect_config_error(with("init_blocks", -1), {"'sparse_config.init_blocks' = -1"});
  expect_config_error(with("dense_len", "long"), {"'sparse_config.dense_len'", "long"});
  expect_config_error(with("use_nope", "no"), {"'sparse_config.use_nope'", "no"});

  json j = real_config_json();
  j["sparse_config"] = 5;
  expect_config_error(j, {"'sparse_config' = 5"});

  // block_size 32 with kernel_stride 16: 4*stride = 64 is a multiple of 32, which is allowed.
  EXPECT_NO_THROW(ModelConfig::from_json(with("block_size", 32)));
}

TEST(ConfigValidate, WrongJsonTypesNameTheField) {
  auto with = [](const char* key, const json& value) {
    json j = real_config_json();
    j[key] = value;
    return j;
  };
  expect_config_error(with("hidden_size", "big"), {"'hidden_size' = \"big\"", "integer"});
  expect_config_error(with("vocab_size", 1.5), {"'vocab_size' = 1.5"});
  expect_config_error(with("num_hidden_layers", json::array({32})), {"'num_hidden_layers' = [32]"});
  expect_config_error(with("qk_norm", 1), {"'qk_norm' = 1"});
  expect_config_error(with("rope_theta", "10000"), {"'rope_theta' = \"10000\"", "number"});
  expect_config_error(with("lightning_scale", 0.5), {"'lightning_scale' = 0.5"});
  expect_config_error(with("vocab_size", 1e12), {"'vocab_size'"});
  expect_config_error(with("eos_token_id", "2"), {"'eos_token_id' = \"2\""});
  expect_config_error(with("eos_token_id", json::array()), {"'eos_token_id' = []"});
  expect_config_error(with("eos_token_id", {2, "x"}), {"'eos_token_id[1]' = \"x\""});
  EXPECT_CONTAINS(error_of([] { ModelConfig::from_json(json::array(), "arr.json"); }), "arr.json");

  // An integral float is accepted where an integer belongs.
  EXPECT_EQ(ModelConfig::from_json(with("vocab_size", 73448.0)).vocab_size, 73448);
}

TEST(ConfigValidate, TokenIdsInsideVocab) {
  json j = real_config_json();
  j["eos_token_id"] = {2, 80000};
  expect_config_error(j, {"'eos_token_id[1]' = 80000", "73448"});

  j = real_config_json();
  j["eos_token_id"] = 73448;
  expect_config_error(j, {"'eos_token_id[0]' = 73448"});

  j = real_config_json();
  j["bos_token_id"] = -1;
  expect_config_error(j, {"'bos_token_id' = -1"});
}

}  // namespace
}  // namespace sala
