#include "server/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"

namespace sala::http {

const char* status_text(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
  }
  return "Unknown";
}

const std::string* Request::header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers)
    if (k == lower_name) return &v;
  return nullptr;
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTickMs = 100;  // how often blocked waits look at the stop flag

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower((unsigned char)c));
  return s;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// One client socket: buffered reads and timed writes that give up when the server stops.
class Conn {
 public:
  Conn(int fd, const std::atomic<bool>& stopping, const ServerOptions& o) : fd_(fd), stopping_(stopping), o_(o) {}

  // Reads more bytes into buf. false on EOF, error, timeout, or (when idle_ok) server stop.
  bool fill(int timeout_ms, bool stop_aborts) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      if (stop_aborts && stopping_.load()) return false;
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, kTickMs);
      if (r < 0 && errno != EINTR) return false;
      if (r > 0) {
        char tmp[16384];
        ssize_t n = ::recv(fd_, tmp, sizeof tmp, MSG_DONTWAIT);
        if (n > 0) {
          buf.append(tmp, size_t(n));
          return true;
        }
        if (n == 0) return false;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      }
      if (Clock::now() >= deadline) return false;
    }
  }

  bool send_all(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        data.remove_prefix(size_t(n));
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      // The client's window is full: wait for it, but not forever.
      const auto deadline = Clock::now() + std::chrono::milliseconds(o_.write_timeout_ms);
      for (;;) {
        pollfd p{fd_, POLLOUT, 0};
        int r = ::poll(&p, 1, kTickMs);
        if (r > 0 && (p.revents & (POLLERR | POLLHUP))) return false;
        if (r > 0) break;
        if (Clock::now() >= deadline) return false;
      }
    }
    return true;
  }

  // The peer has not closed its side (pipelined bytes waiting count as alive).
  bool peer_open() const {
    pollfd p{fd_, short(POLLIN | POLLRDHUP), 0};
    if (::poll(&p, 1, 0) <= 0) return true;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) return false;
    if (p.revents & POLLIN) {
      char c;
      return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) != 0;
    }
    return true;
  }

  std::string buf;

 private:
  int fd_;
  const std::atomic<bool>& stopping_;
  const ServerOptions& o_;
};

class ChunkedSink : public Sink {
 public:
  explicit ChunkedSink(Conn& c) : c_(c) {}
  bool write(std::string_view data) override {
    if (!ok_) return false;
    if (data.empty()) return true;
    std::string frame = fmt::format("{:x}\r\n", data.size());
    frame.append(data);
    frame += "\r\n";
    ok_ = c_.send_all(frame);
    return ok_;
  }
  bool alive() override { return ok_ && c_.peer_open(); }
  bool ok() const { return ok_; }

 private:
  Conn& c_;
  bool ok_ = true;
};

// Parses "METHOD target HTTP/1.x" and header lines. Returns false on a malformed head.
bool parse_head(std::string_view head, Request& req, std::string& version) {
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  size_t a = line.find(' '), b = line.rfind(' ');
  if (a == std::string_view::npos || b == a) return false;
  req.method = std::string(line.substr(0, a));
  std::string_view target = line.substr(a + 1, b - a - 1);
  version = std::string(line.substr(b + 1));
  if (version.rfind("HTTP/1.", 0) != 0 || target.empty()) return false;
  size_t q = target.find('?');
  req.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));
  size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    size_t end = head.find("\r\n", pos);
    if (end == std::string_view::npos) end = head.size();
    std::string_view h = head.substr(pos, end - pos);
    pos = end + 2;
    if (h.empty()) continue;
    size_t colon = h.find(':');
    if (colon == std::string_view::npos || colon == 0) return false;
    req.headers.emplace_back(lower(std::string(h.substr(0, colon))), std::string(trim(h.substr(colon + 1))));
  }
  return true;
}

std::string head_of(const Response& r, const Headers& defaults, bool keep_alive) {
  std::string s = fmt::format("HTTP/1.1 {} {}\r\n", r.status, status_text(r.status));
  if (!r.content_type.empty()) s += "Content-Type: " + r.content_type + "\r\n";
  if (r.stream)
    s += "Transfer-Encoding: chunked\r\n";
  else
    s += fmt::format("Content-Length: {}\r\n", r.body.size());
  s += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : defaults) s += k + ": " + v + "\r\n";
  for (const auto& [k, v] : r.headers) s += k + ": " + v + "\r\n";
  return s + "\r\n";
}

}  // namespace

Server::Server(ServerOptions options) : options_(options) {}

Server::~Server() {
  stop();
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, std::chrono::seconds(30), [&] { return connections_ == 0; });
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void Server::route(std::string method, std::string pattern, Handler handler) {
  const bool prefix = !pattern.empty() && pattern.back() == '*';
  if (prefix) pattern.pop_back();
  routes_.push_back({std::move(method), std::move(pattern), prefix, std::move(handler)});
}

Response Server::error(int status, const std::string& message) const {
  if (error_page_) return error_page_(status, message);
  Response r;
  r.status = status;
  r.content_type = "text/plain";
  r.body = message + "\n";
  return r;
}

int Server::listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  SALA_CHECK(rc == 0, "cannot resolve host '{}': {}", host, gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
      listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  SALA_CHECK(listen_fd_ >= 0, "cannot listen on {}:{}: {}", host, port, last_error);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

void Server::stop() { stopping_.store(true); }

void Server::run() {
  SALA_CHECK(listen_fd_ >= 0, "http server: listen() first");
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, kTickMs) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors (EMFILE) leaves the socket readable: back off instead of spinning.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // SSE chunks must not wait for Nagle
    {
      std::lock_guard lk(mu_);
      if (connections_ >= options_.max_connections) {
        Response r = error(503, "too many connections");
        std::string s = head_of(r, default_headers_, false) + r.body;
        (void)!::send(fd, s.data(), s.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        ::close(fd);
        continue;
      }
      ++connections_;
    }
    std::thread([this, fd] {
      try {
        serve_connection(fd);
      } catch (...) {
      }
      ::close(fd);
      std::lock_guard lk(mu_);
      --connections_;
      cv_.notify_all();
    }).detach();
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, std::chrono::seconds(30), [&] { return connections_ == 0; });
}

Response Server::dispatch(Request& req) {
  if (filter_)
    if (auto r = filter_(req)) return std::move(*r);
  bool path_known = false;
  for (const Route& rt : routes_) {
    const bool match = rt.prefix ? req.path.rfind(rt.pattern, 0) == 0 : req.path == rt.pattern;
    if (!match) continue;
    path_known = true;
    if (rt.method != req.method) continue;
    if (rt.prefix) req.path_rest = req.path.substr(rt.pattern.size());
    return rt.handler(req);
  }
  return path_known ? error(405, fmt::format("method {} not allowed on {}", req.method, req.path))
                    : error(404, fmt::format("no endpoint {} {}", req.method, req.path));
}

void Server::serve_connection(int fd) {
  Conn conn(fd, stopping_, options_);
  for (;;) {
    // Head. Waiting for a new request ends when the server stops; a half-read one is finished.
    size_t head_end;
    while ((head_end = conn.buf.find("\r\n\r\n")) == std::string::npos) {
      if (conn.buf.size() > options_.max_header_bytes) {
        Response r = error(431, "request head too large");
        conn.send_all(head_of(r, default_headers_, false) + r.body);
        return;
      }
      if (!conn.fill(options_.idle_timeout_ms, conn.buf.empty())) return;
    }
    Request req;
    std::string version;
    const bool parsed = parse_head(std::string_view(conn.buf).substr(0, head_end), req, version);
    conn.buf.erase(0, head_end + 4);
    auto reply_and_close = [&](int status, const std::string& msg) {
      Response r = error(status, msg);
      conn.send_all(head_of(r, default_headers_, false) + r.body);
    };
    if (!parsed) return reply_and_close(400, "malformed HTTP request");
    const std::string* conn_h = req.header("connection");
    const std::string conn_v = conn_h ? lower(*conn_h) : "";
    bool keep_alive = version == "HTTP/1.1" ? conn_v.find("close") == std::string::npos
                                            : conn_v.find("keep-alive") != std::string::npos;

    // Body.
    if (req.header("transfer-encoding")) return reply_and_close(411, "chunked request bodies are not supported");
    size_t length = 0;
    if (const std::string* cl = req.header("content-length")) {
      try {
        size_t used = 0;
        unsigned long long v = std::stoull(*cl, &used);
        if (used != cl->size()) throw std::invalid_argument("trailing");
        length = size_t(v);
      } catch (const std::exception&) {
        return reply_and_close(400, "invalid Content-Length");
      }
    }
    if (length > options_.max_body_bytes)
      return reply_and_close(413, fmt::format("request body over {} bytes", options_.max_body_bytes));
    if (length > conn.buf.size()) {
      if (const std::string* ex = req.header("expect"); ex && lower(*ex) == "100-continue")
        if (!conn.send_all("HTTP/1.1 100 Continue\r\n\r\n")) return;
      while (conn.buf.size() < length)
        if (!conn.fill(options_.idle_timeout_ms, false)) return;
    }
    req.body = conn.buf.substr(0, length);
    conn.buf.erase(0, length);
    req.client_alive = [&conn] { return conn.peer_open(); };

    Response resp;
    try {
      resp = dispatch(req);
    } catch (const std::exception& e) {
      resp = error(500, e.what());
    }
    if (stopping_.load()) keep_alive = false;
    if (!resp.stream) {
      if (!conn.send_all(head_of(resp, default_headers_, keep_alive) + resp.body)) return;
    } else {
      if (!conn.send_all(head_of(resp, default_headers_, keep_alive))) return;
      ChunkedSink sink(conn);
      resp.stream(sink);
      if (!sink.ok() || !conn.send_all("0\r\n\r\n")) return;
    }
    if (!keep_alive || stopping_.load()) return;
  }
}

}  // namespace sala::http
