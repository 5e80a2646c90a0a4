// Parsing and validation of OpenAI request bodies (/v1/chat/completions, /v1/completions). Every
// problem is an ApiError 400 naming the field. Fields the engine cannot honour (n > 1, tools,
// logit_bias, echo, suffix, best_of > 1) are rejected rather than silently ignored; unknown
// fields are ignored, as OpenAI-compatible servers do.
//
// Extensions beyond OpenAI (accepted by vLLM / llama.cpp too): top_k, min_p,
// repetition_penalty, ignore_eos, chat_template_kwargs.enable_thinking, and the reasoning
// controls described at ReasoningMode.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/chat.h"

namespace sala::server {

// What happens to "<think>...</think>" in a chat answer:
//   parsed: moved to message.reasoning_content / delta.reasoning_content (the default)
//   raw:    left in content as generated
//   hidden: dropped
// Chosen per request with "reasoning_format": "parsed"|"raw"|"hidden" (llama.cpp's "deepseek"
// means parsed, "none" means raw) or "include_reasoning": true|false (parsed|hidden, as
// OpenRouter); the server's --reasoning-format gives the default; --no-think forces hidden.
enum class ReasoningMode { Parsed, Raw, Hidden };
ReasoningMode parse_reasoning_mode(const std::string& name);  // throws sala::Error on unknown names

struct GenerationFields {
  bool chat = true;
  std::optional<std::string> model;
  // chat
  std::vector<ChatMessage> messages;
  std::optional<ReasoningMode> reasoning;
  std::optional<bool> enable_thinking;
  // completions: text, or token ids given directly
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;

  bool stream = false, include_usage = false;
  std::optional<int> max_tokens;
  std::optional<float> temperature, top_p, min_p;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  float presence_penalty = 0, frequency_penalty = 0, repetition_penalty = 1;
  std::vector<std::string> stop;
  bool logprobs = false;  // report the chosen tokens' logprobs
  int top_logprobs = 0;   // alternatives per token
  bool ignore_eos = false;
};

// The body as JSON; malformed JSON or a non-object is a 400.
nlohmann::json parse_json_body(const std::string& body);
GenerationFields parse_chat_request(const nlohmann::json& body);
GenerationFields parse_completion_request(const nlohmann::json& body);

}  // namespace sala::server
