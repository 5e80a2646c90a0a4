// Outgoing HTTP(S) GETs for model downloads, over libcurl loaded at run time (dlopen of
// libcurl.so.4): the engine then neither links nor needs libcurl unless it downloads. Redirects
// are followed (the hub sends large files to a CDN); the headers of every response in the chain
// are kept, since the hub puts X-Linked-Etag / X-Linked-Size on the redirect itself.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace sala::server {

struct HttpResult {
  long status = 0;                             // of the last response; 0 when none came
  std::map<std::string, std::string> headers;  // lower-cased names, over the whole redirect chain
  std::string body;                            // get(); for fetch_to_file only an error body
  std::string transport_error;                 // curl's message when the transfer failed
  bool ok() const { return transport_error.empty() && status >= 200 && status < 300; }
};

class HttpClient {
 public:
  HttpClient();  // throws sala::Error when libcurl cannot be loaded
  HttpResult get(const std::string& url, const std::vector<std::string>& headers);
  // Appends the body to `file`, asking for bytes from `offset` on (Range) when offset > 0. If the
  // server ignores the range (200), the file is restarted from zero. on_progress(file bytes)
  // returning false aborts the transfer.
  HttpResult fetch_to_file(const std::string& url, const std::vector<std::string>& headers,
                           const std::filesystem::path& file, uint64_t offset,
                           const std::function<bool(uint64_t)>& on_progress);
};

}  // namespace sala::server
