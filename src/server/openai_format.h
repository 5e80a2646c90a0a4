// OpenAI response bodies: chat.completion / text_completion objects, their streaming chunks
// (server-sent events), usage, logprobs, and error objects. Pure formatting, no state.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "engine/sampler.h"
#include "server/api_error.h"

namespace sala {
class Tokenizer;
}

namespace sala::server {

struct ResponseMeta {
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  bool chat = true;
};

ResponseMeta new_response_meta(bool chat, const std::string& model);

// Compact JSON; invalid UTF-8 (a token that is half a character) becomes U+FFFD.
std::string dump(const nlohmann::json& j);
// One server-sent event: "data: <json>\n\n".
std::string sse_event(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

nlohmann::json error_body(const ApiError& e);
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

// The bytes a single token stands for ("▁" as a space, a <0xNN> piece as that byte).
std::string token_bytes(const Tokenizer& tok, int32_t id);
// Chat format: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
nlohmann::json chat_logprobs(const Tokenizer& tok, std::span<const SampledToken> tokens);
// Completions format: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; offsets
// continue from text_offset (the length of the text already returned).
nlohmann::json completion_logprobs(const Tokenizer& tok, std::span<const SampledToken> tokens, size_t text_offset);

// A streaming chunk with one choice. delta: the chat delta object, or for completions the text
// (given as a JSON string). finish_reason and logprobs are null when not given.
nlohmann::json stream_chunk(const ResponseMeta& m, nlohmann::json delta, const std::optional<std::string>& finish_reason,
                            nlohmann::json logprobs = nullptr);
// The last chunk with stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk(const ResponseMeta& m, int64_t prompt_tokens, int64_t completion_tokens);

// The whole (non-streamed) response. reasoning: only set when it goes in reasoning_content.
nlohmann::json full_response(const ResponseMeta& m, const std::string& text, const std::optional<std::string>& reasoning,
                             const std::string& finish_reason, nlohmann::json logprobs, int64_t prompt_tokens,
                             int64_t completion_tokens);

}  // namespace sala::server
