#include "engine/text_stream.h"

#include <algorithm>

namespace sala {

StopScanner::StopScanner(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopScanner::push(std::string_view piece) {
  if (stopped_) return {};
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(piece);
  // The earliest match wins; the held text never contains a whole stop string, so a match can only
  // start in held_ if it ends in the new piece, which this search sees.
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    const size_t p = buf.find(s);
    if (p < best || (p == best && p != std::string::npos && s.size() > matched_.size())) {
      best = p;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    buf.resize(best);
    return buf;
  }
  // Hold back the longest suffix that could still grow into a stop string.
  size_t keep = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(buf.size(), s.size() - 1); k > keep; --k)
      if (std::string_view(buf).substr(buf.size() - k) == std::string_view(s).substr(0, k)) {
        keep = k;
        break;
      }
  held_ = buf.substr(buf.size() - keep);
  buf.resize(buf.size() - keep);
  return buf;
}

std::string StopScanner::finish() {
  if (stopped_) return {};
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

TextStream::TextStream(const Tokenizer& tokenizer, TextStreamOptions options)
    : tok_(tokenizer), decoder_(tokenizer, options.skip_special), stop_(std::move(options.stop)) {
  if (options.hide_think) think_.emplace(false);
}

std::string TextStream::visible(std::string piece, bool last) {
  if (think_) {
    std::string shown = think_->push(piece);
    if (last) shown += think_->finish();
    piece = std::move(shown);
  }
  std::string out = stop_.push(piece);
  if (last) out += stop_.finish();
  text_ += out;
  return out;
}

std::string TextStream::push(int32_t id) {
  if (stopped() || finished_) return {};
  if (id < 0 || id >= tok_.vocab_size()) return {};
  return visible(decoder_.push(id), false);
}

std::string TextStream::finish() {
  if (finished_) return {};
  finished_ = true;
  if (stopped()) return {};
  return visible(decoder_.finish(), true);
}

}  // namespace sala
