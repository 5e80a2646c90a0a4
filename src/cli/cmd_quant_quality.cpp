// sala quant-quality [MODEL | --random PRESET] --formats fp8,int8,int4: how far each packed format's
// logits are from the dense model's over the same tokens (relative error, top-1 agreement, KL) —
// llama.cpp's `perplexity --kl-divergence` for our formats. The dense weights are quantized in
// memory exactly as `sala quantize` would write them (quantize_weights), so no checkpoint is
// written; with --random the full-size shapes run on the GPU in minutes (the host quantizes, one
// matrix at a time, on all cores). --text scores a real text's tokens instead of random ids: on a
// real checkpoint, the quality the formats give on real activations (outlier channels included).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/random_model.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "engine/logit_stats.h"
#include "engine/replay.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/quant.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace sala::cli {
namespace {

struct Format {
  std::string name;
  QuantizeOptions opt;
};

// fp8, int8, int4 (zero points) and int4-sym; int4 groups from --group.
Format parse_format(const std::string& name, int group, bool lm_head) {
  Format f{name, {}};
  f.opt.lm_head = lm_head;
  f.opt.group_size = group;
  if (name == "fp8") f.opt.format = QuantFormat::FP8;
  else if (name == "int8") f.opt.format = QuantFormat::INT8;
  else if (name == "int4") f.opt.format = QuantFormat::INT4, f.opt.zero_points = true;
  else if (name == "int4-sym") f.opt.format = QuantFormat::INT4, f.opt.zero_points = false;
  else fail("quant-quality: unknown format '{}' in --formats (known: fp8, int8, int4, int4-sym)", name);
  if (f.opt.format == QuantFormat::INT4) f.name += " g" + std::to_string(group);
  return f;
}

// The first `limit` tokens of a text file under the model directory's tokenizer.
std::vector<int32_t> text_tokens(const std::string& model_dir, const std::string& file, int64_t limit) {
  std::ifstream f(file, std::ios::binary);
  SALA_CHECK(bool(f), "quant-quality: cannot read --text '{}'", file);
  std::stringstream ss;
  ss << f.rdbuf();
  SALA_CHECK(std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json"),
             "quant-quality: --text: model directory '{}' has no tokenizer.json", model_dir);
  std::vector<int32_t> ids = Tokenizer::load(model_dir).encode(ss.str(), /*add_special_tokens=*/true);
  if (int64_t(ids.size()) > limit) ids.resize(size_t(limit));
  SALA_CHECK(ids.size() >= 2, "quant-quality: --text '{}' holds fewer than 2 tokens", file);
  return ids;
}

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, random, formats = "fp8,int8,int4", json, text;
    int group = 64;
    bool lm_head = false;
    int64_t positions = 1024, chunk = 256, decode = 64;
    uint64_t seed = 0, token_seed = 2024;
    BackendOptions backend;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "dense model directory (bf16 or f32 weights), or use --random");
  app.add_option("--random", o->random, "random weights of a preset, generated on the backend (tiny, small, 9b)")
      ->check(CLI::IsMember(preset_names()));
  app.add_option("--seed", o->seed, "with --random: seed of the weights")->capture_default_str();
  app.add_option("--formats", o->formats, "comma-separated: fp8, int8, int4 (zero points), int4-sym")
      ->capture_default_str();
  app.add_option("--group", o->group, "int4 group size")->check(CLI::IsMember({32, 64, 128, 256}))->capture_default_str();
  app.add_flag("--lm-head", o->lm_head, "quantize lm_head too (`sala quantize --lm-head`)");
  app.add_option("--positions", o->positions, "tokens scored (random ids)")->capture_default_str();
  app.add_option("--chunk", o->chunk, "prompt chunk (tokens per forward)")->capture_default_str();
  app.add_option("--decode", o->decode, "of the positions, the last ones run one decode step each")
      ->capture_default_str();
  app.add_option("--token-seed", o->token_seed, "seed of the random token ids")->capture_default_str();
  app.add_option("--text", o->text, "score the first --positions tokens of this text file (MODEL's tokenizer) "
                                    "instead of random ids: the quality on real activations");
  app.add_option("--json", o->json, "write the rows as JSON here");
  o->backend.add(app);
  return [o] {
    SALA_CHECK(o->model.empty() != o->random.empty(), "quant-quality: give a MODEL directory or --random PRESET");
    SALA_CHECK(o->text.empty() || o->random.empty(),
               "quant-quality: --text needs a MODEL directory with a tokenizer (--random has none)");
    std::vector<int32_t> text_ids;  // --text: the positions scored (the text may be shorter than --positions)
    if (!o->text.empty()) {
      text_ids = text_tokens(o->model, o->text, o->positions);
      o->positions = int64_t(text_ids.size());
    }
    SALA_CHECK(o->positions >= 1 && o->chunk >= 1 && o->decode >= 0 && o->decode < o->positions,
               "quant-quality: need positions ≥ 1, chunk ≥ 1 and 0 ≤ decode < positions (got {}, {}, {})",
               o->positions, o->chunk, o->decode);
    std::vector<Format> formats;
    for (const auto& f : CLI::detail::split(o->formats, ',')) formats.push_back(parse_format(f, o->group, o->lm_head));
    SALA_CHECK(!formats.empty(), "quant-quality: --formats is empty");

    auto backend = o->backend.make();
    ModelConfig config;
    std::unique_ptr<Checkpoint> ckpt;
    std::string label;
    if (!o->random.empty()) {
      config = preset_config(o->random);
      config.random_weights = true;
      label = "random " + o->random + " (seed " + std::to_string(o->seed) + ")";
    } else {
      config = ModelConfig::load(o->model);
      const QuantConfig q = load_quant_config(o->model);
      SALA_CHECK(!q.quantized(), "quant-quality: '{}' is already quantized ({}): give the dense checkpoint it came from",
                 o->model, quant_format_name(q.format));
      ckpt = std::make_unique<Checkpoint>(o->model);
      label = o->model;
    }
    // The dense weights, made anew for every format (random: the same values from the same seeds).
    auto dense = [&] {
      return ckpt ? bind_weights(config, *ckpt, *backend) : random_weights(config, *backend, o->seed);
    };
    std::vector<int32_t> tokens(size_t(o->positions));
    if (!o->text.empty()) {
      tokens = text_ids;
      for (const int32_t t : tokens)
        SALA_CHECK(t >= 0 && t < config.vocab_size, "quant-quality: '{}' encodes token {} outside the vocabulary ({})",
                   o->text, t, config.vocab_size);
    } else {
      for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = int32_t(3 + splitmix64(o->token_seed * 0x9e3779b97f4a7c15ull + i) % uint64_t(config.vocab_size - 3));
    }
    const ModelLimits limits{.max_batch_tokens = o->chunk, .max_logit_rows = o->chunk};
    auto logits_of = [&](ModelWeights w) {
      Model model(config, std::move(w), *backend, limits);
      Engine engine(model, {.max_sequences = 1, .max_context = o->positions});
      return replay(engine, {tokens}, {o->positions - o->decode, o->chunk, true})[0];
    };
    using clock = std::chrono::steady_clock;
    auto secs = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };

    auto t0 = clock::now();
    const std::vector<float> ref = logits_of(dense());
    std::fprintf(stderr, "dense %s on %s: %lld positions (%lld prompt in chunks of %lld, %lld decode) in %.1f s\n",
                 label.c_str(), backend->name().c_str(), (long long)o->positions,
                 (long long)(o->positions - o->decode), (long long)o->chunk, (long long)o->decode, secs(t0));
    ThreadPool pool;
    nlohmann::json rows = nlohmann::json::array();
    std::printf("model: %s, backend %s, %lld positions (%s), lm_head %s%s%s\n", label.c_str(),
                backend->name().c_str(), (long long)o->positions, o->text.empty() ? "random ids" : o->text.c_str(),
                o->lm_head ? "quantized" : "kept dense",
                backend->fp8_prefill() ? ", fp8 prefill (W8A8 prompt chunks for fp8)" : "",
                backend->int8_prefill() ? ", int8 prefill (W8A8 prompt chunks for int8 and int4)" : "");
    std::printf("| format | bytes/param | logit rel. error | top-1 agreement | mean KL | max KL |\n");
    std::printf("|---|---|---|---|---|---|\n");
    for (const Format& f : formats) {
      t0 = clock::now();
      ModelWeights w = dense();
      quantize_weights(config, w, *backend, f.opt, &pool);
      const double bpp = weight_bytes_per_param(config, w);
      const double tq = secs(t0);
      t0 = clock::now();
      const std::vector<float> got = logits_of(std::move(w));
      const LogitStats s = compare_logits(ref, got, config.vocab_size, &pool);
      std::fprintf(stderr, "%s: quantized in %.1f s, logits in %.1f s\n", f.name.c_str(), tq, secs(t0));
      std::printf("| %s | %.3f | %.4f | %.4f | %.2e | %.2e |\n", f.name.c_str(), bpp, s.rel, s.top1, s.kl, s.max_kl);
      std::fflush(stdout);
      rows.push_back({{"format", f.name}, {"lm_head", f.opt.lm_head}, {"bytes_per_param", bpp}, {"rel", s.rel},
                      {"top1", s.top1}, {"kl", s.kl}, {"max_kl", s.max_kl}, {"positions", s.positions}});
    }
    if (!o->json.empty()) {
      std::ofstream f(o->json);
      SALA_CHECK(bool(f), "quant-quality: cannot write '{}'", o->json);
      f << nlohmann::json{{"model", label}, {"backend", backend->name()}, {"positions", o->positions},
                          {"chunk", o->chunk}, {"decode", o->decode}, {"text", o->text},
                          {"fp8_prefill", backend->fp8_prefill()}, {"int8_prefill", backend->int8_prefill()},
                          {"rows", rows}}
               .dump(2)
        << "\n";
    }
    return 0;
  };
}

const Registrar registrar("quant-quality",
                          "Logit error, top-1 agreement and KL of packed formats against the dense model", setup);

}  // namespace
}  // namespace sala::cli
