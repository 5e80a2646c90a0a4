#include "server/openai_request.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "server/api_error.h"

namespace sala::server {

using nlohmann::json;

ReasoningMode parse_reasoning_mode(const std::string& name) {
  if (name == "parsed" || name == "deepseek" || name == "auto") return ReasoningMode::Parsed;
  if (name == "raw" || name == "none") return ReasoningMode::Raw;
  if (name == "hidden") return ReasoningMode::Hidden;
  fail("unknown reasoning format '{}' (parsed, raw, hidden)", name);
}

namespace {

const char* type_name(const json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

// A present, non-null field (null means "not given", as in OpenAI's API).
const json* field(const json& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const json& j, const char* name, double lo, double hi) {
  const json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_field(name, "'{}' must be a number, got {}", name, type_name(*v));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad_field(name, "'{}' must be in [{}, {}], got {}", name, lo, hi, x);
  return x;
}

std::optional<int64_t> integer(const json& j, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) bad_field(name, "'{}' must be an integer, got {}", name, type_name(*v));
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad_field(name, "'{}' must be in [{}, {}]", name, lo, hi);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) bad_field(name, "'{}' must be in [{}, {}], got {}", name, lo, hi, x);
  return x;
}

std::optional<bool> boolean(const json& j, const char* name) {
  const json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_field(name, "'{}' must be a boolean, got {}", name, type_name(*v));
  return v->get<bool>();
}

std::optional<std::string> string(const json& j, const char* name) {
  const json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_field(name, "'{}' must be a string, got {}", name, type_name(*v));
  return v->get<std::string>();
}

// Fields shared by both endpoints: model, stream, sampling, stop, n, unsupported features.
void parse_common(const json& j, GenerationFields& g) {
  g.model = string(j, "model");
  g.stream = boolean(j, "stream").value_or(false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad_field("stream_options", "'stream_options' must be an object, got {}", type_name(*so));
    g.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  // max_completion_tokens is the newer name; it wins when both are given.
  auto mt = integer(j, "max_tokens", 1, std::numeric_limits<int32_t>::max());
  if (auto mct = integer(j, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max())) mt = mct;
  if (mt) g.max_tokens = int(*mt);
  if (auto t = number(j, "temperature", 0, 2)) g.temperature = float(*t);
  if (auto p = number(j, "top_p", 0, 1)) {
    if (*p == 0) bad_field("top_p", "'top_p' must be in (0, 1], got 0");
    g.top_p = float(*p);
  }
  if (auto k = integer(j, "top_k", -1, std::numeric_limits<int32_t>::max())) g.top_k = int(std::max<int64_t>(*k, 0));
  if (auto m = number(j, "min_p", 0, 1)) g.min_p = float(*m);
  if (auto s = integer(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    g.seed = uint64_t(*s);
  g.presence_penalty = float(number(j, "presence_penalty", -2, 2).value_or(0));
  g.frequency_penalty = float(number(j, "frequency_penalty", -2, 2).value_or(0));
  g.repetition_penalty = float(number(j, "repetition_penalty", 0.01, 100).value_or(1));
  g.ignore_eos = boolean(j, "ignore_eos").value_or(false);

  if (const json* s = field(j, "stop")) {
    if (s->is_string()) {
      g.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 16) bad_field("stop", "'stop' holds at most 16 strings, got {}", s->size());
      for (const json& e : *s) {
        if (!e.is_string()) bad_field("stop", "'stop' must be a string or an array of strings");
        g.stop.push_back(e.get<std::string>());
      }
    } else {
      bad_field("stop", "'stop' must be a string or an array of strings, got {}", type_name(*s));
    }
    for (const auto& st : g.stop)
      if (st.empty()) bad_field("stop", "'stop' strings must not be empty");
  }

  if (auto n = integer(j, "n", 1, 128); n && *n != 1)
    bad_field("n", "only n=1 is supported (got {}); send several requests instead", *n);
  if (const json* lb = field(j, "logit_bias"); lb && !(lb->is_object() && lb->empty()))
    bad_field("logit_bias", "'logit_bias' is not supported");
  if (const json* tools = field(j, "tools"); tools && !(tools->is_array() && tools->empty()))
    bad_field("tools", "tool calling is not supported");
  if (const json* rf = field(j, "response_format")) {
    const json* type = rf->is_object() ? field(*rf, "type") : nullptr;
    if (!type || *type != "text") bad_field("response_format", "only response_format {{\"type\": \"text\"}} is supported");
  }
}

std::string message_content(const json& m, size_t i, const std::string& role) {
  const std::string param = fmt::format("messages[{}].content", i);
  const json* c = field(m, "content");
  if (!c) {
    if (role == "assistant") return "";  // an assistant turn that only called tools
    bad_field(param, "'{}' is required", param);
  }
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) bad_field(param, "'{}' must be a string or an array of content parts, got {}", param, type_name(*c));
  std::string text;
  for (const json& part : *c) {
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    if (!type || !type->is_string() || *type != "text")
      bad_field(param, "'{}': only parts of type \"text\" are supported", param);
    const json* t = field(part, "text");
    if (!t || !t->is_string()) bad_field(param, "'{}': a text part needs a string 'text'", param);
    text += t->get<std::string>();
  }
  return text;
}

}  // namespace

json parse_json_body(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) throw ApiError(400, "request body is not valid JSON");
  if (!j.is_object()) throw ApiError(400, fmt::format("request body must be a JSON object, got {}", type_name(j)));
  return j;
}

GenerationFields parse_chat_request(const json& j) {
  GenerationFields g;
  g.chat = true;
  parse_common(j, g);
  const json* msgs = field(j, "messages");
  if (!msgs) bad_field("messages", "'messages' is required");
  if (!msgs->is_array()) bad_field("messages", "'messages' must be an array, got {}", type_name(*msgs));
  if (msgs->empty()) bad_field("messages", "'messages' must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    if (!m.is_object()) bad_field(fmt::format("messages[{}]", i), "'messages[{}]' must be an object", i);
    const json* role = field(m, "role");
    const std::string rp = fmt::format("messages[{}].role", i);
    if (!role || !role->is_string()) bad_field(rp, "'{}' must be a string", rp);
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for the system role
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      bad_field(rp, "'{}' must be system, developer, user, assistant or tool, got '{}'", rp, r);
    g.messages.push_back({r, message_content(m, i, r)});
  }
  g.logprobs = boolean(j, "logprobs").value_or(false);
  if (auto tl = integer(j, "top_logprobs", 0, 20)) {
    if (*tl > 0 && !g.logprobs) bad_field("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    g.top_logprobs = int(*tl);
  }
  if (auto rf = string(j, "reasoning_format")) {
    try {
      g.reasoning = parse_reasoning_mode(*rf);
    } catch (const Error& e) {
      bad_field("reasoning_format", "'reasoning_format': {}", e.what());
    }
  }
  if (auto ir = boolean(j, "include_reasoning")) g.reasoning = *ir ? ReasoningMode::Parsed : ReasoningMode::Hidden;
  if (const json* kw = field(j, "chat_template_kwargs")) {
    if (!kw->is_object())
      bad_field("chat_template_kwargs", "'chat_template_kwargs' must be an object, got {}", type_name(*kw));
    if (auto et = boolean(*kw, "enable_thinking")) g.enable_thinking = et;
  }
  return g;
}

GenerationFields parse_completion_request(const json& j) {
  GenerationFields g;
  g.chat = false;
  parse_common(j, g);
  const json* p = field(j, "prompt");
  if (!p) bad_field("prompt", "'prompt' is required");
  auto ids_of = [&](const json& arr) {
    std::vector<int32_t> ids;
    for (const json& e : arr) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > std::numeric_limits<int32_t>::max())
        bad_field("prompt", "'prompt' token ids must be non-negative integers");
      ids.push_back(int32_t(e.get<int64_t>()));
    }
    if (ids.empty()) bad_field("prompt", "'prompt' must not be an empty list of tokens");
    return ids;
  };
  if (p->is_string()) {
    g.prompt_text = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    g.prompt_ids = ids_of(*p);
    g.prompt_is_ids = true;
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    g.prompt_text = (*p)[0].get<std::string>();
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) {
    g.prompt_ids = ids_of((*p)[0]);
    g.prompt_is_ids = true;
  } else if (p->is_array() && p->size() > 1) {
    bad_field("prompt", "only one prompt per request is supported (got {})", p->size());
  } else {
    bad_field("prompt", "'prompt' must be a string, an array of token ids, or a one-element array of either");
  }
  if (auto lp = integer(j, "logprobs", 0, 20)) {
    g.logprobs = true;
    g.top_logprobs = int(*lp);
  }
  if (boolean(j, "echo").value_or(false)) bad_field("echo", "'echo' is not supported");
  if (auto s = string(j, "suffix"); s && !s->empty()) bad_field("suffix", "'suffix' is not supported");
  if (auto b = integer(j, "best_of", 1, 128); b && *b != 1) bad_field("best_of", "only best_of=1 is supported");
  return g;
}

}  // namespace sala::server
