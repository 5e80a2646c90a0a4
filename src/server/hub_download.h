// Downloading a model repository from a Hugging Face hub (or a mirror) into the models directory.
//
//   1. GET {endpoint}/api/models/{ORG/NAME}/revision/{rev}  -> the commit sha and the file list
//      (with sizes, and sha256 for LFS files when the hub gives them)
//   2. for each file: GET {endpoint}/{ORG/NAME}/resolve/{sha}/{path} into
//      <models-dir>/.partial/ORG--NAME@sha/, resuming a partial file with "Range: bytes=N-";
//      the size and, where known, the sha256 (LFS oid, or the X-Linked-Etag of the hub's
//      redirect) are verified; a file that fails verification is deleted and the download fails
//   3. the finished directory is renamed into place (<models-dir>/ORG/NAME) in one step, so a
//      model directory is either complete or absent.
// HF_TOKEN (or DownloadOptions::token) is sent as a Bearer token. libcurl is loaded at run time
// (libcurl.so.4), so the engine builds and runs without it; only downloads need it.
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace sala::server {

class ModelRegistry;

struct DownloadProgress {
  std::string file;               // file being fetched
  int files_done = 0, files_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;  // over all files (resumed bytes count as done)
};

struct DownloadOptions {
  std::string endpoint;  // empty: $HF_ENDPOINT, else https://huggingface.co
  std::string token;     // empty: $HF_TOKEN
  std::string revision = "main";
  std::function<void(const DownloadProgress&)> progress;  // called often; keep it cheap
  const std::atomic<bool>* cancel = nullptr;               // set: stop at the next chunk
};

// Returns the installed directory. Throws sala::Error with a message fit for users (404: no such
// repository or revision; 401/403: needs HF_TOKEN or access; checksum or size mismatch; ...).
// Fails if the model is already installed.
std::filesystem::path download_model(const ModelRegistry& registry, const std::string& id,
                                     const DownloadOptions& options);

// Hex sha256 of a file (used to verify downloads).
std::string sha256_file(const std::filesystem::path& path);

}  // namespace sala::server
