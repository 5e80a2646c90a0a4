// Chat prompt formatting (ChatML, spec §5.2) and hiding of <think> blocks in streamed output.
//
//   <s><|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n
//   <|im_start|>assistant\n{text}<|im_end|>\n ... <|im_start|>assistant\n
//
// <s> is not part of the text: it comes from the tokenizer's post-processor (encode with
// special tokens), so it appears exactly once. Message content is tokenized like any text, so
// special-token strings inside it become special ids (as with HF apply_chat_template).
// Jinja chat templates are not run; chat_template_warning() says when a model directory ships
// one that the built-in layout may not match.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sala {

class Tokenizer;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", ...
  std::string content;
};

struct ChatOptions {
  std::string system_prompt;         // if non-empty, a system message placed first
  bool add_generation_prompt = true;  // end with "<|im_start|>assistant\n"
  // false: append the empty block "<think>\n\n</think>\n\n" after the generation prompt
  // (MiniCPM 4.1 convention; spec §5.2 best judgement, unverified for SALA).
  bool enable_thinking = true;
};

inline constexpr std::string_view kEmptyThinkBlock = "<think>\n\n</think>\n\n";

// The prompt text (without BOS). Throws on an empty role, or on a system prompt given both in
// options and as the first message.
std::string format_chat(std::span<const ChatMessage> messages, const ChatOptions& options = {});

// Prompt ids: BOS (from the post-processor) + the encoded prompt text.
std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                 const ChatOptions& options = {});

// If model_dir holds a chat template the engine does not interpret (tokenizer_config.json with
// "chat_template", or chat_template.jinja), the warning to print once when loading the model:
// "chat template in X is not interpreted; using built-in ChatML". The plain ChatML template of
// the MiniCPM4 family is recognised as equivalent and gives no warning.
std::optional<std::string> chat_template_warning(const std::filesystem::path& model_dir);

// Streaming filter that removes "<think>...</think>" blocks and the newlines right after
// "</think>" from generated text given in arbitrary pieces (markers may be split anywhere).
// Text that might be the start of a marker is held back until it is decided. The hidden text is
// kept and can be taken with take_reasoning().
class ThinkFilter {
 public:
  // start_inside: the prompt already opened a block, so output starts as reasoning.
  explicit ThinkFilter(bool start_inside = false) : state_(start_inside ? State::Think : State::Text) {}

  std::string push(std::string_view piece);  // visible text now known
  std::string finish();                      // end of stream: releases held-back visible text
  std::string take_reasoning();              // hidden text gathered so far (markers excluded)
  bool inside_think() const { return state_ == State::Think; }

 private:
  enum class State { Text, Think, AfterThink };
  State state_;
  std::string held_;  // possible start of a marker
  std::string reasoning_;
};

}  // namespace sala
