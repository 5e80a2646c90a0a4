#include "server/download_jobs.h"

#include "server/model_registry.h"

namespace sala::server {

using nlohmann::json;

DownloadJobs::DownloadJobs(const ModelRegistry& registry, DownloadOptions base)
    : registry_(registry), base_(std::move(base)) {}

DownloadJobs::~DownloadJobs() {
  cancel_.store(true);
  for (auto& [id, j] : jobs_)
    if (j->thread.joinable()) j->thread.join();
}

json DownloadJobs::describe(const Job& j) const {
  json d = {{"id", j.id},
            {"object", "model.download"},
            {"model", j.model},
            {"revision", j.revision},
            {"status", j.status},
            {"file", j.progress.file},
            {"files_done", j.progress.files_done},
            {"files_total", j.progress.files_total},
            {"bytes_done", j.progress.bytes_done},
            {"bytes_total", j.progress.bytes_total}};
  if (!j.error.empty()) d["error"] = j.error;
  if (!j.path.empty()) d["path"] = j.path;
  return d;
}

json DownloadJobs::start(const std::string& model, const std::string& revision) {
  std::lock_guard lk(mu_);
  for (auto& [id, j] : jobs_)
    if (j->model == model && j->revision == revision && (j->status == "queued" || j->status == "running"))
      return describe(*j);
  auto job = std::make_unique<Job>();
  job->id = "dl-" + std::to_string(next_++);
  job->model = model;
  job->revision = revision;
  Job* j = job.get();
  jobs_.emplace(j->id, std::move(job));
  j->thread = std::thread([this, j] {
    DownloadOptions o = base_;
    o.revision = j->revision;
    o.cancel = &cancel_;
    o.progress = [this, j](const DownloadProgress& p) {
      std::lock_guard lk(mu_);
      j->progress = p;
    };
    {
      std::lock_guard lk(mu_);
      j->status = "running";
    }
    std::string path, error;
    try {
      path = download_model(registry_, j->model, o).string();
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::lock_guard lk(mu_);
    j->status = error.empty() ? "done" : "failed";
    j->error = error;
    j->path = path;
  });
  return describe(*j);
}

std::optional<json> DownloadJobs::status(const std::string& job) const {
  std::lock_guard lk(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return std::nullopt;
  return describe(*it->second);
}

}  // namespace sala::server
