// A minimal blocking HTTP/1.1 client over POSIX sockets for `sala bench --serve`: one request per
// connection (Connection: close), the response body handed over as it arrives (chunked transfer
// encoding decoded), so streamed SSE events can be timed. (server/http_client.h is libcurl GETs
// for downloads: no POST, no streaming callback.) Plain http only.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace sala::cli {

struct HttpUrl {
  std::string host;
  int port = 80;
  std::string prefix;  // path prefix without a trailing '/', e.g. "" or "/proxy"
};

// http://host[:port][/prefix]; throws sala::Error naming the URL otherwise (https included).
HttpUrl parse_http_url(const std::string& url);

// Sends METHOD prefix+path with a JSON body (none when empty) and returns the response status.
// Body bytes go to on_body as they arrive. Throws sala::Error on connection errors, a malformed
// response, or no bytes for timeout_s.
int http_request(const HttpUrl& url, const std::string& method, const std::string& path, const std::string& body,
                 const std::function<void(std::string_view)>& on_body, double timeout_s);

// The same, collecting the whole body.
int http_request(const HttpUrl& url, const std::string& method, const std::string& path, const std::string& body,
                 std::string& response, double timeout_s);

}  // namespace sala::cli
