#include "tokenizer/stream_decoder.h"

#include "tokenizer/utf8.h"

namespace sala {

void StreamDecoder::reset() {
  n_pending_ = 0;
  run_bad_ = false;
  strip_budget_ = tok_->strip_start_;
  started_ = false;
}

void StreamDecoder::emit(std::string_view text, std::string& out) {
  if (text.empty()) return;
  if (!started_) {
    text.remove_prefix(tok_->strip_prefix(text, strip_budget_));
    if (text.empty()) return;  // only stripped characters so far
    started_ = true;
  }
  out.append(text);
}

void StreamDecoder::end_run(std::string& out) {
  for (size_t i = 0; i < n_pending_; ++i) emit(utf8::kReplacement, out);
  n_pending_ = 0;
  run_bad_ = false;
}

std::string StreamDecoder::push(int32_t id) {
  tok_->check_id(id);
  std::string out;
  if (skip_special_ && tok_->special_[size_t(id)]) return out;  // removed before decoding, as in HF
  int b = tok_->byte_[size_t(id)];
  if (b < 0) {
    end_run(out);
    emit(tok_->decoded_[size_t(id)], out);
    return out;
  }
  if (run_bad_) {
    emit(utf8::kReplacement, out);
    return out;
  }
  pending_[n_pending_++] = uint8_t(b);
  switch (utf8::classify(pending_, n_pending_)) {
    case utf8::Prefix::Complete:
      emit(std::string_view(reinterpret_cast<const char*>(pending_), n_pending_), out);
      n_pending_ = 0;
      break;
    case utf8::Prefix::Incomplete:
      break;
    case utf8::Prefix::Invalid:
      for (size_t i = 0; i < n_pending_; ++i) emit(utf8::kReplacement, out);
      n_pending_ = 0;
      run_bad_ = true;
      break;
  }
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  end_run(out);
  return out;
}

}  // namespace sala
