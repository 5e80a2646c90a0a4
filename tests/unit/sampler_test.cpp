// Sampler: each per-request control changes the distribution as specified — temperature, top-p
// (nucleus: the smallest prefix reaching p), min-p (tokens below min_p * p_max dropped),
// presence / frequency penalties (OpenAI: logit - count * f - p for every token seen) and the
// HF repetition penalty — checked on distribution() (exact) and on sample() (draw frequencies,
// greedy picks, reported logprobs), so both code paths are covered.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"

using namespace sala;

namespace {

// Logits whose softmax (temperature 1) is exactly `probs`.
std::vector<float> logits_of(std::initializer_list<double> probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

SamplingParams params(float temperature = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.seed = 7;
  return p;
}

// How often each token is drawn by sample() in n draws.
std::vector<int> histogram(Sampler& s, const std::vector<float>& logits, int n, std::span<const int32_t> history = {}) {
  std::vector<int> h(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++h[size_t(s.sample(logits, history).id)];
  return h;
}

const std::vector<float> kLogits = logits_of({0.5, 0.25, 0.15, 0.1});

}  // namespace

TEST(Sampler, PlainDistributionIsTheSoftmax) {
  Sampler s(params());
  const auto d = s.distribution(kLogits, {});
  const double want[] = {0.5, 0.25, 0.15, 0.1};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(d[i], want[i], 1e-6) << i;
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  // p_i^(1/T), renormalised.
  for (float t : {0.5f, 2.0f}) {
    Sampler s(params(t));
    const auto d = s.distribution(kLogits, {});
    double z = 0;
    for (double p : {0.5, 0.25, 0.15, 0.1}) z += std::pow(p, 1.0 / t);
    EXPECT_NEAR(d[0], std::pow(0.5, 1.0 / t) / z, 1e-6) << t;
    EXPECT_NEAR(d[3], std::pow(0.1, 1.0 / t) / z, 1e-6) << t;
  }
  // Temperature 0: greedy, whatever the seed.
  SamplingParams g = params(0.0f);
  for (uint64_t seed : {1u, 2u, 3u}) {
    g.seed = seed;
    Sampler s(g);
    EXPECT_EQ(s.sample(kLogits, {}).id, 0);
  }
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  // 0.5 < 0.7 <= 0.75: the first two tokens, renormalised to 2/3 and 1/3; the tail is gone.
  SamplingParams p = params();
  p.top_p = 0.7f;
  Sampler s(p);
  const auto d = s.distribution(kLogits, {});
  EXPECT_NEAR(d[0], 2.0 / 3, 1e-6);
  EXPECT_NEAR(d[1], 1.0 / 3, 1e-6);
  EXPECT_EQ(d[2], 0.0);
  EXPECT_EQ(d[3], 0.0);
  // 0.75 < 0.8 <= 0.9: three tokens.
  p.top_p = 0.8f;
  Sampler s3(p);
  const auto d3 = s3.distribution(kLogits, {});
  EXPECT_NEAR(d3[2], 0.15 / 0.9, 1e-6);
  EXPECT_EQ(d3[3], 0.0);
  // sample() draws from the same nucleus: never the tail, both kept tokens in proportion.
  const auto h = histogram(s, kLogits, 6000);
  EXPECT_EQ(h[2] + h[3], 0);
  EXPECT_NEAR(double(h[0]) / 6000, 2.0 / 3, 0.03);
  // top_p = 1: off (the tail stays).
  p.top_p = 1.0f;
  Sampler off(p);
  EXPECT_GT(off.distribution(kLogits, {})[3], 0.09);
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheTop) {
  // min_p 0.4: threshold 0.4 * 0.5 = 0.2, so 0.25 stays and 0.15 / 0.1 go.
  SamplingParams p = params();
  p.min_p = 0.4f;
  Sampler s(p);
  const auto d = s.distribution(kLogits, {});
  EXPECT_NEAR(d[0], 2.0 / 3, 1e-6);
  EXPECT_NEAR(d[1], 1.0 / 3, 1e-6);
  EXPECT_EQ(d[2] + d[3], 0.0);
  const auto h = histogram(s, kLogits, 3000);
  EXPECT_EQ(h[2] + h[3], 0);
  EXPECT_GT(h[1], 700);
  // min_p 0.25: threshold 0.125 keeps 0.15, drops 0.1.
  p.min_p = 0.25f;
  Sampler s3(p);
  const auto d3 = s3.distribution(kLogits, {});
  EXPECT_NEAR(d3[2], 0.15 / 0.9, 1e-6);
  EXPECT_EQ(d3[3], 0.0);
  // min_p 1: only the most likely token.
  p.min_p = 1.0f;
  Sampler top(p);
  EXPECT_EQ(histogram(top, kLogits, 200)[0], 200);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesLowerSeenLogitsByTheRightAmount) {
  // Token 1 seen twice, token 2 once, tokens 0 and 3 never.
  const std::vector<int32_t> history = {1, 2, 1};
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f};
  SamplingParams p = params();
  p.presence_penalty = 0.25f;
  p.frequency_penalty = 0.5f;
  Sampler s(p);
  std::vector<float> ls;
  s.distribution(logits, history, &ls);
  // Penalised logits: {1, 2 - 2*0.5 - 0.25, 0.5 - 0.5 - 0.25, -1} = {1, 0.75, -0.25, -1}.
  const float want[] = {1.0f, 0.75f, -0.25f, -1.0f};
  for (size_t i = 1; i < 4; ++i) EXPECT_NEAR(ls[i] - ls[0], want[i] - want[0], 1e-5) << i;
  double z = 0;
  for (float w : want) z += std::exp(double(w));
  EXPECT_NEAR(ls[0], 1.0 - std::log(z), 1e-5);

  // Presence alone: the same amount for one or many occurrences.
  SamplingParams pp = params();
  pp.presence_penalty = 0.7f;
  Sampler sp(pp);
  sp.distribution(logits, history, &ls);
  EXPECT_NEAR((ls[1] - ls[0]) - (2.0f - 1.0f), -0.7, 1e-5);
  EXPECT_NEAR((ls[2] - ls[0]) - (0.5f - 1.0f), -0.7, 1e-5);
  EXPECT_NEAR((ls[3] - ls[0]) - (-1.0f - 1.0f), 0.0, 1e-5);
  // Frequency alone: proportional to the count.
  SamplingParams fp = params();
  fp.frequency_penalty = 0.3f;
  Sampler sf(fp);
  sf.distribution(logits, history, &ls);
  EXPECT_NEAR((ls[1] - ls[0]) - (2.0f - 1.0f), -0.6, 1e-5);
  EXPECT_NEAR((ls[2] - ls[0]) - (0.5f - 1.0f), -0.3, 1e-5);
  // Negative values encourage repetition.
  SamplingParams np = params();
  np.presence_penalty = -1.0f;
  Sampler sn(np);
  sn.distribution(logits, history, &ls);
  EXPECT_NEAR((ls[2] - ls[0]) - (0.5f - 1.0f), 1.0, 1e-5);
}

TEST(Sampler, PenaltiesChangeWhatSampleDrawsAndReports) {
  // Greedy: token 1 leads by 0.2 until it has been seen; then the penalty hands the pick to 0.
  const std::vector<float> logits = {1.0f, 1.2f, 0.0f};
  const std::vector<int32_t> seen = {1};
  Sampler plain(params(0.0f));
  EXPECT_EQ(plain.sample(logits, seen).id, 1);
  SamplingParams p = params(0.0f);
  p.presence_penalty = 0.5f;
  Sampler pres(p);
  EXPECT_EQ(pres.sample(logits, {}).id, 1);  // nothing seen: no effect
  const SampledToken t = pres.sample(logits, seen);
  EXPECT_EQ(t.id, 0);
  // The reported logprob is that of the penalised logits {1, 0.7, 0}.
  const double z = std::exp(1.0) + std::exp(0.7) + std::exp(0.0);
  EXPECT_NEAR(t.logprob, 1.0 - std::log(z), 1e-5);
  SamplingParams f = params(0.0f);
  f.frequency_penalty = 0.15f;
  Sampler freq(f);
  EXPECT_EQ(freq.sample(logits, seen).id, 1);           // 1.2 - 0.15 > 1
  const std::vector<int32_t> twice = {1, 1};
  EXPECT_EQ(freq.sample(logits, twice).id, 0);          // 1.2 - 0.3 < 1

  // Sampled: a large penalty on the favourite moves nearly all the mass away from it.
  SamplingParams ps = params(1.0f);
  ps.frequency_penalty = 2.0f;
  Sampler sampled(ps);
  const std::vector<float> peaked = {0.0f, 3.0f, 0.0f};
  const std::vector<int32_t> hist = {1, 1, 1};
  const auto h = histogram(sampled, peaked, 2000, hist);  // logit of 1: 3 - 6 = -3
  EXPECT_LT(h[1], 100);
  Sampler unpenalised(params(1.0f));
  EXPECT_GT(histogram(unpenalised, peaked, 2000, hist)[1], 1500);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  const std::vector<float> logits = {1.0f, 2.0f, -1.0f, 0.5f};
  const std::vector<int32_t> history = {1, 2};
  SamplingParams p = params();
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> ls;
  s.distribution(logits, history, &ls);
  EXPECT_NEAR(ls[1] - ls[0], 1.0f - 1.0f, 1e-5);   // 2 / 2 = 1
  EXPECT_NEAR(ls[2] - ls[0], -2.0f - 1.0f, 1e-5);  // -1 * 2 = -2
  EXPECT_NEAR(ls[3] - ls[0], 0.5f - 1.0f, 1e-5);   // unseen
}

TEST(Sampler, SeedMakesDrawsReproducibleAndRangesAreChecked) {
  SamplingParams p = params();
  p.seed = 123;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(kLogits, {}).id, b.sample(kLogits, {}).id);
  SamplingParams bad = params();
  bad.top_p = 0.0f;
  EXPECT_THROW(Sampler{bad}, Error);
  bad = params();
  bad.min_p = 1.5f;
  EXPECT_THROW(Sampler{bad}, Error);
  bad = params();
  bad.temperature = -1.0f;
  EXPECT_THROW(Sampler{bad}, Error);
}
