// Writes a checkpoint of random weights (config.json + model.safetensors + tokenizer files) that
// loads like a real one and is marked as random everywhere it is loaded.
#pragma once
#include <filesystem>
#include <string>

#include "core/dtype.h"
#include "model/config.h"

namespace sala {

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  DType dtype = DType::BF16;
  std::filesystem::path tokenizer_dir;  // real tokenizer files to copy when the vocab matches
  // false: config, generation config and tokenizer only, no model.safetensors (the directory of a
  // model whose weights are generated on the backend: `sala serve --random`).
  bool weights = true;
};

// Returns a line describing the tokenizer that was written.
std::string write_random_checkpoint(const std::filesystem::path& out, const ModelConfig& config,
                                    const RandomCheckpointOptions& options);

// Where the real tokenizer files are found: the repo's copy, else ../shared beside it.
std::filesystem::path default_tokenizer_dir();

}  // namespace sala
