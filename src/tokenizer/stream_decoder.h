// Streaming detokenizer: feed ids one at a time, get the new text as soon as it is whole UTF-8.
//
// Byte-fallback pieces (<0xNN>) can split a character over several ids; their bytes are held
// until the character is complete and never emitted half. The decoder's leading Strip applies
// only at the start of the stream. The concatenation of all push() results and finish() equals
// Tokenizer::decode of the same ids whenever every run of byte pieces is valid UTF-8 (always
// the case for ids that came from encode).
//
// Invalid byte runs: HF's full decode turns a whole run of byte pieces that is not valid UTF-8
// into one U+FFFD per byte. A stream cannot take back text it already returned, so here the
// characters of a run completed before the first bad byte stay as they were, and from the bad
// byte to the end of the run every byte becomes one U+FFFD, emitted as soon as it is known to
// be bad (an unfinished character at the end of a run or of the stream likewise becomes one
// U+FFFD per byte). HF's own DecodeStream behaves the same way on such input.
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace sala {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tok_(&tokenizer), skip_special_(skip_special_tokens) { reset(); }

  // New text produced by id (often empty while a character is incomplete). Throws on an id
  // outside the vocabulary.
  std::string push(int32_t id);
  // End of stream: flushes an unfinished character (one U+FFFD per byte).
  std::string finish();
  void reset();

 private:
  void emit(std::string_view text, std::string& out);
  void end_run(std::string& out);

  const Tokenizer* tok_;
  bool skip_special_;
  uint8_t pending_[4];
  size_t n_pending_ = 0;
  bool run_bad_ = false;   // the current byte run already hit an invalid byte
  int strip_budget_ = 0;   // leading Strip still to apply
  bool started_ = false;   // some text was emitted
};

}  // namespace sala
