// Generated ids -> the text a user sees, piece by piece: streaming detokenization, optional hiding
// of <think> blocks, and stop strings.
//
// Stop strings are matched on the visible text (after the think filter), so a stop string inside
// hidden reasoning does not end the answer. They may span token boundaries: text that could be
// the start of a stop string is held back until it is decided. The text before the first stop
// string is emitted; the stop string and everything after it are not.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat.h"
#include "tokenizer/stream_decoder.h"

namespace sala {

// Finds the first occurrence of any stop string in text given in arbitrary pieces.
class StopScanner {
 public:
  explicit StopScanner(std::vector<std::string> stops);  // empty strings are ignored

  std::string push(std::string_view piece);  // text now known to precede any stop string
  std::string finish();                      // end of stream: releases held-back text
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string found ("" if none)

 private:
  std::vector<std::string> stops_;
  std::string held_;  // a suffix that is a proper prefix of some stop string
  std::string matched_;
  bool stopped_ = false;
};

struct TextStreamOptions {
  std::vector<std::string> stop;  // stop strings
  bool hide_think = false;        // remove <think>...</think> blocks (--no-think)
  bool skip_special = true;       // special tokens (<|im_start|>, ...) are not shown
};

class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, TextStreamOptions options);

  // New visible text for one generated id. Ids the tokenizer does not know decode to nothing (a
  // model's vocabulary may be larger than its tokenizer's). Returns "" once stopped().
  std::string push(int32_t id);
  // End of generation: the held-back text (nothing after a stop string).
  std::string finish();
  bool stopped() const { return stop_.stopped(); }
  const std::string& text() const { return text_; }  // everything returned so far
  std::string reasoning() { return think_ ? think_->take_reasoning() : std::string(); }

 private:
  std::string visible(std::string piece, bool last);

  const Tokenizer& tok_;
  StreamDecoder decoder_;
  std::optional<ThinkFilter> think_;
  StopScanner stop_;
  std::string text_;
  bool finished_ = false;
};

}  // namespace sala
