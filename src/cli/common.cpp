#include "cli/common.h"

#include <algorithm>
#include <cstdio>

namespace sala::cli {

void BackendOptions::add(CLI::App& app) {
  app.add_option("--backend", backend, "cpu, cuda, or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("-t,--threads", threads, "CPU threads (0: all cores)");
}

std::unique_ptr<Backend> BackendOptions::make() const {
  std::string name = backend;
  if (name == "auto") {
    auto names = available_backends();
    name = std::find(names.begin(), names.end(), "cuda") != names.end() ? "cuda" : "cpu";
  }
  return make_backend(name, threads);
}

LoadedModel load_model_verbose(const std::string& ref, Backend& backend, ModelLimits limits) {
  LoadedModel m = load_model(ref, backend, limits);
  if (m.config.random_weights) std::fprintf(stderr, "%s\n", kRandomWeightsNotice);
  // Quantized checkpoints: say how the matrices are held (packed, or anything dequantized).
  const ModelWeights& w = m.model->weights();
  if (w.lm_head.packed() || (!w.layers.empty() && w.layers[0].gate.packed()) || !w.dequantized.empty())
    std::fprintf(stderr, "weights on %s: %s\n", backend.name().c_str(),
                 describe_weight_formats(m.config, w).c_str());
  return m;
}

}  // namespace sala::cli
