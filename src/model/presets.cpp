#include "model/presets.h"

#include "core/error.h"

namespace sala {

namespace {

std::vector<MixerKind> layout(const std::string& pattern) {  // 'S' sparse, 'L' lightning
  std::vector<MixerKind> m;
  for (char ch : pattern) m.push_back(ch == 'S' ? MixerKind::Sparse : MixerKind::Lightning);
  return m;
}

}  // namespace

std::vector<std::string> preset_names() { return {"tiny", "small", "9b"}; }

ModelConfig preset_config(const std::string& name) {
  ModelConfig c;  // defaults are the published 9B values (spec §1.1)
  if (name == "9b") {
    c.mixers = layout("SLLLLLLLLSLLLLLLSSLLLLSLLLLLLSSS");
  } else if (name == "tiny") {
    // Both layer kinds and the sparse path at test scale: the spec's rules with smaller numbers.
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_layers = 4;
    c.num_heads = c.lightning_heads = c.lightning_kv_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = c.lightning_head_dim = 16;
    c.dim_model_base = 16;
    c.eos_token_ids = {2, 4};
    c.max_position_embeddings = 4096;
    c.mixers = layout("SLLS");
    c.sparse = {.kernel_size = 8, .kernel_stride = 4, .init_blocks = 1, .block_size = 16, .window_size = 64,
                .topk = 4, .use_nope = false, .dense_len = 256};
  } else if (name == "small") {
    // The real vocabulary and tokenizer with a small body: readable (random) text in demos.
    c.hidden_size = 256;
    c.intermediate_size = 768;
    c.num_layers = 8;
    c.num_heads = c.lightning_heads = c.lightning_kv_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = c.lightning_head_dim = 64;
    c.dim_model_base = 64;
    c.max_position_embeddings = 65536;
    c.mixers = layout("SLLLSLLS");
    c.sparse = {.kernel_size = 32, .kernel_stride = 16, .init_blocks = 1, .block_size = 64, .window_size = 512,
                .topk = 8, .use_nope = false, .dense_len = 2048};
  } else {
    fail("unknown preset '{}' (known: tiny, small, 9b)", name);
  }
  c.validate("preset " + name);
  return c;
}

}  // namespace sala
