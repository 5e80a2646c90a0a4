#include "server/openai_format.h"

#include <chrono>
#include <random>

#include "tokenizer/tokenizer.h"

namespace sala::server {

using nlohmann::json;

const char* error_type_for(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "unavailable_error";
  }
  return status >= 500 ? "server_error" : "invalid_request_error";
}

ResponseMeta new_response_meta(bool chat, const std::string& model) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  ResponseMeta m;
  m.chat = chat;
  m.model = model;
  m.id = fmt::format("{}{:016x}{:08x}", chat ? "chatcmpl-" : "cmpl-", rng(), uint32_t(rng()));
  m.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return m;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump(j) + "\n\n"; }

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", error_type_for(e.status)},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

std::string token_bytes(const Tokenizer& tok, int32_t id) {
  if (id < 0 || id >= tok.vocab_size()) return "";
  const std::string& piece = tok.id_to_piece(id);
  // Byte-fallback piece "<0xNN>".
  if (piece.size() == 6 && piece.rfind("<0x", 0) == 0 && piece[5] == '>') {
    try {
      return std::string(1, char(std::stoi(piece.substr(3, 2), nullptr, 16)));
    } catch (const std::exception&) {
    }
  }
  std::string out;
  static const std::string kSpace = "\xE2\x96\x81";  // "▁"
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

namespace {

json byte_list(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(int(c));
  return a;
}

}  // namespace

json chat_logprobs(const Tokenizer& tok, std::span<const SampledToken> tokens) {
  json content = json::array();
  for (const SampledToken& t : tokens) {
    const std::string text = token_bytes(tok, t.id);
    json top = json::array();
    for (auto [id, lp] : t.top) {
      const std::string alt = token_bytes(tok, id);
      top.push_back({{"token", alt}, {"logprob", lp}, {"bytes", byte_list(alt)}});
    }
    content.push_back({{"token", text}, {"logprob", t.logprob}, {"bytes", byte_list(text)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json completion_logprobs(const Tokenizer& tok, std::span<const SampledToken> tokens, size_t text_offset) {
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const SampledToken& t : tokens) {
    const std::string text = token_bytes(tok, t.id);
    toks.push_back(text);
    lps.push_back(t.logprob);
    json top = json::object();
    for (auto [id, lp] : t.top) top[token_bytes(tok, id)] = lp;
    tops.push_back(std::move(top));
    offs.push_back(text_offset);
    text_offset += text.size();
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json stream_chunk(const ResponseMeta& m, json delta, const std::optional<std::string>& finish_reason, json logprobs) {
  json choice = {{"index", 0},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}};
  if (m.chat)
    choice["delta"] = std::move(delta);
  else
    choice["text"] = std::move(delta);
  return {{"id", m.id},
          {"object", m.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", json::array({std::move(choice)})}};
}

json usage_chunk(const ResponseMeta& m, int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"id", m.id},
          {"object", m.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", json::array()},
          {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

json full_response(const ResponseMeta& m, const std::string& text, const std::optional<std::string>& reasoning,
                   const std::string& finish_reason, json logprobs, int64_t prompt_tokens, int64_t completion_tokens) {
  json choice = {{"index", 0}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish_reason}};
  if (m.chat) {
    json msg = {{"role", "assistant"}, {"content", text}};
    if (reasoning) msg["reasoning_content"] = *reasoning;
    choice["message"] = std::move(msg);
  } else {
    choice["text"] = text;
  }
  return {{"id", m.id},
          {"object", m.chat ? "chat.completion" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", json::array({std::move(choice)})},
          {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

}  // namespace sala::server
