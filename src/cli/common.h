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

// Prompt tokens per forward in generate, chat, batch and serve (serve: --prefill-chunk and
// --batch-tokens). Larger chunks keep the prefill GEMMs compute bound and, with packed weights,
// dequantize each matrix once per 2048 tokens instead of per 256: random 9B at a 4K prompt on an
// H200, chunk 256 → 2048: bf16 19209 → 29745 tok/s, fp8 12258 → 27216 (bench/results/
// 2026-11-25-h200-prefill-chunk.md). The cost: ~280 MiB more workspace, and in serve, other
// requests' tokens wait for a whole chunk's step.
constexpr int64_t kDefaultPrefillChunk = 2048;

struct BackendOptions {
  std::string backend = "auto";  // auto: cuda when a GPU is present, else cpu
  int threads = 0;
  bool deterministic = false;  // batch-invariant numerics (CPU and CUDA backends)
  // Prefill products of FP8 weights in fp8 (W8A8, Backend::set_fp8_prefill): on where the backend
  // multiplies fp8 natively (Backend::native_fp8) unless --no-fp8-prefill; --fp8-prefill insists
  // (an error where it cannot run).
  bool fp8_prefill = false;
  bool no_fp8_prefill = false;
  bool int8_prefill = false;   // prefill products of int8 and int4 weights in int8 (W8A8, Backend::set_int8_prefill)
  void add(CLI::App& app);
  std::unique_ptr<Backend> make() const;
};

// How a model's matrices are held (packed formats) and whether --fp8-prefill / --int8-prefill apply, to stderr.
void print_weight_notes(const ModelConfig& config, const ModelWeights& w, Backend& backend);

// Loads a model and prints the random-weights notice to stderr when it applies.
LoadedModel load_model_verbose(const std::string& ref, Backend& backend, ModelLimits limits);

// A positive count with an optional k/m suffix (powers of 1024): "4096", "4k" -> 4096,
// "1m" -> 1048576. Anything else (empty, trailing text, zero or negative) fails with a message.
int64_t parse_size(std::string s);

}  // namespace sala::cli
