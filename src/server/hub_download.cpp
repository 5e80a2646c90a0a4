#include "server/hub_download.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "server/http_client.h"
#include "server/model_registry.h"
#include "server/sha256.h"

namespace sala::server {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kAttempts = 5;  // per file; each attempt resumes where the last one stopped

struct RemoteFile {
  std::string path;
  std::optional<uint64_t> size;
  std::string sha256;  // empty: unknown (plain git files)
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string url_escape(const std::string& s, bool keep_slash) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/'))
      out += char(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

bool safe_relative(const std::string& p) {
  if (p.empty() || p[0] == '/' || p.find('\\') != std::string::npos) return false;
  for (const auto& part : fs::path(p))
    if (part == ".." || part == ".") return false;
  return true;
}

bool is_hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit((unsigned char)c); });
}

std::string unquote(std::string s) {
  if (s.rfind("W/", 0) == 0) s = s.substr(2);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

// Turns a failed hub answer into a message a user can act on.
[[noreturn]] void hub_fail(const std::string& what, const HttpResult& r, const std::string& endpoint) {
  if (!r.transport_error.empty() && r.status == 0) fail("{}: cannot reach {}: {}", what, endpoint, r.transport_error);
  if (r.status == 401 || r.status == 403)
    fail("{}: access denied (HTTP {}): the repository is private or gated; set HF_TOKEN to a token that has access",
         what, r.status);
  if (r.status == 404) fail("{}: not found on {} (HTTP 404): check the repository id and revision", what, endpoint);
  std::string body = r.body.substr(0, 200);
  fail("{}: HTTP {}{}{}", what, r.status, body.empty() ? "" : ": ", body);
}

std::vector<RemoteFile> list_files(const json& info, const std::string& what) {
  const json* sib = info.contains("siblings") ? &info["siblings"] : nullptr;
  SALA_CHECK(sib && sib->is_array(), "{}: the hub's answer has no file list", what);
  std::vector<RemoteFile> files;
  bool has_safetensors = false;
  for (const json& s : *sib) {
    if (!s.is_object() || !s.value("rfilename", json()).is_string()) continue;
    RemoteFile f;
    f.path = s["rfilename"].get<std::string>();
    SALA_CHECK(safe_relative(f.path), "{}: refusing the file name '{}'", what, f.path);
    if (s.value("size", json()).is_number_unsigned()) f.size = s["size"].get<uint64_t>();
    if (const json lfs = s.value("lfs", json()); lfs.is_object()) {
      const json sha = lfs.contains("sha256") ? lfs["sha256"] : lfs.value("oid", json());
      if (sha.is_string() && is_hex64(sha.get<std::string>())) f.sha256 = sha.get<std::string>();
      if (lfs.value("size", json()).is_number_unsigned()) f.size = lfs["size"].get<uint64_t>();
    }
    if (f.path.ends_with(".safetensors")) has_safetensors = true;
    files.push_back(std::move(f));
  }
  // Weights in other formats are of no use to the engine: skip them when safetensors are there.
  if (has_safetensors)
    std::erase_if(files, [](const RemoteFile& f) {
      for (const char* ext : {".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".gguf", ".ckpt"})
        if (f.path.ends_with(ext)) return true;
      return false;
    });
  SALA_CHECK(!files.empty(), "{}: the repository has no files", what);
  return files;
}

}  // namespace

std::string sha256_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  SALA_CHECK(in.good(), "cannot read {}", path.string());
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    h.update(buf.data(), size_t(in.gcount()));
  }
  return h.hex_digest();
}

fs::path download_model(const ModelRegistry& registry, const std::string& id, const DownloadOptions& o) {
  SALA_CHECK(valid_model_id(id) && id.find('/') != std::string::npos,
             "'{}' is not a hub repository id: expected ORG/NAME", id);
  const fs::path dest = registry.install_dir(id);
  SALA_CHECK(!fs::exists(dest), "model '{}' is already installed at {} (remove it first: sala models rm {})", id,
             dest.string(), id);
  std::string endpoint = !o.endpoint.empty() ? o.endpoint : env("HF_ENDPOINT");
  if (endpoint.empty()) endpoint = "https://huggingface.co";
  while (endpoint.ends_with('/')) endpoint.pop_back();
  std::string token = !o.token.empty() ? o.token : env("HF_TOKEN");
  if (token.empty()) token = env("HUGGING_FACE_HUB_TOKEN");
  std::vector<std::string> headers;
  if (!token.empty()) headers.push_back("Authorization: Bearer " + token);
  const std::string revision = o.revision.empty() ? "main" : o.revision;
  const std::string what = fmt::format("{}@{}", id, revision);

  HttpClient client;
  const HttpResult info_r =
      client.get(fmt::format("{}/api/models/{}/revision/{}?blobs=true", endpoint, url_escape(id, true),
                             url_escape(revision, false)),
                 headers);
  if (!info_r.ok()) hub_fail(what, info_r, endpoint);
  const json info = json::parse(info_r.body, nullptr, false);
  SALA_CHECK(info.is_object(), "{}: the hub's answer is not JSON", what);
  std::string sha = info.value("sha", json()).is_string() ? info["sha"].get<std::string>() : revision;
  SALA_CHECK(valid_model_id(sha), "{}: unexpected commit id '{}'", what, sha);
  const std::vector<RemoteFile> files = list_files(info, what);

  // Partial downloads live per commit, so a re-run resumes them and a new commit starts afresh.
  std::string slug = id;
  slug.replace(slug.find('/'), 1, "--");
  const fs::path partial = registry.models_dir() / ".partial" / (slug + "@" + sha);
  fs::create_directories(partial);

  DownloadProgress prog;
  prog.files_total = int(files.size());
  for (const auto& f : files) prog.bytes_total += f.size.value_or(0);
  auto report = [&] {
    if (o.progress) o.progress(prog);
  };
  uint64_t finished_bytes = 0;
  for (const RemoteFile& f : files) {
    const fs::path target = partial / f.path;
    fs::create_directories(target.parent_path());
    prog.file = f.path;
    const std::string url =
        fmt::format("{}/{}/resolve/{}/{}", endpoint, url_escape(id, true), url_escape(sha, false), url_escape(f.path, true));
    std::string linked_sha;
    std::error_code ec;
    for (int attempt = 1;; ++attempt) {
      if (o.cancel && o.cancel->load()) fail("{}: download cancelled", what);
      uint64_t have = fs::exists(target, ec) ? fs::file_size(target, ec) : 0;
      if (f.size && have > *f.size) have = 0;  // longer than the file: start again
      if (f.size && have == *f.size && have > 0) break;  // complete from an earlier run
      HttpResult r = client.fetch_to_file(url, headers, target, have, [&](uint64_t bytes) {
        prog.bytes_done = finished_bytes + bytes;
        report();
        return !(o.cancel && o.cancel->load());
      });
      if (auto it = r.headers.find("x-linked-etag"); it != r.headers.end() && is_hex64(unquote(it->second)))
        linked_sha = unquote(it->second);
      if (r.ok()) break;
      if (r.status == 416) break;  // nothing left to fetch; the checks below decide
      if (o.cancel && o.cancel->load()) fail("{}: download cancelled", what);
      const bool transient = r.status == 0 || r.status >= 500 || r.status == 429 || (r.status < 300 && !r.ok());
      if (!transient || attempt >= kAttempts) hub_fail(fmt::format("{}: {}", what, f.path), r, endpoint);
      std::this_thread::sleep_for(std::chrono::milliseconds(250 * attempt));
    }
    const uint64_t got = fs::file_size(target, ec);
    if (f.size && got != *f.size) {
      fs::remove(target, ec);
      fail("{}: {} has {} bytes, the hub says {}; the file was discarded", what, f.path, got, *f.size);
    }
    const std::string want_sha = !f.sha256.empty() ? f.sha256 : linked_sha;
    if (!want_sha.empty()) {
      const std::string have_sha = sha256_file(target);
      if (have_sha != want_sha) {
        fs::remove(target, ec);
        fail("{}: {} failed verification (sha256 {}, expected {}); the file was discarded", what, f.path, have_sha,
             want_sha);
      }
    }
    finished_bytes += got;
    ++prog.files_done;
    prog.bytes_done = finished_bytes;
    report();
  }

  // Provenance, then the one-step install.
  {
    std::ofstream meta(partial / "sala_download.json");
    meta << json{{"repo", id}, {"revision", revision}, {"commit", sha}, {"endpoint", endpoint}}.dump(2) << "\n";
  }
  fs::create_directories(dest.parent_path());
  std::error_code ec;
  fs::rename(partial, dest, ec);
  SALA_CHECK(!ec, "cannot move {} to {}: {}", partial.string(), dest.string(), ec.message());
  fs::remove(registry.models_dir() / ".partial", ec);  // only when empty
  return dest;
}

}  // namespace sala::server
