// Models of random weights generated on the backend, without a checkpoint on disk (`sala bench
// --random`, `sala serve --random`): full-size shapes (9b: 19 GB of bf16) in seconds.
#pragma once
#include <filesystem>
#include <string>

#include "backend/backend.h"
#include "model/loader.h"

namespace sala::cli {

// The preset's model with random weights (seed) on `backend`; config.random_weights is set and the
// random-weights notice is printed to stderr, with the generation time. `quant`: random packed
// projections (docs/quantization.md), described on stderr too.
LoadedModel random_model(const std::string& preset, Backend& backend, ModelLimits limits, uint64_t seed,
                         const RandomQuant& quant = {});

// A temporary directory with the preset's config.json, generation_config.json and tokenizer (no
// weights): what `sala serve --random` describes in /v1/models and loads the tokenizer from.
// Removed by the destructor.
class RandomModelDir {
 public:
  explicit RandomModelDir(const std::string& preset);
  ~RandomModelDir();
  RandomModelDir(const RandomModelDir&) = delete;
  RandomModelDir& operator=(const RandomModelDir&) = delete;
  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

}  // namespace sala::cli
