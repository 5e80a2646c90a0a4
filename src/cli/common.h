// Helpers shared by the subcommands: backend choice, model loading with the random-weights notice,
// size arguments ("4k", "1m").
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/loader.h"

namespace sala::cli {

struct BackendOptions {
  std::string backend = "auto";  // auto: cuda when a GPU is present, else cpu
  int threads = 0;
  bool deterministic = false;  // batch-invariant numerics (CPU and CUDA backends)
  void add(CLI::App& app);
  std::unique_ptr<Backend> make() const;
};

// Loads a model and prints the random-weights notice to stderr when it applies.
LoadedModel load_model_verbose(const std::string& ref, Backend& backend, ModelLimits limits);

// A positive count with an optional k/m suffix (powers of 1024): "4096", "4k" -> 4096,
// "1m" -> 1048576. Anything else (empty, trailing text, zero or negative) fails with a message.
int64_t parse_size(std::string s);

}  // namespace sala::cli
