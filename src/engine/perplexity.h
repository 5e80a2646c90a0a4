// Sliding-window perplexity, the Hugging Face recipe ("Perplexity of fixed-length models"):
// windows of `ctx` tokens start every `stride` tokens; each window scores only the tokens that the
// previous window did not score (its last end), each from the logits of the token before it in the
// same window. With stride < ctx every token after the first is scored exactly once; with disjoint
// windows (stride == ctx) each window's first token has no context and is not scored. Unlike HF's per-window average, the result is
// the exact mean negative log-likelihood over all scored tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace sala {

struct PerplexityOptions {
  int64_t ctx = 4096;    // tokens per window
  int64_t stride = 2048; // window start advance; 1 <= stride <= ctx
  int64_t chunk = 0;     // tokens per forward inside a window; 0: the whole window at once
  // Called after each window with (windows done, total windows, tokens scored so far, nll sum so far).
  std::function<void(int64_t, int64_t, int64_t, double)> progress;
};

struct PerplexityResult {
  double nll = 0;      // mean negative log-likelihood (nats) per scored token
  double ppl = 0;      // exp(nll)
  int64_t tokens = 0;  // scored tokens
  int64_t windows = 0;
};

// One window of the recipe: tokens [begin, end) are fed; targets [score_from, end) are scored.
struct PerplexityWindow {
  int64_t begin, end, score_from;
};
std::vector<PerplexityWindow> perplexity_windows(int64_t n_tokens, int64_t ctx, int64_t stride);

// -log softmax(row)[target], computed in double.
double token_nll(std::span<const float> row, int32_t target);

// The engine needs one free sequence, max_context >= ctx, max_batch_tokens and max_logit_rows
// >= the chunk (or ctx when chunk is 0). Needs at least 2 tokens.
PerplexityResult perplexity(Engine& engine, std::span<const int32_t> ids, const PerplexityOptions& options);

}  // namespace sala
