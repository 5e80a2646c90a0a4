// Token sampling from one row of logits: penalties, temperature, top-k, top-p, min-p, seeded RNG.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace sala {

struct SamplingParams {
  float temperature = 0.9f;        // 0: greedy
  int top_k = 50;                  // 0: off
  float top_p = 1.0f;              // 1: off
  float min_p = 0.0f;              // 0: off
  float repetition_penalty = 1.0f; // HF-style: divides positive / multiplies negative logits of seen tokens
  float frequency_penalty = 0.0f;  // OpenAI-style: minus count * f
  float presence_penalty = 0.0f;   // OpenAI-style: minus p if seen
  uint64_t seed = 0;
  int top_logprobs = 0;            // alternatives to report per token (0: none)
};

struct SampledToken {
  int32_t id = 0;
  float logprob = 0;  // log-softmax of the processed logits at temperature 1 (before truncation)
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs alternatives, best first
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params);
  const SamplingParams& params() const { return params_; }
  // `history`: tokens the penalties apply to (prompt + generated, as llama.cpp/vLLM do).
  SampledToken sample(std::span<const float> logits, std::span<const int32_t> history);

  // Speculative decoding: the distribution sample() draws from (penalties, temperature, top-k,
  // top-p, min-p) as a dense probability vector over the vocabulary (sums to 1; temperature 0:
  // a point mass on the first argmax). Leaves the RNG alone. `log_softmax` (optional) receives the
  // penalised log-softmax at temperature 1, the values SampledToken::logprob reports.
  std::vector<double> distribution(std::span<const float> logits, std::span<const int32_t> history,
                                   std::vector<float>* log_softmax = nullptr);
  // An index drawn from non-negative weights (need not sum to 1) with this sampler's RNG.
  int32_t draw(std::span<const double> weights);
  double uniform();  // U[0, 1) from this sampler's RNG

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> order_;
};

}  // namespace sala
