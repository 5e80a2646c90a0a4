#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sala {

std::vector<PerplexityWindow> perplexity_windows(int64_t n, int64_t ctx, int64_t stride) {
  SALA_CHECK(ctx >= 2, "perplexity: the window (--ctx) must hold at least 2 tokens, got {}", ctx);
  SALA_CHECK(stride >= 1 && stride <= ctx, "perplexity: --stride must be within 1..ctx ({}), got {}", ctx, stride);
  std::vector<PerplexityWindow> w;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < n; begin += stride) {
    const int64_t end = std::min(begin + ctx, n);
    const int64_t from = std::max(prev_end, begin + 1);  // the window's first token has no context
    if (from < end) w.push_back({begin, end, from});
    prev_end = end;
    if (end == n) break;
  }
  return w;
}

double token_nll(std::span<const float> row, int32_t target) {
  double mx = -INFINITY;
  for (float v : row) mx = std::max(mx, double(v));
  double sum = 0;
  for (float v : row) sum += std::exp(double(v) - mx);
  return std::log(sum) + mx - double(row[size_t(target)]);
}

PerplexityResult perplexity(Engine& engine, std::span<const int32_t> ids, const PerplexityOptions& o) {
  const int64_t n = int64_t(ids.size());
  SALA_CHECK(n >= 2, "perplexity: the text must hold at least 2 tokens, got {}", n);
  const int vocab = engine.model().config().vocab_size;
  for (int32_t t : ids) SALA_CHECK(t >= 0 && t < vocab, "perplexity: token id {} is outside the vocabulary ({})", t, vocab);
  const auto windows = perplexity_windows(n, o.ctx, o.stride);
  PerplexityResult r;
  double nll_sum = 0;
  for (const auto& w : windows) {
    const ScopedSequence sequence(engine);
    const int seq = sequence.id();
    const int64_t len = w.end - w.begin, chunk = o.chunk > 0 ? o.chunk : len;
    // Logits are needed at positions [score_from - 1, end - 1) of the text.
    for (int64_t done = 0; done < len;) {
      const int64_t take = std::min(chunk, len - done);
      const int64_t first = w.begin + done, last = first + take;  // text positions [first, last)
      const bool need = last > w.score_from - 1 && first < w.end - 1;
      Engine::Request req{seq, ids.subspan(size_t(first), size_t(take)), len, need, need};
      auto out = engine.step(std::span(&req, 1));
      if (need) {
        for (int64_t pos = std::max(first, w.score_from - 1); pos < std::min(last, w.end - 1); ++pos) {
          std::span<const float> row(out[0].data() + size_t(pos - first) * size_t(vocab), size_t(vocab));
          nll_sum += token_nll(row, ids[size_t(pos + 1)]);
          ++r.tokens;
        }
      }
      done += take;
    }
    ++r.windows;
    if (o.progress) o.progress(r.windows, int64_t(windows.size()), r.tokens, nll_sum);
  }
  r.nll = nll_sum / double(r.tokens);
  r.ppl = std::exp(r.nll);
  return r;
}

}  // namespace sala
