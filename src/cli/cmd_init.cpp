// sala init OUT --preset tiny|small|9b: writes a random checkpoint.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"

namespace sala::cli {
namespace {

Runner setup(CLI::App& app) {
  struct Opts {
    std::string out, preset = "tiny", config, dtype = "bf16", tokenizer;
    uint64_t seed = 0;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("OUT", o->out, "output directory")->required();
  app.add_option("--preset", o->preset, "model shape: tiny (tests), small (demos), 9b (the real config)")
      ->check(CLI::IsMember(preset_names()));
  app.add_option("--config", o->config, "config.json whose fields override the preset");
  app.add_option("--seed", o->seed, "random seed");
  app.add_option("--dtype", o->dtype, "weight dtype")->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--tokenizer", o->tokenizer, "directory with the real tokenizer files (vocab 73448)");
  return [o] {
    ModelConfig config = preset_config(o->preset);
    if (!o->config.empty()) {
      // Overlay: the file's fields replace the preset's.
      nlohmann::json merged = config.to_json();
      std::ifstream in(o->config);
      SALA_CHECK(in.good(), "cannot open --config {}", o->config);
      nlohmann::json overlay;
      try {
        overlay = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        fail("{}: invalid JSON: {}", o->config, e.what());
      }
      merged.merge_patch(overlay);
      config = ModelConfig::from_json(merged, o->config);
    }
    RandomCheckpointOptions opt;
    opt.seed = o->seed;
    opt.dtype = o->dtype == "f32" ? DType::F32 : DType::BF16;
    opt.tokenizer_dir = o->tokenizer;
    std::string tok = write_random_checkpoint(o->out, config, opt);
    std::printf("wrote %s: RANDOM weights, preset %s, seed %llu, %s\n%s\n", o->out.c_str(), o->preset.c_str(),
                (unsigned long long)o->seed, o->dtype.c_str(), tok.c_str());
    return 0;
  };
}

}  // namespace
SALA_COMMAND(init, "Write a checkpoint of random weights (tests, demos, benchmarks)", setup);
}  // namespace sala::cli
