// sala logits MODEL --tokens ID,ID,... : runs token ids through the model (prefill in chunks, then
// one token at a time) and writes f32 logits of every position as .npy [tokens, vocab]. The tool
// behind every parity check (CPU goldens, CUDA, quantized formats).
#include <algorithm>
#include <cstdio>

#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/npy.h"
#include "engine/replay.h"

namespace sala::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(pos, end - pos);
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      SALA_CHECK(used == item.size() && v >= 0 && v <= INT32_MAX, "bad token id '{}'", item);
      ids.push_back(int32_t(v));
    } catch (const std::logic_error&) {
      fail("--tokens: '{}' is not a token id", item);
    }
    pos = end + 1;
  }
  return ids;
}

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, out;
    std::vector<std::string> tokens;
    int64_t prefill = -1, chunk = 0;
    std::string regime = "final";
    BackendOptions backend;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "model directory (config.json + weights; no tokenizer needed)")->required();
  app.add_option("--tokens", o->tokens, "comma-separated ids; repeat for several sequences run as one batch")
      ->required();
  app.add_option("--prefill", o->prefill, "tokens fed as the prompt (default: all); the rest are decoded one by one");
  app.add_option("--chunk", o->chunk, "prefill chunk size (default: the whole prompt at once)");
  app.add_option("--regime", o->regime,
                 "dense/sparse decision for prompt chunks: final (by the whole prompt length, spec §4.2) or "
                 "per-call (by the length after each chunk)")
      ->check(CLI::IsMember({"final", "per-call"}));
  app.add_option("--out", o->out, "output .npy file")->required();
  o->backend.add(app);
  return [o] {
    std::vector<std::vector<int32_t>> seqs;
    for (const auto& t : o->tokens) seqs.push_back(parse_ids(t));
    int64_t longest = 0, total = 0;
    for (auto& s : seqs) {
      SALA_CHECK(!s.empty(), "--tokens: empty sequence");
      longest = std::max<int64_t>(longest, int64_t(s.size()));
      total += int64_t(s.size());
    }
    auto backend = o->backend.make();
    const int64_t chunk_cap = o->chunk > 0 ? o->chunk : longest;
    ModelLimits limits;
    limits.max_batch_tokens = chunk_cap * int64_t(seqs.size());
    limits.max_logit_rows = limits.max_batch_tokens;
    LoadedModel m = load_model_verbose(o->model, *backend, limits);
    const int V = m.config.vocab_size;
    for (auto& s : seqs)
      for (int32_t id : s) SALA_CHECK(id < V, "--tokens: id {} is outside the vocabulary ({})", id, V);

    Engine engine(*m.model, {.max_sequences = int(seqs.size()), .max_context = longest});
    auto logits = replay(engine, seqs, {o->prefill, o->chunk, o->regime == "final"});
    std::vector<float> all;
    for (auto& l : logits) all.insert(all.end(), l.begin(), l.end());
    write_npy(o->out, all, {total, V});
    std::fprintf(stderr, "wrote %s: [%lld, %d] logits (%s backend)\n", o->out.c_str(), (long long)total, V,
                 backend->name().c_str());
    return 0;
  };
}

}  // namespace
SALA_COMMAND(logits, "Run token ids and write the logits of every position (.npy)", setup);
}  // namespace sala::cli
