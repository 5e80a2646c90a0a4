// Opening a model directory: config, checkpoint, weights bound on a backend.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "io/safetensors.h"
#include "model/model.h"

namespace sala {

// Resolves a model reference (for now: a directory holding config.json) to its directory.
std::filesystem::path resolve_model_dir(const std::string& ref);

struct LoadedModel {
  std::filesystem::path dir;
  ModelConfig config;
  std::unique_ptr<Model> model;
};

LoadedModel load_model(const std::string& ref, Backend& backend, ModelLimits limits);

// The line every tool prints when a checkpoint holds random weights.
inline constexpr const char* kRandomWeightsNotice =
    "note: this checkpoint holds RANDOM weights (made by `sala init`); its output is meaningless text";

}  // namespace sala
