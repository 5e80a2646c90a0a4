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
  bool fp8_prefill = false;    // prefill products of FP8 weights in fp8 (W8A8, Backend::set_fp8_prefill)
  void add(CLI::App& app);
  std::unique_ptr<Backend> make() const;
};

// How a model's matrices are held (packed formats) and whether --fp8-prefill applies, to stderr.
void print_weight_notes(const ModelConfig& config, const ModelWeights& w, Backend& backend);

// Loads a model and prints the random-weights notice to stderr when it applies.
LoadedModel load_model_verbose(const std::string& ref, Backend& backend, ModelLimits limits);

// A positive count with an optional k/m suffix (powers of 1024): "4096", "4k" -> 4096,
// "1m" -> 1048576. Anything else (empty, trailing text, zero or negative) fails with a message.
int64_t parse_size(std::string s);

}  // namespace sala::cli
