#include "server/model_registry.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>

#include "core/error.h"

namespace sala::server {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

fs::path home() {
  std::string h = env("HOME");
  return h.empty() ? fs::path("/tmp") : fs::path(h);
}

bool valid_part(std::string_view s) {
  if (s.empty() || s == "." || s == ".." || s.size() > 96) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum((unsigned char)c) || c == '.' || c == '_' || c == '-';
  });
}

bool is_model_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && fs::is_regular_file(p / "config.json", ec);
}

std::string read_first_line(const fs::path& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  while (!s.empty() && std::isspace((unsigned char)s.back())) s.pop_back();
  return s;
}

}  // namespace

bool valid_model_id(const std::string& id) {
  const size_t slash = id.find('/');
  if (slash == std::string::npos) return valid_part(id);
  return valid_part(std::string_view(id).substr(0, slash)) && valid_part(std::string_view(id).substr(slash + 1));
}

uint64_t directory_bytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code e2;
    if (fs::is_regular_file(it->path(), e2)) total += fs::file_size(it->path(), e2);  // follows links
  }
  return total;
}

ModelRegistry::ModelRegistry(fs::path models_dir, fs::path hub_cache)
    : models_dir_(std::move(models_dir)), hub_cache_(std::move(hub_cache)) {}

fs::path ModelRegistry::default_models_dir() {
  if (std::string d = env("SALA_MODELS_DIR"); !d.empty()) return d;
  if (std::string x = env("XDG_DATA_HOME"); !x.empty()) return fs::path(x) / "sala" / "models";
  return home() / ".local" / "share" / "sala" / "models";
}

fs::path ModelRegistry::default_hub_cache() {
  if (std::string d = env("HF_HUB_CACHE"); !d.empty()) return d;
  if (std::string h = env("HF_HOME"); !h.empty()) return fs::path(h) / "hub";
  return home() / ".cache" / "huggingface" / "hub";
}

std::optional<ModelEntry> ModelRegistry::find_in_hub(const std::string& ref) const {
  std::string id = ref, rev;
  if (size_t at = ref.find('@'); at != std::string::npos) {
    id = ref.substr(0, at);
    rev = ref.substr(at + 1);
    if (!valid_part(rev)) return std::nullopt;
  }
  const size_t slash = id.find('/');
  if (hub_cache_.empty() || slash == std::string::npos || !valid_model_id(id)) return std::nullopt;
  const fs::path repo = hub_cache_ / ("models--" + id.substr(0, slash) + "--" + id.substr(slash + 1));
  std::error_code ec;
  if (!fs::is_directory(repo / "snapshots", ec)) return std::nullopt;
  fs::path snap;
  const std::string want = rev.empty() ? "main" : rev;
  if (is_model_dir(repo / "snapshots" / want)) {
    snap = repo / "snapshots" / want;  // a commit hash given directly
  } else if (fs::is_regular_file(repo / "refs" / want, ec)) {
    const std::string hash = read_first_line(repo / "refs" / want);
    if (valid_part(hash) && is_model_dir(repo / "snapshots" / hash)) snap = repo / "snapshots" / hash;
  }
  if (snap.empty() && rev.empty()) {
    // No usable refs/main: the most recently written snapshot that is a model.
    fs::file_time_type best{};
    for (const auto& e : fs::directory_iterator(repo / "snapshots", ec)) {
      if (!is_model_dir(e.path())) continue;
      auto t = fs::last_write_time(e.path(), ec);
      if (snap.empty() || t > best) {
        snap = e.path();
        best = t;
      }
    }
  }
  if (snap.empty()) return std::nullopt;
  return ModelEntry{ref, snap, "hf-cache"};
}

std::optional<ModelEntry> ModelRegistry::find(const std::string& ref) const {
  if (ref.empty()) return std::nullopt;
  std::error_code ec;
  fs::path p(ref);
  if (fs::is_regular_file(p, ec) && p.filename() == "config.json") p = p.parent_path();
  if (is_model_dir(p)) return ModelEntry{ref, p, "path"};
  if (valid_model_id(ref) && !models_dir_.empty() && is_model_dir(models_dir_ / ref))
    return ModelEntry{ref, models_dir_ / ref, "models-dir"};
  return find_in_hub(ref);
}

ModelEntry ModelRegistry::resolve(const std::string& ref) const {
  if (auto e = find(ref)) return *e;
  fail("model '{}' not found: not a directory holding config.json, not in the models directory {}, not in the "
       "Hugging Face cache {} (download it with `sala models download ORG/NAME`)",
       ref, models_dir_.string(), hub_cache_.string());
}

std::vector<ModelEntry> ModelRegistry::list() const {
  std::vector<ModelEntry> out;
  std::error_code ec;
  if (!models_dir_.empty() && fs::is_directory(models_dir_, ec)) {
    for (const auto& e : fs::directory_iterator(models_dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (!valid_part(name) || name[0] == '.') continue;  // .partial and other work dirs
      if (is_model_dir(e.path())) {
        out.push_back({name, e.path(), "models-dir"});
        continue;
      }
      std::error_code e2;
      if (!fs::is_directory(e.path(), e2)) continue;
      for (const auto& sub : fs::directory_iterator(e.path(), e2)) {
        const std::string n2 = sub.path().filename().string();
        if (valid_part(n2) && n2[0] != '.' && is_model_dir(sub.path()))
          out.push_back({name + "/" + n2, sub.path(), "models-dir"});
      }
    }
  }
  if (!hub_cache_.empty() && fs::is_directory(hub_cache_, ec)) {
    for (const auto& e : fs::directory_iterator(hub_cache_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("models--", 0) != 0) continue;
      const std::string rest = name.substr(8);
      const size_t sep = rest.find("--");
      if (sep == std::string::npos) continue;
      const std::string id = rest.substr(0, sep) + "/" + rest.substr(sep + 2);
      // A models-dir copy of the same id shadows the cache (it is what resolve() returns).
      if (std::any_of(out.begin(), out.end(), [&](const ModelEntry& m) { return m.id == id; })) continue;
      if (auto m = find_in_hub(id)) out.push_back(*m);
    }
  }
  std::sort(out.begin(), out.end(), [](const ModelEntry& a, const ModelEntry& b) { return a.id < b.id; });
  return out;
}

json ModelRegistry::describe(const ModelEntry& e) {
  json j = {{"id", e.id}, {"object", "model"}, {"owned_by", "sala"}, {"path", fs::absolute(e.dir).string()},
            {"source", e.source}, {"size_bytes", directory_bytes(e.dir)}};
  if (size_t slash = e.id.find('/'); slash != std::string::npos && e.source != "path")
    j["owned_by"] = e.id.substr(0, slash);
  std::error_code ec;
  auto t = fs::last_write_time(e.dir / "config.json", ec);
  j["created"] = ec ? int64_t(0)
                    : int64_t(std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::file_clock::to_sys(t).time_since_epoch())
                                  .count());
  std::ifstream in(e.dir / "config.json");
  json cfg = json::parse(in, nullptr, false);
  j["dtype"] = cfg.is_object() && cfg.value("torch_dtype", json()).is_string() ? cfg["torch_dtype"] : json(nullptr);
  j["context_length"] = cfg.is_object() && cfg.value("max_position_embeddings", json()).is_number_integer()
                            ? cfg["max_position_embeddings"]
                            : json(nullptr);
  return j;
}

fs::path ModelRegistry::install_dir(const std::string& id) const {
  SALA_CHECK(valid_model_id(id), "invalid model id '{}': expected NAME or ORG/NAME of [A-Za-z0-9._-]", id);
  SALA_CHECK(!models_dir_.empty(), "no models directory configured");
  return models_dir_ / id;
}

void ModelRegistry::remove(const std::string& id) const {
  SALA_CHECK(valid_model_id(id), "invalid model id '{}'", id);
  const fs::path dir = models_dir_ / id;
  if (!is_model_dir(dir)) {
    if (find_in_hub(id))
      fail("model '{}' is in the Hugging Face cache {}, which sala only reads; remove it with `huggingface-cli "
           "delete-cache`",
           id, hub_cache_.string());
    fail("model '{}' is not in the models directory {}", id, models_dir_.string());
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  SALA_CHECK(!ec, "cannot remove {}: {}", dir.string(), ec.message());
  // An ORG directory left empty goes too.
  if (id.find('/') != std::string::npos && fs::is_empty(dir.parent_path(), ec)) fs::remove(dir.parent_path(), ec);
}

}  // namespace sala::server
