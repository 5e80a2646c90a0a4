// A small HTTP/1.1 server over POSIX sockets: one thread per connection (bounded), keep-alive,
// Content-Length request bodies (with "Expect: 100-continue"), chunked streaming responses, and
// a routing table. Written here rather than taken from cpp-httplib because Debian's httplib
// ships no CMake package (find_package never finds it) and its fixed thread pool would cap the
// number of concurrent streams; this server also lets a handler ask whether its client is still
// connected, which is how an abandoned generation gets cancelled.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace sala::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method, path, query;  // path without the query string, not percent-decoded
  Headers headers;                  // names lower-cased
  std::string body;
  std::string path_rest;            // what a trailing "*" of the matched route covered
  std::function<bool()> client_alive;  // false once the peer has closed its side

  const std::string* header(std::string_view lower_name) const;
};

// Writes the body of a streaming response as it is produced.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual bool write(std::string_view data) = 0;  // false: the client is gone (stop producing)
  virtual bool alive() = 0;                       // the client has not closed the connection
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;
  // When set, the body is produced by this function (chunked transfer encoding) instead of `body`.
  std::function<void(Sink&)> stream;
};

using Handler = std::function<Response(Request&)>;

struct ServerOptions {
  int max_connections = 512;             // further connections get 503 at once
  size_t max_body_bytes = 64u << 20;     // larger bodies: 413
  size_t max_header_bytes = 64u << 10;   // larger heads: 431
  int idle_timeout_ms = 30000;           // keep-alive connections idle this long are closed
  int write_timeout_ms = 30000;          // a client that accepts no data this long is dropped
};

class Server {
 public:
  explicit Server(ServerOptions options = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // pattern: an exact path, or a prefix ending in "*" (the rest goes to Request::path_rest).
  void route(std::string method, std::string pattern, Handler handler);
  // Runs before routing; a returned response is sent instead of the route's (auth, CORS preflight).
  void set_filter(std::function<std::optional<Response>(Request&)> filter) { filter_ = std::move(filter); }
  // Builds error responses of the transport itself (404, 405, 413, 500 ...).
  void set_error_page(std::function<Response(int status, const std::string& message)> page) {
    error_page_ = std::move(page);
  }
  void set_default_headers(Headers headers) { default_headers_ = std::move(headers); }

  // Binds and listens; port 0 picks a free port. Returns the bound port. Throws sala::Error.
  int listen(const std::string& host, int port);
  // Accepts connections until stop(); then waits (bounded) for open connections to finish.
  void run();
  // Thread-safe: stops accepting and ends idle keep-alive connections; running handlers finish.
  void stop();
  bool stopping() const { return stopping_.load(); }

 private:
  struct Route {
    std::string method, pattern;
    bool prefix;
    Handler handler;
  };
  void serve_connection(int fd);
  Response dispatch(Request& req);
  Response error(int status, const std::string& message) const;

  ServerOptions options_;
  std::vector<Route> routes_;
  std::function<std::optional<Response>(Request&)> filter_;
  std::function<Response(int, const std::string&)> error_page_;
  Headers default_headers_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  int connections_ = 0;
};

const char* status_text(int status);

}  // namespace sala::http
