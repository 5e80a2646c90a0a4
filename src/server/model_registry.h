// Where models live and what they are called. A model reference resolves, in this order, as
//   1. a path: a directory holding config.json (or that config.json itself); id = the reference
//   2. the models directory: <models-dir>/<id>/config.json, id "NAME" or "ORG/NAME"
//      (--models-dir, else $SALA_MODELS_DIR, else $XDG_DATA_HOME/sala/models or
//      ~/.local/share/sala/models); `sala models download` installs here
//   3. the Hugging Face hub cache, read-only: <hub>/models--ORG--NAME/snapshots/<rev>/ with the
//      revision named by refs/main (else the newest snapshot); "ORG/NAME@REV" picks a revision
//      ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)
// Ids are made of [A-Za-z0-9._-] parts joined by at most one "/"; ".." never resolves.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace sala::server {

struct ModelEntry {
  std::string id;
  std::filesystem::path dir;
  std::string source;  // "path", "models-dir", "hf-cache"
};

class ModelRegistry {
 public:
  ModelRegistry(std::filesystem::path models_dir, std::filesystem::path hub_cache);
  static std::filesystem::path default_models_dir();
  static std::filesystem::path default_hub_cache();

  const std::filesystem::path& models_dir() const { return models_dir_; }
  const std::filesystem::path& hub_cache() const { return hub_cache_; }

  std::optional<ModelEntry> find(const std::string& ref) const;
  // Like find; throws sala::Error saying where it looked.
  ModelEntry resolve(const std::string& ref) const;
  // Models of the models directory and the hub cache (not arbitrary paths), sorted by id.
  std::vector<ModelEntry> list() const;
  // OpenAI model object plus: path, source, size_bytes, dtype, context_length.
  static nlohmann::json describe(const ModelEntry& e);

  // Where `sala models download ORG/NAME` installs (throws on an invalid id).
  std::filesystem::path install_dir(const std::string& id) const;
  // Deletes a model of the models directory. Throws sala::Error for hub-cache models (read-only),
  // paths, and unknown ids.
  void remove(const std::string& id) const;

 private:
  std::optional<ModelEntry> find_in_hub(const std::string& id) const;

  std::filesystem::path models_dir_, hub_cache_;
};

bool valid_model_id(const std::string& id);
// Total bytes of the regular files under dir (symlinks followed: hub snapshots link to blobs).
uint64_t directory_bytes(const std::filesystem::path& dir);

}  // namespace sala::server
