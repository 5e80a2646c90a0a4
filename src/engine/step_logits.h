#pragma once
// The logits of one Engine::step: per request, its rows ([rows, vocab] row-major) as views into one
// buffer of the engine's pool. The pool hands a buffer to a later step only once no StepLogits
// holds it, so a step neither allocates, zeroes nor page-faults its logits (batch 32 at the 9B
// vocabulary: 9.4 MB per step, ~3 ms of host time when each step allocated and split them) and a
// StepLogits kept across steps stays valid. Indexing a temporary returns a copy: a view into a
// buffer nobody holds would be overwritten by the next step.
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace sala {

class StepLogits {
 public:
  StepLogits() = default;
  // ranges[i]: request i's first float in *buffer and its float count.
  StepLogits(std::shared_ptr<const std::vector<float>> buffer, std::vector<std::pair<size_t, size_t>> ranges)
      : buffer_(std::move(buffer)), ranges_(std::move(ranges)) {}

  size_t size() const { return ranges_.size(); }
  bool empty() const { return ranges_.empty(); }
  // Request i's rows (empty when it asked for none), valid while this object lives.
  std::span<const float> operator[](size_t i) const& {
    const auto [first, count] = ranges_.at(i);
    return count ? std::span<const float>(buffer_->data() + first, count) : std::span<const float>();
  }
  // On a temporary (`engine.step(...)[0]`): a copy.
  std::vector<float> operator[](size_t i) const&& {
    const std::span<const float> rows = (*this)[i];
    return {rows.begin(), rows.end()};
  }

 private:
  std::shared_ptr<const std::vector<float>> buffer_;
  std::vector<std::pair<size_t, size_t>> ranges_;
};

}  // namespace sala
