// The OpenAI-compatible API: binds the endpoints to the HTTP server, turns requests into worker
// jobs and worker events into responses.
//
//   POST /v1/chat/completions, POST /v1/completions   (stream or not)
//   GET  /v1/models, GET /v1/models/{id}, DELETE /v1/models/{id}
//   POST /v1/models/download, GET /v1/models/download/{job}   (when downloads are enabled)
//   GET  /health, GET /metrics, POST /tokenize, POST /detokenize
//
// Auth: with an API key, every /v1/* request needs "Authorization: Bearer KEY" (401 otherwise);
// /health, /metrics, /tokenize and /detokenize stay open, as in llama.cpp's server.
// CORS: with an origin, every response allows it and OPTIONS preflights are answered (204).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "server/http_server.h"
#include "server/model_registry.h"
#include "server/openai_request.h"

namespace sala::server {

class InferenceWorker;
class Metrics;
class ModelRegistry;
class DownloadJobs;

struct ApiOptions {
  ModelEntry served;                  // the served model (its id is what requests name)
  std::vector<std::string> aliases;   // other names accepted in "model"
  std::string api_key;                // empty: no auth
  std::string cors_origin;            // empty: no CORS headers
  ReasoningMode reasoning = ReasoningMode::Parsed;
  bool no_think = false;              // thinking off in the prompt, reasoning hidden
  float temperature = 1.0f;           // when a request gives none (OpenAI's default)
  int max_tokens = -1;                // when a request gives none; -1: up to the context end
};

class ApiServer {
 public:
  // registry and downloads may be null (no model management endpoints then).
  ApiServer(http::Server& http, InferenceWorker& worker, Metrics& metrics, const ModelRegistry* registry,
            DownloadJobs* downloads, ApiOptions options);

 private:
  http::Response generate(http::Request& req, bool chat);
  http::Response models(http::Request& req);
  http::Response model_item(http::Request& req);
  http::Response download(http::Request& req);
  http::Response tokenize(http::Request& req);
  http::Response detokenize(http::Request& req);
  http::Response health(http::Request& req);
  void check_model(const std::optional<std::string>& model) const;
  void require_ready() const;

  http::Server& http_;
  InferenceWorker& worker_;
  Metrics& metrics_;
  const ModelRegistry* registry_;
  DownloadJobs* downloads_;
  ApiOptions options_;
};

// A JSON response (compact dump, invalid UTF-8 replaced).
http::Response json_response(int status, const nlohmann::json& body);
http::Response error_response(const class ApiError& e);

}  // namespace sala::server
