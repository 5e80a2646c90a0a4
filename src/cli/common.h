// Helpers shared by the subcommands: backend choice, model loading with the random-weights notice.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/loader.h"

namespace sala::cli {

struct BackendOptions {
  std::string backend = "auto";  // auto: cuda when a GPU is present, else cpu
  int threads = 0;
  void add(CLI::App& app);
  std::unique_ptr<Backend> make() const;
};

// Loads a model and prints the random-weights notice to stderr when it applies.
LoadedModel load_model_verbose(const std::string& ref, Backend& backend, ModelLimits limits);

}  // namespace sala::cli
