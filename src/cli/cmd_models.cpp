// sala models list | download ORG/NAME [--revision R] | rm ID: the models directory, and the
// Hugging Face cache (listed, never changed). See server/model_registry.h for how ids resolve.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "server/hub_download.h"
#include "server/model_registry.h"

namespace sala::cli {
namespace {

using namespace sala::server;

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} {}", b, units[u]) : fmt::format("{:.1f} {}", b, units[u]);
}

// A one-line progress bar on a terminal; on a pipe, a line every 10%.
class ProgressBar {
 public:
  void update(const DownloadProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const double frac = p.bytes_total ? double(p.bytes_done) / double(p.bytes_total) : 0.0;
    if (tty_) {
      if (now - last_ < std::chrono::milliseconds(100) && p.files_done != p.files_total) return;
      last_ = now;
      const int width = 30, fill = int(frac * width);
      std::fprintf(stderr, "\r[%s%s] %3d%% %s / %s  file %d/%d %-30.30s", std::string(size_t(fill), '#').c_str(),
                   std::string(size_t(width - fill), ' ').c_str(), int(frac * 100), human_bytes(double(p.bytes_done)).c_str(),
                   human_bytes(double(p.bytes_total)).c_str(), std::min(p.files_done + 1, p.files_total), p.files_total,
                   p.file.c_str());
      std::fflush(stderr);
    } else if (int(frac * 10) > decile_) {
      decile_ = int(frac * 10);
      std::fprintf(stderr, "%d%% %s / %s\n", decile_ * 10, human_bytes(double(p.bytes_done)).c_str(),
                   human_bytes(double(p.bytes_total)).c_str());
    }
  }
  void done() {
    if (tty_) std::fputc('\n', stderr);
  }

 private:
  bool tty_ = ::isatty(2);
  int decile_ = -1;
  std::chrono::steady_clock::time_point last_{};
};

Runner setup(CLI::App& app) {
  struct Opts {
    std::string models_dir, id, revision = "main";
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--models-dir", o->models_dir, "models directory (default: $SALA_MODELS_DIR or ~/.local/share/sala/models)");
  app.require_subcommand(1);
  CLI::App* list = app.add_subcommand("list", "List the models of the models directory and the Hugging Face cache");
  list->add_flag("--json", o->json, "one JSON object per model");
  CLI::App* dl = app.add_subcommand("download", "Download ORG/NAME from the Hugging Face hub ($HF_ENDPOINT, $HF_TOKEN)");
  dl->add_option("ID", o->id, "repository id ORG/NAME")->required();
  dl->add_option("--revision", o->revision, "branch, tag or commit")->capture_default_str();
  CLI::App* rm = app.add_subcommand("rm", "Delete a model from the models directory");
  rm->add_option("ID", o->id, "model id")->required();
  // `sala models list --models-dir DIR` as well as `sala models --models-dir DIR list`.
  for (CLI::App* sub : {list, dl, rm}) sub->fallthrough();

  return [o, list, dl, rm] {
    ModelRegistry registry(o->models_dir.empty() ? ModelRegistry::default_models_dir()
                                                 : std::filesystem::path(o->models_dir),
                           ModelRegistry::default_hub_cache());
    if (list->parsed()) {
      const auto models = registry.list();
      if (o->json) {
        for (const auto& m : models) std::printf("%s\n", ModelRegistry::describe(m).dump().c_str());
        return 0;
      }
      if (models.empty()) {
        std::printf("no models in %s or %s\n", registry.models_dir().c_str(), registry.hub_cache().c_str());
        return 0;
      }
      std::printf("%-40s %-10s %10s %-10s %s\n", "ID", "SOURCE", "SIZE", "DTYPE", "PATH");
      for (const auto& m : models) {
        const auto d = ModelRegistry::describe(m);
        std::printf("%-40s %-10s %10s %-10s %s\n", m.id.c_str(), m.source.c_str(),
                    human_bytes(double(d["size_bytes"].get<uint64_t>())).c_str(),
                    d["dtype"].is_string() ? d["dtype"].get<std::string>().c_str() : "-", m.dir.c_str());
      }
      return 0;
    }
    if (dl->parsed()) {
      ProgressBar bar;
      DownloadOptions opts;
      opts.revision = o->revision;
      opts.progress = [&](const DownloadProgress& p) { bar.update(p); };
      std::filesystem::path dir;
      try {
        dir = download_model(registry, o->id, opts);
      } catch (...) {
        bar.done();
        throw;
      }
      bar.done();
      std::printf("installed %s at %s\n", o->id.c_str(), dir.c_str());
      return 0;
    }
    if (rm->parsed()) {
      registry.remove(o->id);
      std::printf("removed %s\n", o->id.c_str());
      return 0;
    }
    return 1;
  };
}

}  // namespace
SALA_COMMAND(models, "Manage local models: list, download from the Hugging Face hub, remove", setup);
}  // namespace sala::cli
