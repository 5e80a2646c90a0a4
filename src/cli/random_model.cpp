#include "cli/random_model.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli/common.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"

namespace sala::cli {

LoadedModel random_model(const std::string& preset, Backend& backend, ModelLimits limits, uint64_t seed,
                         const RandomQuant& quant) {
  LoadedModel m;
  m.config = preset_config(preset);
  m.config.random_weights = true;
  const auto t0 = std::chrono::steady_clock::now();
  ModelWeights w = random_weights(m.config, backend, seed, quant);
  backend.synchronize();
  std::fprintf(stderr, "random %s weights generated on %s in %.1f s (RANDOM weights: output is meaningless)\n",
               preset.c_str(), backend.name().c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  print_weight_notes(m.config, w, backend);
  m.model = std::make_unique<Model>(m.config, std::move(w), backend, limits);
  return m;
}

RandomModelDir::RandomModelDir(const std::string& preset) {
  dir_ = std::filesystem::temp_directory_path() / ("sala-random-" + preset + "-" + std::to_string(::getpid()));
  RandomCheckpointOptions opt;
  opt.weights = false;
  write_random_checkpoint(dir_, preset_config(preset), opt);
}

RandomModelDir::~RandomModelDir() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace sala::cli
