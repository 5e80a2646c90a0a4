#include "server/api_server.h"

#include <chrono>
#include <random>

#include "core/error.h"
#include "server/api_error.h"
#include "server/download_jobs.h"
#include "server/inference_worker.h"
#include "server/metrics.h"
#include "server/openai_format.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace sala::server {

using nlohmann::json;
using namespace std::chrono_literals;

http::Response json_response(int status, const json& body) {
  http::Response r;
  r.status = status;
  r.body = dump(body);
  return r;
}

http::Response error_response(const ApiError& e) { return json_response(e.status, error_body(e)); }

namespace {

constexpr auto kPoll = 50ms;  // how often a waiting handler looks at its client

// Constant-time comparison, so the key cannot be guessed byte by byte from response times.
bool same_secret(const std::string& given, const std::string& expected) {
  if (given.size() != expected.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < given.size(); ++i) diff |= (unsigned char)(given[i] ^ expected[i]);
  return diff == 0;
}

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit((unsigned char)s[i + 1]) &&
        std::isxdigit((unsigned char)s[i + 2])) {
      out += char(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct Accumulated {
  std::string content, reasoning;
  std::vector<SampledToken> tokens;
};

// Streams a generation's events as OpenAI chunks until it finishes, fails, or the client leaves.
void stream_events(InferenceWorker& worker, Channel& ch, const ResponseMeta& meta, const Tokenizer& tok,
                   bool include_usage, bool logprobs, http::Sink& sink) {
  auto send = [&](json chunk) {
    if (include_usage) chunk["usage"] = nullptr;  // as OpenAI: every chunk but the last has usage null
    return sink.write(sse_event(chunk));
  };
  auto leave = [&] { worker.cancel(ch); };
  if (meta.chat && !send(stream_chunk(meta, {{"role", "assistant"}, {"content", ""}}, std::nullopt))) return leave();
  size_t offset = 0;  // completions logprobs: text returned so far
  Accumulated acc;
  auto flush = [&]() -> bool {
    if (!acc.reasoning.empty()) {
      if (!send(stream_chunk(meta, {{"reasoning_content", acc.reasoning}}, std::nullopt))) return false;
      acc.reasoning.clear();
    }
    if (acc.content.empty() && acc.tokens.empty()) return true;
    json lp = nullptr;
    if (logprobs) lp = meta.chat ? chat_logprobs(tok, acc.tokens) : completion_logprobs(tok, acc.tokens, offset);
    json delta = meta.chat ? json{{"content", acc.content}} : json(acc.content);
    offset += acc.content.size();
    acc.content.clear();
    acc.tokens.clear();
    return send(stream_chunk(meta, std::move(delta), std::nullopt, std::move(lp)));
  };
  for (;;) {
    std::vector<Event> events = ch.wait(kPoll);
    if (events.empty()) {
      if (!sink.alive()) return leave();
      continue;
    }
    // Events that queued up while the client was slow go out as one chunk.
    for (Event& e : events) {
      if (e.kind == Event::Kind::Delta) {
        acc.content += e.content;
        acc.reasoning += e.reasoning;
        acc.tokens.insert(acc.tokens.end(), e.tokens.begin(), e.tokens.end());
        continue;
      }
      if (!flush()) return leave();
      if (e.kind == Event::Kind::Error) {
        sink.write(sse_event(error_body(ApiError(e.status, e.message))));
        sink.write(kSseDone);
        return;
      }
      if (!send(stream_chunk(meta, meta.chat ? json::object() : json(""), e.finish_reason))) return;
      if (include_usage && !sink.write(sse_event(usage_chunk(meta, e.prompt_tokens, e.completion_tokens)))) return;
      sink.write(kSseDone);
      return;
    }
    if (!flush()) return leave();
  }
}

}  // namespace

ApiServer::ApiServer(http::Server& http, InferenceWorker& worker, Metrics& metrics, const ModelRegistry* registry,
                     DownloadJobs* downloads, ApiOptions options)
    : http_(http), worker_(worker), metrics_(metrics), registry_(registry), downloads_(downloads),
      options_(std::move(options)) {
  // Every endpoint: ApiErrors become error objects, and each answer is counted.
  auto wrap = [this](std::string endpoint, std::function<http::Response(http::Request&)> fn) {
    return [this, endpoint, fn = std::move(fn)](http::Request& req) {
      http::Response r;
      try {
        r = fn(req);
      } catch (const ApiError& e) {
        r = error_response(e);
      } catch (const std::exception& e) {
        r = error_response(ApiError(500, e.what()));
      }
      metrics_.count_request(endpoint, r.status);
      return r;
    };
  };
  auto bind = [this](http::Response (ApiServer::*fn)(http::Request&)) {
    return [this, fn](http::Request& r) { return (this->*fn)(r); };
  };
  http.route("POST", "/v1/chat/completions", wrap("chat", [this](http::Request& r) { return generate(r, true); }));
  http.route("POST", "/v1/completions", wrap("completions", [this](http::Request& r) { return generate(r, false); }));
  http.route("GET", "/v1/models", wrap("models", bind(&ApiServer::models)));
  http.route("POST", "/v1/models/download", wrap("models_download", bind(&ApiServer::download)));
  http.route("GET", "/v1/models/*", wrap("models", bind(&ApiServer::model_item)));
  http.route("DELETE", "/v1/models/*", wrap("models", bind(&ApiServer::model_item)));
  http.route("GET", "/health", wrap("health", bind(&ApiServer::health)));
  http.route("GET", "/metrics", wrap("metrics", [this](http::Request&) {
    http::Response r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_.render();
    return r;
  }));
  http.route("POST", "/tokenize", wrap("tokenize", bind(&ApiServer::tokenize)));
  http.route("POST", "/detokenize", wrap("detokenize", bind(&ApiServer::detokenize)));

  http.set_error_page([this](int status, const std::string& message) {
    metrics_.count_request("other", status);
    return error_response(ApiError(status, message));
  });
  if (!options_.cors_origin.empty()) {
    http.set_default_headers({{"Access-Control-Allow-Origin", options_.cors_origin}, {"Vary", "Origin"}});
  }
  http.set_filter([this](http::Request& req) -> std::optional<http::Response> {
    if (req.method == "OPTIONS" && !options_.cors_origin.empty()) {
      http::Response r;
      r.status = 204;
      r.content_type.clear();
      r.headers = {{"Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"},
                   {"Access-Control-Allow-Headers", "Authorization, Content-Type"},
                   {"Access-Control-Max-Age", "86400"}};
      return r;
    }
    if (!options_.api_key.empty() && req.path.rfind("/v1/", 0) == 0) {
      const std::string* auth = req.header("authorization");
      if (!auth || !same_secret(*auth, "Bearer " + options_.api_key)) {
        metrics_.count_request("auth", 401);
        http::Response r = error_response(ApiError(
            401, auth ? "invalid API key" : "missing API key: send 'Authorization: Bearer KEY'", "", "invalid_api_key"));
        r.headers.push_back({"WWW-Authenticate", "Bearer"});
        return r;
      }
    }
    return std::nullopt;
  });
}

void ApiServer::check_model(const std::optional<std::string>& model) const {
  if (!model || *model == options_.served.id) return;
  for (const auto& a : options_.aliases)
    if (*model == a) return;
  throw ApiError(404, fmt::format("model '{}' is not served here; this server serves '{}'", *model, options_.served.id),
                 "model", "model_not_found");
}

void ApiServer::require_ready() const {
  switch (worker_.state()) {
    case InferenceWorker::State::Ready: return;
    case InferenceWorker::State::Loading: throw ApiError(503, "the model is still loading", "", "model_loading");
    case InferenceWorker::State::Failed: throw ApiError(503, "the model failed to load: " + worker_.load_error());
    case InferenceWorker::State::Stopped: throw ApiError(503, "the server is shutting down");
  }
}

http::Response ApiServer::generate(http::Request& req, bool chat) {
  const auto arrival = Clock::now();
  const json body = parse_json_body(req.body);
  GenerationFields g = chat ? parse_chat_request(body) : parse_completion_request(body);
  check_model(g.model);
  require_ready();
  const Tokenizer& tok = worker_.tokenizer();
  const ReasoningMode mode = options_.no_think ? ReasoningMode::Hidden : g.reasoning.value_or(options_.reasoning);
  const char* prompt_field = chat ? "messages" : "prompt";

  std::vector<int32_t> prompt;
  if (chat) {
    ChatOptions co;
    co.enable_thinking = !options_.no_think && g.enable_thinking.value_or(true);
    try {
      prompt = encode_chat(tok, g.messages, co);
    } catch (const Error& e) {
      bad_field("messages", "{}", e.what());
    }
  } else if (g.prompt_is_ids) {
    const int vocab = worker_.config().vocab_size;
    for (int32_t id : g.prompt_ids)
      if (id >= vocab) bad_field("prompt", "token id {} is outside the vocabulary ({} tokens)", id, vocab);
    prompt = std::move(g.prompt_ids);
  } else {
    prompt = tok.encode(g.prompt_text, true);
  }
  if (prompt.empty()) bad_field(prompt_field, "the prompt is empty");
  const int64_t ctx = worker_.options().ctx_size;
  if (int64_t(prompt.size()) >= ctx)
    throw ApiError(400,
                   fmt::format("the prompt is {} tokens but the context is {} tokens (--ctx-size), which must also "
                               "hold at least one generated token",
                               prompt.size(), ctx),
                   prompt_field, "context_length_exceeded");

  Job job;
  const int64_t room = ctx - int64_t(prompt.size());
  int64_t max_tokens = g.max_tokens ? *g.max_tokens : options_.max_tokens;
  if (max_tokens < 0 || max_tokens > room) max_tokens = room;  // generation stops at the context end anyway
  job.max_tokens = int(max_tokens);
  job.ignore_eos = g.ignore_eos;
  job.sampling.temperature = g.temperature.value_or(options_.temperature);
  job.sampling.top_p = g.top_p.value_or(1.0f);
  job.sampling.top_k = g.top_k.value_or(0);  // OpenAI semantics: no top-k unless asked
  job.sampling.min_p = g.min_p.value_or(0.0f);
  job.sampling.presence_penalty = g.presence_penalty;
  job.sampling.frequency_penalty = g.frequency_penalty;
  job.sampling.repetition_penalty = g.repetition_penalty;
  job.sampling.top_logprobs = g.top_logprobs;
  if (g.seed) {
    job.sampling.seed = *g.seed;
  } else {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    job.sampling.seed = rng();
  }
  job.text.stop = g.stop;
  job.text.hide_think = chat && mode != ReasoningMode::Raw;
  job.want_reasoning = chat && mode == ReasoningMode::Parsed;
  job.want_logprobs = g.logprobs;
  job.arrival = arrival;
  job.prompt = std::move(prompt);

  std::shared_ptr<Channel> ch = worker_.submit(std::move(job));
  const ResponseMeta meta = new_response_meta(chat, g.model.value_or(options_.served.id));

  if (g.stream) {
    http::Response r;
    r.content_type = "text/event-stream";
    r.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
    r.stream = [this, ch, meta, &tok, include_usage = g.include_usage, logprobs = g.logprobs](http::Sink& sink) {
      stream_events(worker_, *ch, meta, tok, include_usage, logprobs, sink);
    };
    return r;
  }

  Accumulated acc;
  for (;;) {
    std::vector<Event> events = ch->wait(kPoll);
    // Checked on every pass: while tokens flow, the wait never comes back empty.
    if (req.client_alive && !req.client_alive()) {
      worker_.cancel(*ch);
      throw ApiError(499, "client closed the connection");
    }
    for (Event& e : events) {
      if (e.kind == Event::Kind::Delta) {
        acc.content += e.content;
        acc.reasoning += e.reasoning;
        acc.tokens.insert(acc.tokens.end(), e.tokens.begin(), e.tokens.end());
      } else if (e.kind == Event::Kind::Error) {
        throw ApiError(e.status, e.message);
      } else {
        json lp = nullptr;
        if (g.logprobs) lp = chat ? chat_logprobs(tok, acc.tokens) : completion_logprobs(tok, acc.tokens, 0);
        std::optional<std::string> reasoning;
        if (chat && mode == ReasoningMode::Parsed && !acc.reasoning.empty()) reasoning = acc.reasoning;
        return json_response(200, full_response(meta, acc.content, reasoning, e.finish_reason, std::move(lp),
                                                 e.prompt_tokens, e.completion_tokens));
      }
    }
  }
}

http::Response ApiServer::health(http::Request&) {
  switch (worker_.state()) {
    case InferenceWorker::State::Ready: return json_response(200, {{"status", "ok"}});
    case InferenceWorker::State::Loading: return json_response(503, {{"status", "loading"}});
    case InferenceWorker::State::Failed:
      return json_response(500, {{"status", "error"}, {"message", worker_.load_error()}});
    case InferenceWorker::State::Stopped: break;
  }
  return json_response(503, {{"status", "stopping"}});
}

http::Response ApiServer::models(http::Request&) {
  json served = ModelRegistry::describe(options_.served);
  served["id"] = options_.served.id;
  served["loaded"] = worker_.state() == InferenceWorker::State::Ready;
  served["max_context"] = worker_.options().ctx_size;
  json data = json::array({served});
  if (registry_) {
    for (const ModelEntry& e : registry_->list()) {
      if (e.id == options_.served.id) continue;
      json m = ModelRegistry::describe(e);
      m["loaded"] = false;
      data.push_back(std::move(m));
    }
  }
  return json_response(200, {{"object", "list"}, {"data", data}});
}

http::Response ApiServer::model_item(http::Request& req) {
  const std::string rest = percent_decode(req.path_rest);
  if (rest.rfind("download/", 0) == 0 && req.method == "GET") {
    if (!downloads_) throw ApiError(404, "model downloads are not enabled on this server");
    auto st = downloads_->status(rest.substr(9));
    if (!st) throw ApiError(404, fmt::format("no download job '{}'", rest.substr(9)), "", "download_not_found");
    return json_response(200, *st);
  }
  const bool is_served =
      rest == options_.served.id || std::find(options_.aliases.begin(), options_.aliases.end(), rest) != options_.aliases.end();
  std::optional<ModelEntry> entry;
  if (!is_served && registry_ && valid_model_id(rest)) entry = registry_->find(rest);
  if (entry && entry->source == "path") entry.reset();  // only managed models are visible by id
  if (req.method == "GET") {
    if (is_served) {
      json m = ModelRegistry::describe(options_.served);
      m["id"] = options_.served.id;
      m["loaded"] = worker_.state() == InferenceWorker::State::Ready;
      return json_response(200, m);
    }
    if (!entry) throw ApiError(404, fmt::format("model '{}' not found", rest), "model", "model_not_found");
    json m = ModelRegistry::describe(*entry);
    m["loaded"] = false;
    return json_response(200, m);
  }
  // DELETE
  if (is_served) throw ApiError(409, fmt::format("model '{}' is loaded by this server", rest), "model", "model_in_use");
  if (!entry) throw ApiError(404, fmt::format("model '{}' not found", rest), "model", "model_not_found");
  if (entry->source != "models-dir")
    throw ApiError(403, fmt::format("model '{}' is in the Hugging Face cache, which sala only reads", rest), "model",
                   "read_only");
  try {
    registry_->remove(rest);
  } catch (const Error& e) {
    throw ApiError(500, e.what());
  }
  return json_response(200, {{"id", rest}, {"object", "model"}, {"deleted", true}});
}

http::Response ApiServer::download(http::Request& req) {
  if (!downloads_) throw ApiError(404, "model downloads are not enabled on this server");
  const json body = parse_json_body(req.body);
  auto model = body.find("model");
  if (model == body.end() || !model->is_string()) bad_field("model", "'model' must be a string (ORG/NAME)");
  std::string revision = "main";
  if (auto r = body.find("revision"); r != body.end() && !r->is_null()) {
    if (!r->is_string()) bad_field("revision", "'revision' must be a string");
    revision = r->get<std::string>();
  }
  const std::string id = model->get<std::string>();
  if (!valid_model_id(id) || id.find('/') == std::string::npos)
    bad_field("model", "'model' must be a hub repository id ORG/NAME, got '{}'", id);
  return json_response(202, downloads_->start(id, revision));
}

http::Response ApiServer::tokenize(http::Request& req) {
  const json body = parse_json_body(req.body);
  auto content = body.find("content");
  if (content == body.end() || !content->is_string()) bad_field("content", "'content' must be a string");
  bool add_special = false, with_pieces = false;
  if (auto a = body.find("add_special"); a != body.end()) {
    if (!a->is_boolean()) bad_field("add_special", "'add_special' must be a boolean");
    add_special = a->get<bool>();
  }
  if (auto w = body.find("with_pieces"); w != body.end()) {
    if (!w->is_boolean()) bad_field("with_pieces", "'with_pieces' must be a boolean");
    with_pieces = w->get<bool>();
  }
  require_ready();
  const Tokenizer& tok = worker_.tokenizer();
  const auto ids = tok.encode(content->get<std::string>(), add_special);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (with_pieces)
      tokens.push_back({{"id", id}, {"piece", tok.id_to_piece(id)}});
    else
      tokens.push_back(id);
  }
  return json_response(200, {{"tokens", tokens}});
}

http::Response ApiServer::detokenize(http::Request& req) {
  const json body = parse_json_body(req.body);
  auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) bad_field("tokens", "'tokens' must be an array of token ids");
  require_ready();
  const Tokenizer& tok = worker_.tokenizer();
  std::vector<int32_t> ids;
  for (const json& t : *tokens) {
    if (!t.is_number_integer()) bad_field("tokens", "'tokens' must hold integers");
    const int64_t v = t.get<int64_t>();
    if (v < 0 || v >= tok.vocab_size()) bad_field("tokens", "token id {} is outside the vocabulary ({})", v, tok.vocab_size());
    ids.push_back(int32_t(v));
  }
  return json_response(200, {{"content", tok.decode(ids)}});
}

}  // namespace sala::server
