// Unit tests of the server's parts that need no model: HTTP transport, request parsing, response
// formatting, metrics, SHA-256, model id resolution.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "server/api_error.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "server/openai_format.h"
#include "server/openai_request.h"
#include "server/sha256.h"

using namespace sala;
using namespace sala::server;
using nlohmann::json;
namespace fs = std::filesystem;

// --- SHA-256: FIPS 180-4 example vectors --------------------------------------------------------

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, StreamingInOddPiecesMatchesOneShot) {
  std::string data;
  for (int i = 0; i < 1000000; ++i) data += 'a';
  Sha256 h;
  for (size_t pos = 0, step = 1; pos < data.size(); pos += step, step = step * 7 % 997 + 1)
    h.update(data.data() + pos, std::min(step, data.size() - pos));
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// --- Request parsing --------------------------------------------------------------------------

template <typename F>
ApiError api_error_of(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return ApiError(0, "");
}

TEST(OpenAIRequest, ChatFieldsAndDefaults) {
  auto g = parse_chat_request(json::parse(R"({
    "model": "m", "messages": [{"role": "developer", "content": "be brief"},
                               {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                               {"role": "assistant", "content": null}],
    "max_tokens": 9, "max_completion_tokens": 4, "stop": "x", "temperature": 0, "top_k": -1, "seed": -1,
    "logprobs": true, "top_logprobs": 3, "stream": true, "stream_options": {"include_usage": true},
    "chat_template_kwargs": {"enable_thinking": false}, "reasoning_format": "none"})"));
  ASSERT_EQ(g.messages.size(), 3u);
  EXPECT_EQ(g.messages[0].role, "system");
  EXPECT_EQ(g.messages[1].content, "ab");
  EXPECT_EQ(g.messages[2].content, "");
  EXPECT_EQ(*g.max_tokens, 4);  // max_completion_tokens wins
  EXPECT_EQ(g.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(*g.temperature, 0.0f);
  EXPECT_EQ(*g.top_k, 0);
  EXPECT_EQ(*g.seed, ~uint64_t(0));
  EXPECT_TRUE(g.logprobs && g.stream && g.include_usage);
  EXPECT_EQ(g.top_logprobs, 3);
  EXPECT_EQ(*g.enable_thinking, false);
  EXPECT_EQ(*g.reasoning, ReasoningMode::Raw);
  EXPECT_EQ(*g.model, "m");
}

TEST(OpenAIRequest, ErrorsNameTheField) {
  auto chat = [](const char* body) { return [=] { parse_chat_request(json::parse(body)); }; };
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(api_error_of(chat(("{" + msgs + R"(, "temperature": "hot"})").c_str())).param, "temperature");
  EXPECT_EQ(api_error_of(chat(("{" + msgs + R"(, "temperature": 3})").c_str())).param, "temperature");
  EXPECT_EQ(api_error_of(chat(("{" + msgs + R"(, "max_tokens": 1.5})").c_str())).param, "max_tokens");
  EXPECT_EQ(api_error_of(chat(("{" + msgs + R"(, "n": 3})").c_str())).param, "n");
  EXPECT_EQ(api_error_of(chat(("{" + msgs + R"(, "stop": ["a", 1]})").c_str())).param, "stop");
  EXPECT_EQ(api_error_of(chat(("{" + msgs + R"(, "top_logprobs": 2})").c_str())).param, "top_logprobs");
  EXPECT_EQ(api_error_of(chat(("{" + msgs + R"(, "tools": [{"type": "function"}]})").c_str())).param, "tools");
  EXPECT_EQ(api_error_of(chat(R"({"messages": []})")).param, "messages");
  EXPECT_EQ(api_error_of(chat(R"({"messages": [{"role": "user"}]})")).param, "messages[0].content");
  EXPECT_EQ(api_error_of(chat(R"({"messages": [{"role": "bot", "content": "x"}]})")).param, "messages[0].role");
  EXPECT_EQ(api_error_of(chat(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})")).param,
            "messages[0].content");
  EXPECT_EQ(api_error_of([] { parse_json_body("{oops"); }).status, 400);
  EXPECT_EQ(api_error_of([] { parse_json_body("[]"); }).status, 400);
}

TEST(OpenAIRequest, CompletionPromptForms) {
  auto p = [](const char* prompt) { return parse_completion_request(json::parse(std::string(R"({"prompt": )") + prompt + "}")); };
  EXPECT_EQ(p(R"("hi")").prompt_text, "hi");
  EXPECT_EQ(p(R"(["hi"])").prompt_text, "hi");
  EXPECT_EQ(p("[1, 2, 3]").prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(p("[[4, 5]]").prompt_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(api_error_of([&] { p(R"(["a", "b"])"); }).param, "prompt");
  EXPECT_EQ(api_error_of([&] { p("[-1]"); }).param, "prompt");
  EXPECT_EQ(api_error_of([&] { p("5"); }).param, "prompt");
  auto g = parse_completion_request(json::parse(R"({"prompt": "x", "logprobs": 2})"));
  EXPECT_TRUE(g.logprobs);
  EXPECT_EQ(g.top_logprobs, 2);
  EXPECT_EQ(api_error_of([] { parse_completion_request(json::parse(R"({"prompt": "x", "echo": true})")); }).param, "echo");
}

// --- Formatting ------------------------------------------------------------------------------

TEST(OpenAIFormat, ErrorObjectAndChunks) {
  json e = error_body(ApiError(404, "no model", "model", "model_not_found"));
  EXPECT_EQ(e["error"]["type"], "not_found_error");
  EXPECT_EQ(e["error"]["param"], "model");
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  EXPECT_TRUE(error_body(ApiError(400, "bad"))["error"]["param"].is_null());
  EXPECT_EQ(error_body(ApiError(429, "busy"))["error"]["type"], "rate_limit_error");
  EXPECT_EQ(error_body(ApiError(401, "key"))["error"]["type"], "authentication_error");

  ResponseMeta chat = new_response_meta(true, "m");
  EXPECT_EQ(chat.id.rfind("chatcmpl-", 0), 0u);
  json c = stream_chunk(chat, {{"content", "hi"}}, std::nullopt);
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["delta"]["content"], "hi");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  ResponseMeta comp = new_response_meta(false, "m");
  json t = stream_chunk(comp, "yo", std::string("stop"));
  EXPECT_EQ(t["object"], "text_completion");
  EXPECT_EQ(t["choices"][0]["text"], "yo");
  EXPECT_EQ(t["choices"][0]["finish_reason"], "stop");
  json u = usage_chunk(chat, 3, 4);
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 7);
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  // Half a UTF-8 character (a token that splits one) still gives valid JSON.
  EXPECT_EQ(dump(json(std::string("\xE2\x96"))), "\"\xEF\xBF\xBD\"");
  json full = full_response(chat, "answer", std::string("thought"), "length", nullptr, 2, 5);
  EXPECT_EQ(full["choices"][0]["message"]["reasoning_content"], "thought");
  EXPECT_EQ(full["usage"]["completion_tokens"], 5);
}

TEST(Metrics, PrometheusText) {
  Metrics m;
  m.count_request("chat", 200);
  m.count_request("chat", 200);
  m.count_request("chat", 400);
  m.observe_ttft(0.02);
  m.observe_ttft(3.0);
  m.set_queue(2, 5);
  const std::string s = m.render();
  EXPECT_NE(s.find("sala_requests_total{endpoint=\"chat\",status=\"200\"} 2\n"), std::string::npos);
  EXPECT_NE(s.find("sala_requests_total{endpoint=\"chat\",status=\"400\"} 1\n"), std::string::npos);
  EXPECT_NE(s.find("sala_requests_waiting 2\n"), std::string::npos);
  EXPECT_NE(s.find("sala_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"), std::string::npos);
  EXPECT_NE(s.find("sala_time_to_first_token_seconds_bucket{le=\"5\"} 2\n"), std::string::npos);  // cumulative
  EXPECT_NE(s.find("sala_time_to_first_token_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(s.find("# TYPE sala_request_latency_seconds histogram\n"), std::string::npos);
}

TEST(Metrics, SpeculativeCounters) {
  Metrics m;
  std::string s = m.render();
  EXPECT_NE(s.find("# TYPE sala_speculative_verify_steps_total counter\nsala_speculative_verify_steps_total 0\n"),
            std::string::npos);  // present (0) without --speculative
  SpeculativeStats st;
  st.rounds = 7;
  st.drafted = 28;
  st.accepted = 12;
  st.emitted = 19;
  st.skipped[size_t(DraftSkip::Boundary)] = 2;
  st.skipped[size_t(DraftSkip::NoMatch)] = 5;
  m.set_speculative(st);
  s = m.render();
  EXPECT_NE(s.find("sala_speculative_verify_steps_total 7\n"), std::string::npos);
  EXPECT_NE(s.find("sala_speculative_draft_tokens_total 28\n"), std::string::npos);
  EXPECT_NE(s.find("sala_speculative_accepted_tokens_total 12\n"), std::string::npos);
  EXPECT_NE(s.find("sala_speculative_emitted_tokens_total 19\n"), std::string::npos);
  EXPECT_NE(s.find("sala_speculative_skipped_steps_total{reason=\"boundary\"} 2\n"), std::string::npos);
  EXPECT_NE(s.find("sala_speculative_skipped_steps_total{reason=\"no_match\"} 5\n"), std::string::npos);
  EXPECT_NE(s.find("sala_speculative_skipped_steps_total{reason=\"end\"} 0\n"), std::string::npos);
}

// --- Model ids ------------------------------------------------------------------------------------

namespace {
fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("sala_server_test_{}_{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
void fake_model(const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"torch_dtype": "bfloat16", "max_position_embeddings": 128})";
}
}  // namespace

TEST(ModelRegistry, ResolvesPathsModelsDirAndHubCache) {
  const fs::path root = temp_dir("registry");
  const fs::path models = root / "models", hub = root / "hub";
  fake_model(models / "org" / "a");
  fake_model(models / "plain");
  fake_model(root / "elsewhere");
  const fs::path repo = hub / "models--hf--b";
  fake_model(repo / "snapshots" / "111");
  fake_model(repo / "snapshots" / "222");
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << "111\n";
  ModelRegistry reg(models, hub);

  EXPECT_EQ(reg.resolve((root / "elsewhere").string()).source, "path");
  EXPECT_EQ(reg.resolve((root / "elsewhere" / "config.json").string()).dir, root / "elsewhere");
  EXPECT_EQ(reg.resolve("org/a").dir, models / "org" / "a");
  EXPECT_EQ(reg.resolve("plain").source, "models-dir");
  EXPECT_EQ(reg.resolve("hf/b").dir, repo / "snapshots" / "111");  // refs/main
  EXPECT_EQ(reg.resolve("hf/b@222").dir, repo / "snapshots" / "222");
  EXPECT_FALSE(reg.find("hf/b@333"));
  EXPECT_FALSE(reg.find("org/../org/a"));
  EXPECT_FALSE(reg.find("nope/x"));
  EXPECT_THROW(reg.resolve("nope/x"), Error);

  auto list = reg.list();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].id, "hf/b");
  EXPECT_EQ(list[1].id, "org/a");
  EXPECT_EQ(list[2].id, "plain");
  json d = ModelRegistry::describe(list[1]);
  EXPECT_EQ(d["dtype"], "bfloat16");
  EXPECT_EQ(d["context_length"], 128);
  EXPECT_EQ(d["owned_by"], "org");
  EXPECT_GT(d["size_bytes"].get<uint64_t>(), 0u);

  EXPECT_THROW(reg.remove("hf/b"), Error);  // the hub cache is read-only
  EXPECT_THROW(reg.remove("../models"), Error);
  reg.remove("org/a");
  EXPECT_FALSE(fs::exists(models / "org"));  // the empty ORG directory goes too
  EXPECT_TRUE(fs::exists(repo / "snapshots" / "111"));
  fs::remove_all(root);
}

// --- HTTP transport -----------------------------------------------------------------------------

namespace {

class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawClient() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void send(const std::string& s) { ASSERT_EQ(::send(fd_, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size())); }
  // Reads until `marker` has been seen (or the peer closes / times out).
  std::string read_until(const std::string& marker) {
    while (buf_.find(marker) == std::string::npos) {
      char tmp[4096];
      ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n <= 0) break;
      buf_.append(tmp, size_t(n));
    }
    size_t end = buf_.find(marker);
    end = end == std::string::npos ? buf_.size() : end + marker.size();
    std::string out = buf_.substr(0, end);
    buf_.erase(0, end);
    return out;
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

struct TestServer {
  http::Server server;
  int port = 0;
  std::thread thread;
  std::atomic<bool> saw_disconnect{false};
  TestServer() {
    server.route("GET", "/hello", [](http::Request&) {
      http::Response r;
      r.content_type = "text/plain";
      r.body = "hi";
      return r;
    });
    server.route("POST", "/echo", [](http::Request& req) {
      http::Response r;
      r.body = req.body;
      return r;
    });
    server.route("GET", "/items/*", [](http::Request& req) {
      http::Response r;
      r.body = req.path_rest;
      return r;
    });
    server.route("GET", "/stream", [](http::Request&) {
      http::Response r;
      r.stream = [](http::Sink& s) {
        s.write("one,");
        s.write("");
        s.write("two");
      };
      return r;
    });
    server.route("GET", "/wait", [this](http::Request& req) {
      // Waits (bounded) for the client to hang up, as a generation handler does.
      for (int i = 0; i < 100 && req.client_alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      saw_disconnect = !req.client_alive();
      return http::Response{};
    });
    port = server.listen("127.0.0.1", 0);
    thread = std::thread([this] { server.run(); });
  }
  ~TestServer() {
    server.stop();
    thread.join();
  }
};

}  // namespace

TEST(HttpServer, RoutesKeepAliveAndErrors) {
  TestServer t;
  RawClient c(t.port);
  c.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r = c.read_until("hi");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Length: 2\r\n"), std::string::npos);
  EXPECT_NE(r.find("Connection: keep-alive\r\n"), std::string::npos);
  // Same connection: a POST with a body, then the route with a trailing "*", then a miss.
  c.send("POST /echo HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_NE(c.read_until("hello").find("200 OK"), std::string::npos);
  c.send("GET /items/org/name?x=1 HTTP/1.1\r\n\r\n");
  EXPECT_NE(c.read_until("org/name").find("200 OK"), std::string::npos);
  c.send("GET /nothing HTTP/1.1\r\n\r\n");
  EXPECT_EQ(c.read_until("\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  c.read_until("\n");  // the plain-text body
  c.send("DELETE /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
  std::string last = c.read_until("\r\n\r\n");
  EXPECT_EQ(last.rfind("HTTP/1.1 405", 0), 0u) << last;
  EXPECT_NE(last.find("Connection: close"), std::string::npos);
}

TEST(HttpServer, ExpectContinueChunkedStreamsAndMalformedRequests) {
  TestServer t;
  {
    RawClient c(t.port);
    c.send("POST /echo HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
    EXPECT_EQ(c.read_until("\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
    c.send("abc");
    EXPECT_NE(c.read_until("abc").find("200 OK"), std::string::npos);
  }
  {
    RawClient c(t.port);
    c.send("GET /stream HTTP/1.1\r\n\r\n");
    std::string r = c.read_until("0\r\n\r\n");
    EXPECT_NE(r.find("Transfer-Encoding: chunked\r\n"), std::string::npos);
    EXPECT_NE(r.find("\r\n\r\n4\r\none,\r\n3\r\ntwo\r\n0\r\n\r\n"), std::string::npos) << r;
  }
  {
    RawClient c(t.port);
    c.send("NONSENSE\r\n\r\n");
    EXPECT_EQ(c.read_until("\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  }
  {
    RawClient c(t.port);
    c.send("POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    EXPECT_EQ(c.read_until("\r\n\r\n").rfind("HTTP/1.1 411", 0), 0u);
  }
}

TEST(HttpServer, HandlerSeesTheClientLeave) {
  TestServer t;
  {
    RawClient c(t.port);
    c.send("GET /wait HTTP/1.1\r\n\r\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }  // closes
  for (int i = 0; i < 200 && !t.saw_disconnect; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(t.saw_disconnect);
}
