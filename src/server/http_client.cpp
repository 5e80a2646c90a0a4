#include "server/http_client.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>

#include "core/error.h"

#if __has_include(<curl/curl.h>)
#include <curl/curl.h>
#define SALA_CURL_HEADERS 1
#endif

namespace sala::server {

#ifdef SALA_CURL_HEADERS

namespace {

// The few libcurl entry points used, resolved from the shared library.
struct CurlApi {
  CURLcode (*global_init)(long);
  CURL* (*easy_init)();
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...);
  CURLcode (*easy_perform)(CURL*);
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...);
  void (*easy_cleanup)(CURL*);
  const char* (*easy_strerror)(CURLcode);
  curl_slist* (*slist_append)(curl_slist*, const char*);
  void (*slist_free_all)(curl_slist*);
};

const CurlApi& api() {
  static CurlApi a = [] {
    void* lib = nullptr;
    for (const char* name : {"libcurl.so.4", "libcurl.so", "libcurl-gnutls.so.4"})
      if ((lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    SALA_CHECK(lib, "model downloads need libcurl (libcurl.so.4), which could not be loaded: install libcurl4");
    auto sym = [&](const char* name) {
      void* p = ::dlsym(lib, name);
      SALA_CHECK(p, "libcurl lacks {}", name);
      return p;
    };
    CurlApi c;
    c.global_init = reinterpret_cast<decltype(c.global_init)>(sym("curl_global_init"));
    c.easy_init = reinterpret_cast<decltype(c.easy_init)>(sym("curl_easy_init"));
    c.easy_setopt = reinterpret_cast<decltype(c.easy_setopt)>(sym("curl_easy_setopt"));
    c.easy_perform = reinterpret_cast<decltype(c.easy_perform)>(sym("curl_easy_perform"));
    c.easy_getinfo = reinterpret_cast<decltype(c.easy_getinfo)>(sym("curl_easy_getinfo"));
    c.easy_cleanup = reinterpret_cast<decltype(c.easy_cleanup)>(sym("curl_easy_cleanup"));
    c.easy_strerror = reinterpret_cast<decltype(c.easy_strerror)>(sym("curl_easy_strerror"));
    c.slist_append = reinterpret_cast<decltype(c.slist_append)>(sym("curl_slist_append"));
    c.slist_free_all = reinterpret_cast<decltype(c.slist_free_all)>(sym("curl_slist_free_all"));
    SALA_CHECK(c.global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK, "libcurl failed to initialise");
    return c;
  }();
  return a;
}

struct Transfer {
  CURL* h = nullptr;
  HttpResult* result = nullptr;
  // fetch_to_file
  FILE* file = nullptr;
  uint64_t offset = 0, written = 0;
  bool checked = false, error_body = false;
  const std::function<bool(uint64_t)>* progress = nullptr;
};

size_t on_header(char* p, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  std::string line(p, size * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  const size_t colon = line.find(':');
  if (colon != std::string::npos && line.rfind("HTTP/", 0) != 0) {
    std::string name = line.substr(0, colon);
    for (char& c : name) c = char(std::tolower((unsigned char)c));
    size_t v = colon + 1;
    while (v < line.size() && line[v] == ' ') ++v;
    t->result->headers[name] = line.substr(v);
  }
  return size * n;
}

size_t on_body(char* p, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  const size_t len = size * n;
  if (!t->file) {
    t->result->body.append(p, len);
    return len;
  }
  if (!t->checked) {
    t->checked = true;
    long code = 0;
    api().easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 300) {
      t->error_body = true;  // an error page must not end up in the model file
    } else if (code == 200 && t->offset > 0) {
      // The server ignored the Range: start the file again.
      if (::ftruncate(::fileno(t->file), 0) != 0 || std::fseek(t->file, 0, SEEK_SET) != 0) return 0;
      t->offset = 0;
    }
  }
  if (t->error_body) {
    if (t->result->body.size() < 4096) t->result->body.append(p, std::min<size_t>(len, 4096));
    return len;
  }
  if (std::fwrite(p, 1, len, t->file) != len) return 0;
  t->written += len;
  if (t->progress && *t->progress && !(*t->progress)(t->offset + t->written)) return 0;  // abort
  return len;
}

HttpResult perform(const std::string& url, const std::vector<std::string>& headers, Transfer& t,
                   const std::string& range) {
  const CurlApi& c = api();
  HttpResult r;
  t.result = &r;
  CURL* h = c.easy_init();
  SALA_CHECK(h, "libcurl: cannot create a handle");
  t.h = h;
  curl_slist* list = nullptr;
  for (const auto& hd : headers) list = c.slist_append(list, hd.c_str());
  c.easy_setopt(h, CURLOPT_URL, url.c_str());
  c.easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
  c.easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
  c.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  c.easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
  // A stalled transfer (under 1 byte/s for a minute) fails and is retried by the caller.
  c.easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  c.easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
  c.easy_setopt(h, CURLOPT_USERAGENT, "sala/0.1");
  c.easy_setopt(h, CURLOPT_HTTPHEADER, list);
  c.easy_setopt(h, CURLOPT_HEADERFUNCTION, &on_header);
  c.easy_setopt(h, CURLOPT_HEADERDATA, &t);
  c.easy_setopt(h, CURLOPT_WRITEFUNCTION, &on_body);
  c.easy_setopt(h, CURLOPT_WRITEDATA, &t);
  if (!range.empty()) c.easy_setopt(h, CURLOPT_RANGE, range.c_str());
  const CURLcode rc = c.easy_perform(h);
  c.easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  if (rc != CURLE_OK) r.transport_error = c.easy_strerror(rc);
  c.slist_free_all(list);
  c.easy_cleanup(h);
  t.result = nullptr;
  return r;
}

}  // namespace

HttpClient::HttpClient() { (void)api(); }

HttpResult HttpClient::get(const std::string& url, const std::vector<std::string>& headers) {
  Transfer t;
  return perform(url, headers, t, "");
}

HttpResult HttpClient::fetch_to_file(const std::string& url, const std::vector<std::string>& headers,
                                     const std::filesystem::path& file, uint64_t offset,
                                     const std::function<bool(uint64_t)>& on_progress) {
  Transfer t;
  t.offset = offset;
  t.progress = &on_progress;
  t.file = std::fopen(file.c_str(), offset > 0 ? "ab" : "wb");
  SALA_CHECK(t.file, "cannot write {}", file.string());
  HttpResult r = perform(url, headers, t, offset > 0 ? std::to_string(offset) + "-" : "");
  const bool flushed = std::fflush(t.file) == 0 && ::fsync(::fileno(t.file)) == 0;
  std::fclose(t.file);
  SALA_CHECK(flushed, "cannot write {}", file.string());
  return r;
}

#else  // no libcurl headers at build time

HttpClient::HttpClient() { fail("model downloads are not available: sala was built without libcurl headers"); }
HttpResult HttpClient::get(const std::string&, const std::vector<std::string>&) { return {}; }
HttpResult HttpClient::fetch_to_file(const std::string&, const std::vector<std::string>&, const std::filesystem::path&,
                                     uint64_t, const std::function<bool(uint64_t)>&) {
  return {};
}

#endif

}  // namespace sala::server
