#include "model/loader.h"

#include "core/error.h"

namespace sala {

namespace fs = std::filesystem;

fs::path resolve_model_dir(const std::string& ref) {
  fs::path p(ref);
  if (fs::is_regular_file(p) && p.filename() == "config.json") p = p.parent_path();
  SALA_CHECK(fs::is_directory(p), "model '{}' not found: expected a directory holding config.json", ref);
  SALA_CHECK(fs::exists(p / "config.json"), "model directory '{}' has no config.json", p.string());
  return p;
}

LoadedModel load_model(const std::string& ref, Backend& backend, ModelLimits limits) {
  LoadedModel m;
  m.dir = resolve_model_dir(ref);
  m.config = ModelConfig::load(m.dir / "config.json");
  Checkpoint ckpt(m.dir);
  if (ckpt.metadata().count("sala_random_weights")) m.config.random_weights = true;
  ModelWeights w;
  try {
    w = bind_weights(m.config, ckpt, backend);
  } catch (const Error& e) {
    fail("{}: {}", m.dir.string(), e.what());
  }
  m.model = std::make_unique<Model>(m.config, std::move(w), backend, limits);
  return m;
}

}  // namespace sala
