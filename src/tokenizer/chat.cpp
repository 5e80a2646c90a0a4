#include "tokenizer/chat.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace sala {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// The MiniCPM4 family's template: exactly the built-in layout (no BOS, no default system prompt).
constexpr std::string_view kKnownChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// Length of the longest suffix of s that is a proper prefix of marker.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::string format_chat(std::span<const ChatMessage> messages, const ChatOptions& options) {
  std::string s;
  auto turn = [&](std::string_view role, std::string_view content) {
    s.append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
  };
  if (!options.system_prompt.empty()) {
    if (!messages.empty() && messages.front().role == "system")
      fail("chat: a system prompt was given both as an option and as the first message");
    turn("system", options.system_prompt);
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty()) fail("chat: message {} has an empty role", i);
    turn(messages[i].role, messages[i].content);
  }
  if (options.add_generation_prompt) {
    s.append("<|im_start|>assistant\n");
    if (!options.enable_thinking) s.append(kEmptyThinkBlock);
  }
  return s;
}

std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                 const ChatOptions& options) {
  return tokenizer.encode(format_chat(messages, options), /*add_special_tokens=*/true);
}

std::optional<std::string> chat_template_warning(const std::filesystem::path& model_dir) {
  auto warning = [](const std::filesystem::path& p) {
    return fmt::format("chat template in {} is not interpreted; using built-in ChatML", p.string());
  };
  auto jinja = model_dir / "chat_template.jinja";
  if (std::filesystem::is_regular_file(jinja)) {
    std::ifstream in(jinja, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (trim(ss.str()) != kKnownChatML) return warning(jinja);
  }
  auto config = model_dir / "tokenizer_config.json";
  if (std::filesystem::is_regular_file(config)) {
    std::ifstream in(config, std::ios::binary);
    auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return warning(config);  // unreadable: cannot tell, so say so
    if (j.is_object() && j.contains("chat_template") && !j["chat_template"].is_null()) {
      const auto& t = j["chat_template"];
      if (!t.is_string() || trim(t.get<std::string>()) != kKnownChatML) return warning(config);
    }
  }
  return std::nullopt;
}

std::string ThinkFilter::push(std::string_view piece) {
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(piece);
  std::string out;
  size_t i = 0;
  while (i < buf.size()) {
    std::string_view rest = std::string_view(buf).substr(i);
    if (state_ == State::AfterThink) {
      while (i < buf.size() && (buf[i] == '\n' || buf[i] == '\r')) ++i;
      if (i < buf.size()) state_ = State::Text;
      continue;
    }
    std::string_view marker = state_ == State::Text ? kOpen : kClose;
    std::string& sink = state_ == State::Text ? out : reasoning_;
    size_t p = rest.find(marker);
    if (p != std::string_view::npos) {
      sink.append(rest.substr(0, p));
      i += p + marker.size();
      state_ = state_ == State::Text ? State::Think : State::AfterThink;
      continue;
    }
    size_t k = partial_suffix(rest, marker);
    sink.append(rest.substr(0, rest.size() - k));
    held_ = std::string(rest.substr(rest.size() - k));
    break;
  }
  return out;
}

std::string ThinkFilter::finish() {
  std::string out;
  if (state_ == State::Text) out = std::move(held_);
  else if (state_ == State::Think) reasoning_.append(held_);  // unterminated block stays hidden
  held_.clear();
  return out;
}

std::string ThinkFilter::take_reasoning() {
  std::string r = std::move(reasoning_);
  reasoning_.clear();
  return r;
}

}  // namespace sala
