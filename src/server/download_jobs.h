// Background model downloads for POST /v1/models/download: each job runs download_model on its
// own thread; GET /v1/models/download/{job} reads its progress. A second request for a model that
// is already downloading returns the running job.
#pragma once
#include <nlohmann/json.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "server/hub_download.h"

namespace sala::server {

class ModelRegistry;

class DownloadJobs {
 public:
  DownloadJobs(const ModelRegistry& registry, DownloadOptions base);
  ~DownloadJobs();  // cancels running jobs and joins them

  // {"id", "object": "model.download", "model", "revision", "status": queued|running|done|failed,
  //  "files_done", "files_total", "bytes_done", "bytes_total", "error"?, "path"?}
  nlohmann::json start(const std::string& model, const std::string& revision);
  std::optional<nlohmann::json> status(const std::string& job) const;

 private:
  struct Job {
    std::string id, model, revision, status = "queued", error, path;
    DownloadProgress progress;
    std::thread thread;
  };
  nlohmann::json describe(const Job& j) const;  // needs mu_

  const ModelRegistry& registry_;
  DownloadOptions base_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  std::atomic<bool> cancel_{false};
  int next_ = 1;
};

}  // namespace sala::server
