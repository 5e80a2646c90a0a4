#include "cli/bench_serve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/http_stream.h"
#include "core/error.h"

namespace sala::cli {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Result {
  bool ok = false;
  std::string error;
  double start = 0, ttft = -1, end = 0;  // start and end: seconds since the level began
  int64_t prompt_tokens = -1, output_tokens = -1;
};

double percentile(std::vector<double> v, double p) {  // nearest rank
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(p / 100.0 * double(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

json summary(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return {{"p50", percentile(v, 50)}, {"p99", percentile(v, 99)}, {"mean", v.empty() ? 0 : sum / double(v.size())},
          {"min", percentile(v, 0)}, {"max", percentile(v, 100)}, {"n", v.size()}};
}

// One streaming completion. Never throws: a failure is recorded in the result.
Result one_request(const HttpUrl& url, const std::string& body, double timeout_s, Clock::time_point level_start) {
  Result r;
  const auto t0 = Clock::now();
  r.start = std::chrono::duration<double>(t0 - level_start).count();
  std::string pending, error_body;
  bool done = false;
  int status = 0;
  try {
    status = http_request(url, "POST", "/v1/completions", body, [&](std::string_view data) {
      pending.append(data);
      for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
        const std::string event = pending.substr(0, end);
        if (event.rfind("data: ", 0) != 0) {
          error_body = event;  // not SSE: an error body, kept for the message
          continue;
        }
        const std::string payload = event.substr(6);
        if (payload == "[DONE]") {
          done = true;
          continue;
        }
        const json j = json::parse(payload, nullptr, false);
        if (j.is_discarded()) {
          r.error = "unparsable SSE event: " + payload.substr(0, 200);
          continue;
        }
        if (j.contains("error")) r.error = "server error event: " + j["error"].value("message", j["error"].dump());
        const json& ch = j.value("choices", json::array());
        if (r.ttft < 0 && ch.is_array() && !ch.empty() && ch[0].value("finish_reason", json()).is_null())
          r.ttft = since(t0);
        if (j.contains("usage") && j["usage"].is_object()) {
          r.prompt_tokens = j["usage"].value("prompt_tokens", int64_t(-1));
          r.output_tokens = j["usage"].value("completion_tokens", int64_t(-1));
        }
      }
    }, timeout_s);
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  r.end = r.start + since(t0);
  if (r.error.empty() && status != 200)
    r.error = "HTTP " + std::to_string(status) + ": " + (error_body.empty() ? pending : error_body).substr(0, 300);
  if (r.error.empty() && !done) r.error = "the stream ended without [DONE]";
  if (r.error.empty() && r.output_tokens < 0) r.error = "no usage chunk in the stream";
  if (r.error.empty() && r.ttft < 0) r.error = "no token chunk in the stream";
  r.ok = r.error.empty();
  return r;
}

json get_json(const HttpUrl& url, const std::string& method, const std::string& path, const std::string& body,
              double timeout_s) {
  std::string resp;
  const int status = http_request(url, method, path, body, resp, timeout_s);
  SALA_CHECK(status == 200, "bench --serve: {} {} answered HTTP {}: {}", method, path, status, resp.substr(0, 300));
  json j = json::parse(resp, nullptr, false);
  SALA_CHECK(!j.is_discarded(), "bench --serve: {} {} returned no JSON: {}", method, path, resp.substr(0, 300));
  return j;
}

// Token ids of a filler text from the server's own tokenizer, so prompts are valid for its vocab.
std::vector<int64_t> filler_tokens(const HttpUrl& url, double timeout_s) {
  const std::string text =
      "The river runs past the old mill and under the stone bridge, where the town keeps its market every "
      "morning. Farmers bring apples, bread, cheese and honey; children count the boats; the baker sings. ";
  const json j = get_json(url, "POST", "/tokenize", json{{"content", text}}.dump(), timeout_s);
  std::vector<int64_t> t;
  for (const json& x : j.value("tokens", json::array())) t.push_back(x.is_object() ? x.value("id", int64_t(0)) : x.get<int64_t>());
  SALA_CHECK(!t.empty(), "bench --serve: /tokenize returned no tokens");
  return t;
}

}  // namespace

int run_serve_bench(const ServeBenchOptions& o) {
  SALA_CHECK(o.prompt_tokens > 0 && o.max_tokens > 0, "bench --serve: --prompt-tokens ({}) and --max-tokens ({}) must "
             "be positive", o.prompt_tokens, o.max_tokens);
  SALA_CHECK(!o.concurrency.empty(), "bench --serve: --concurrency is empty");
  for (int64_t c : o.concurrency) SALA_CHECK(c > 0 && c <= 4096, "bench --serve: bad concurrency {}", c);
  SALA_CHECK(o.requests >= 0, "bench --serve: --requests must be >= 0 (0: 2 x concurrency)");
  const HttpUrl url = parse_http_url(o.url);

  std::string health;
  const int hs = http_request(url, "GET", "/health", "", health, o.timeout_s);
  SALA_CHECK(hs == 200, "bench --serve: {}/health answered HTTP {} ({}); wait until the model is loaded", o.url, hs,
             health.substr(0, 200));
  const json models = get_json(url, "GET", "/v1/models", "", o.timeout_s);
  SALA_CHECK(models.contains("data") && !models["data"].empty(), "bench --serve: /v1/models lists no model");
  const std::string model = models["data"][0].value("id", "");
  const std::vector<int64_t> filler = filler_tokens(url, o.timeout_s);

  auto body_for = [&](int64_t i) {
    std::vector<int64_t> prompt(size_t(o.prompt_tokens));
    for (int64_t k = 0; k < o.prompt_tokens; ++k) prompt[size_t(k)] = filler[size_t((i * 7 + k) % int64_t(filler.size()))];
    return json{{"model", model},         {"prompt", prompt},         {"max_tokens", o.max_tokens},
                {"temperature", 0},       {"ignore_eos", true},       {"stream", true},
                {"stream_options", {{"include_usage", true}}}}
        .dump();
  };
  std::fprintf(stderr, "bench --serve: %s, model '%s', prompts of %lld tokens, %lld output tokens each\n",
               o.url.c_str(), model.c_str(), (long long)o.prompt_tokens, (long long)o.max_tokens);
  for (int i = 0; i < o.warmup; ++i) {
    const Result r = one_request(url, body_for(1000003 + i), o.timeout_s, Clock::now());
    SALA_CHECK(r.ok, "bench --serve: warm-up request failed: {}", r.error);
  }

  std::printf("%-5s %5s %5s %9s %8s %10s %7s %9s %9s %8s %8s %12s\n", "conc", "reqs", "fail", "out tok", "wall s",
              "out tok/s", "req/s", "TTFT p50", "TTFT p99", "lat p50", "lat p99", "dec t/s/req");
  json levels = json::array();
  int failures = 0;
  std::string first_error;
  int64_t short_outputs = 0, other_prompt_len = 0;
  for (const int64_t c : o.concurrency) {
    const int64_t n = o.requests > 0 ? o.requests : 2 * c;
    std::vector<Result> results(static_cast<size_t>(n));
    std::atomic<int64_t> next{0};
    const auto t0 = Clock::now();
    std::vector<std::thread> clients;
    for (int64_t k = 0; k < std::min(c, n); ++k)
      clients.emplace_back([&] {
        for (int64_t i; (i = next++) < n;) results[size_t(i)] = one_request(url, body_for(i), o.timeout_s, t0);
      });
    for (auto& t : clients) t.join();
    const double wall = since(t0);

    std::vector<double> ttft, latency, decode;
    int64_t out_tokens = 0, failed = 0;
    for (const Result& r : results) {
      if (!r.ok) {
        ++failed;
        if (first_error.empty()) first_error = r.error;
        continue;
      }
      ttft.push_back(r.ttft);
      latency.push_back(r.end - r.start);
      out_tokens += r.output_tokens;
      short_outputs += r.output_tokens < o.max_tokens;
      other_prompt_len += r.prompt_tokens != o.prompt_tokens;
      const double decode_s = (r.end - r.start) - r.ttft;
      if (r.output_tokens > 1 && decode_s > 0) decode.push_back(double(r.output_tokens - 1) / decode_s);
    }
    failures += int(failed);
    const json t = summary(ttft), l = summary(latency), d = summary(decode);
    std::printf("%-5lld %5lld %5lld %9lld %8.2f %10.1f %7.2f %9.3f %9.3f %8.3f %8.3f %12.1f\n", (long long)c,
                (long long)n, (long long)failed, (long long)out_tokens, wall, double(out_tokens) / wall,
                double(n - failed) / wall, t["p50"].get<double>(), t["p99"].get<double>(), l["p50"].get<double>(),
                l["p99"].get<double>(), d["p50"].get<double>());
    std::fflush(stdout);
    levels.push_back({{"concurrency", c}, {"requests", n}, {"failed", failed}, {"output_tokens", out_tokens},
                      {"wall_s", wall}, {"output_tok_s", double(out_tokens) / wall},
                      {"requests_per_s", double(n - failed) / wall}, {"ttft_s", t}, {"latency_s", l},
                      {"decode_tok_s_per_request", d}});
  }
  if (short_outputs)
    std::fprintf(stderr, "warning: %lld requests generated fewer than %lld tokens (context end: raise the server's "
                 "--ctx-size to at least prompt + max tokens)\n", (long long)short_outputs, (long long)o.max_tokens);
  if (other_prompt_len)
    std::fprintf(stderr, "warning: %lld requests report a prompt length other than %lld tokens\n",
                 (long long)other_prompt_len, (long long)o.prompt_tokens);
  if (failures) std::fprintf(stderr, "error: %d requests failed; first: %s\n", failures, first_error.c_str());

  if (!o.json.empty()) {
    json doc = {{"url", o.url}, {"model", model}, {"prompt_tokens", o.prompt_tokens}, {"max_tokens", o.max_tokens},
                {"warmup", o.warmup}, {"levels", levels}};
    std::ofstream f(o.json);
    SALA_CHECK(f, "bench --serve: cannot write '{}'", o.json);
    f << doc.dump(2) << "\n";
  }
  return failures ? 1 : 0;
}

}  // namespace sala::cli
