#include "cli/http_stream.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace sala::cli {

HttpUrl parse_http_url(const std::string& url) {
  const std::string scheme = "http://";
  SALA_CHECK(url.rfind(scheme, 0) == 0, "bad server URL '{}': expected http://HOST[:PORT] (https is not supported)",
             url);
  std::string rest = url.substr(scheme.size());
  HttpUrl u;
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    u.prefix = rest.substr(slash);
    rest.resize(slash);
    while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  }
  u.host = rest;
  if (const size_t colon = rest.rfind(':'); colon != std::string::npos && rest.find(']', colon) == std::string::npos) {
    u.host = rest.substr(0, colon);
    const std::string port = rest.substr(colon + 1);
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    SALA_CHECK(!port.empty() && *end == '\0' && p > 0 && p < 65536, "bad port '{}' in server URL '{}'", port, url);
    u.port = int(p);
  }
  if (u.host.size() > 2 && u.host.front() == '[' && u.host.back() == ']') u.host = u.host.substr(1, u.host.size() - 2);
  SALA_CHECK(!u.host.empty(), "bad server URL '{}': no host", url);
  return u;
}

namespace {

struct Socket {
  int fd = -1;
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

std::string where(const HttpUrl& u) { return u.host + ":" + std::to_string(u.port); }

void connect_to(Socket& s, const HttpUrl& u, double timeout_s) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(u.host.c_str(), std::to_string(u.port).c_str(), &hints, &res);
  SALA_CHECK(rc == 0, "cannot resolve '{}': {}", u.host, ::gai_strerror(rc));
  std::string err = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    s.fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (s.fd < 0) continue;
    timeval tv{};
    tv.tv_sec = time_t(timeout_s);
    tv.tv_usec = suseconds_t((timeout_s - double(tv.tv_sec)) * 1e6);
    ::setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(s.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(s.fd, a->ai_addr, a->ai_addrlen) == 0) break;
    err = std::strerror(errno);
    ::close(s.fd);
    s.fd = -1;
  }
  ::freeaddrinfo(res);
  SALA_CHECK(s.fd >= 0, "cannot connect to {}: {}", where(u), err);
}

void send_all(int fd, const std::string& data, const HttpUrl& u) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    SALA_CHECK(n > 0, "sending to {} failed: {}", where(u), std::strerror(errno));
    sent += size_t(n);
  }
}

// Decodes the body as it arrives: identity (to EOF or Content-Length) or chunked.
class BodyDecoder {
 public:
  BodyDecoder(bool chunked, long long length, const std::function<void(std::string_view)>& out)
      : chunked_(chunked), left_(length), out_(out) {}
  bool done() const { return done_; }
  void feed(std::string_view data) {
    if (!chunked_) {
      if (left_ >= 0) {
        data = data.substr(0, size_t(std::min<long long>(left_, (long long)data.size())));
        left_ -= (long long)data.size();
      }
      if (!data.empty()) out_(data);
      done_ = left_ == 0;
      return;
    }
    buf_.append(data);
    for (;;) {
      if (chunk_left_ > 0) {
        const size_t n = std::min(size_t(chunk_left_), buf_.size());
        if (n == 0) return;
        out_(std::string_view(buf_).substr(0, n));
        buf_.erase(0, n);
        chunk_left_ -= (long long)n;
        continue;
      }
      const size_t eol = buf_.find("\r\n");
      if (eol == std::string::npos) return;
      const std::string line = buf_.substr(0, eol);
      buf_.erase(0, eol + 2);
      if (after_chunk_) {  // the CRLF that ends a chunk's data
        SALA_CHECK(line.empty(), "malformed chunked response (data longer than its size)");
        after_chunk_ = false;
        continue;
      }
      char* end = nullptr;
      const long long size = std::strtoll(line.c_str(), &end, 16);
      SALA_CHECK(end != line.c_str() && size >= 0, "malformed chunk size line '{}'", line);
      if (size == 0) {
        done_ = true;
        return;
      }
      chunk_left_ = size;
      after_chunk_ = true;
    }
  }

 private:
  bool chunked_;
  long long left_;  // identity: bytes still expected (-1: until EOF)
  const std::function<void(std::string_view)>& out_;
  std::string buf_;
  long long chunk_left_ = 0;
  bool after_chunk_ = false, done_ = false;
};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

int http_request(const HttpUrl& u, const std::string& method, const std::string& path, const std::string& body,
                 const std::function<void(std::string_view)>& on_body, double timeout_s) {
  Socket s;
  connect_to(s, u, timeout_s);
  std::string req = method + " " + u.prefix + path + " HTTP/1.1\r\nHost: " + u.host + ":" + std::to_string(u.port) +
                    "\r\nConnection: close\r\nAccept: */*\r\n";
  if (!body.empty()) req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  send_all(s.fd, req, u);

  std::string head;
  std::unique_ptr<BodyDecoder> decoder;
  int status = 0;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(s.fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      fail("{} {}{} on {}: no response for {} s", method, u.prefix, path, where(u), timeout_s);
    SALA_CHECK(n >= 0, "reading from {} failed: {}", where(u), std::strerror(errno));
    if (n == 0) break;
    std::string_view data(buf, size_t(n));
    if (!decoder) {
      head.append(data);
      const size_t end = head.find("\r\n\r\n");
      if (end == std::string::npos) {
        SALA_CHECK(head.size() < (1 << 20), "response headers from {} over 1 MiB", where(u));
        continue;
      }
      // Status line and the two headers that frame the body.
      SALA_CHECK(head.rfind("HTTP/1.", 0) == 0 && head.size() > 12, "malformed HTTP response from {}: '{}'", where(u),
                 head.substr(0, std::min<size_t>(head.size(), 80)));
      status = std::atoi(head.c_str() + 9);
      bool chunked = false;
      long long length = -1;
      size_t pos = head.find("\r\n") + 2;
      while (pos < end) {
        const size_t eol = head.find("\r\n", pos);
        const std::string line = head.substr(pos, eol - pos);
        pos = eol + 2;
        const size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        const std::string name = lower(line.substr(0, colon));
        std::string value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        if (name == "transfer-encoding") chunked = lower(value).find("chunked") != std::string::npos;
        if (name == "content-length") length = std::atoll(value.c_str());
      }
      decoder = std::make_unique<BodyDecoder>(chunked, length, on_body);
      data = std::string_view(head).substr(end + 4);
      if (!data.empty() || length == 0) decoder->feed(data);
      if (decoder->done()) break;
      continue;
    }
    decoder->feed(data);
    if (decoder->done()) break;
  }
  SALA_CHECK(decoder, "{} closed the connection before a complete response to {} {}{}", where(u), method, u.prefix,
             path);
  return status;
}

int http_request(const HttpUrl& u, const std::string& method, const std::string& path, const std::string& body,
                 std::string& response, double timeout_s) {
  response.clear();
  return http_request(u, method, path, body, [&](std::string_view d) { response.append(d); }, timeout_s);
}

}  // namespace sala::cli
