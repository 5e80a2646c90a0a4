#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "core/error.h"

namespace sala {

namespace {

// Repetition (HF-style) and frequency/presence (OpenAI-style) penalties on the tokens of history.
void apply_penalties(std::vector<float>& w, std::span<const int32_t> history, const SamplingParams& p) {
  const int V = int(w.size());
  std::unordered_map<int32_t, int> counts;
  for (int32_t t : history)
    if (t >= 0 && t < V) counts[t]++;
  for (auto [t, n] : counts) {
    float& l = w[size_t(t)];
    if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= float(n) * p.frequency_penalty + p.presence_penalty;
  }
}

// Candidates sorted by logit (ties: lower id first), truncated by top-k, then top-p, then min-p
// (llama.cpp order). Fills order/prob (unnormalised, at temperature) and returns how many remain.
size_t truncate(const std::vector<float>& w, const SamplingParams& p, std::vector<int32_t>& order,
                std::vector<double>& prob) {
  const int V = int(w.size());
  order.resize(size_t(V));
  std::iota(order.begin(), order.end(), 0);
  size_t keep = p.top_k > 0 ? std::min<size_t>(size_t(p.top_k), size_t(V)) : size_t(V);
  auto by_logit = [&](int32_t a, int32_t b) {
    return w[size_t(a)] > w[size_t(b)] || (w[size_t(a)] == w[size_t(b)] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(keep), order.end(), by_logit);
  order.resize(keep);
  prob.assign(keep, 0.0);
  const float top = w[size_t(order[0])];
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += prob[i] = std::exp(double(w[size_t(order[i])] - top) / p.temperature);
  if (p.top_p < 1.0f) {
    double acc = 0;
    size_t n = 0;
    while (n < keep) {
      acc += prob[n++] / sum;
      if (acc >= p.top_p) break;
    }
    keep = n;
  }
  if (p.min_p > 0.0f) {
    size_t n = 1;
    while (n < keep && prob[n] >= p.min_p * prob[0]) ++n;
    keep = n;
  }
  return keep;
}

}  // namespace

Sampler::Sampler(SamplingParams params) : params_(params), rng_(params.seed) {
  SALA_CHECK(params.temperature >= 0, "temperature must be >= 0, got {}", params.temperature);
  SALA_CHECK(params.top_p > 0 && params.top_p <= 1, "top_p must be in (0, 1], got {}", params.top_p);
  SALA_CHECK(params.min_p >= 0 && params.min_p <= 1, "min_p must be in [0, 1], got {}", params.min_p);
  SALA_CHECK(params.top_k >= 0, "top_k must be >= 0, got {}", params.top_k);
  SALA_CHECK(params.repetition_penalty > 0, "repetition_penalty must be > 0, got {}", params.repetition_penalty);
}

SampledToken Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const int V = int(logits.size());
  work_.assign(logits.begin(), logits.end());
  const auto& p = params_;
  if (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    apply_penalties(work_, history, p);
  }
  // Log-softmax of the penalised logits: the reported logprobs (as OpenAI-compatible servers do).
  const float mx = *std::max_element(work_.begin(), work_.end());
  double z = 0;
  for (float l : work_) z += std::exp(double(l - mx));
  const float log_z = mx + float(std::log(z));

  SampledToken out;
  if (p.temperature == 0.0f) {
    out.id = int32_t(std::max_element(work_.begin(), work_.end()) - work_.begin());  // first max on ties
  } else {
    std::vector<double> prob;
    const size_t keep = truncate(work_, p, order_, prob);
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += prob[i];
    double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
    size_t pick = 0;
    while (pick + 1 < keep && r >= prob[pick]) r -= prob[pick++];
    out.id = order_[pick];
  }
  out.logprob = work_[size_t(out.id)] - log_z;
  if (p.top_logprobs > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = std::min<size_t>(size_t(p.top_logprobs), size_t(V));
    std::partial_sort(idx.begin(), idx.begin() + std::ptrdiff_t(k), idx.end(),
                      [&](int32_t a, int32_t b) { return work_[size_t(a)] > work_[size_t(b)]; });
    for (size_t i = 0; i < k; ++i) out.top.emplace_back(idx[i], work_[size_t(idx[i])] - log_z);
  }
  return out;
}

std::vector<double> Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history,
                                          std::vector<float>* log_softmax) {
  const int V = int(logits.size());
  std::vector<float> w(logits.begin(), logits.end());
  const auto& p = params_;
  if (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    apply_penalties(w, history, p);
  }
  if (log_softmax) {
    const float mx = *std::max_element(w.begin(), w.end());
    double z = 0;
    for (float l : w) z += std::exp(double(l - mx));
    const float log_z = mx + float(std::log(z));
    log_softmax->resize(size_t(V));
    for (int i = 0; i < V; ++i) (*log_softmax)[size_t(i)] = w[size_t(i)] - log_z;
  }
  std::vector<double> out(size_t(V), 0.0);
  if (p.temperature == 0.0f) {
    out[size_t(std::max_element(w.begin(), w.end()) - w.begin())] = 1.0;
    return out;
  }
  std::vector<int32_t> order;
  std::vector<double> prob;
  const size_t keep = truncate(w, p, order, prob);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += prob[i];
  for (size_t i = 0; i < keep; ++i) out[size_t(order[i])] = prob[i] / total;
  return out;
}

int32_t Sampler::draw(std::span<const double> weights) {
  double total = 0;
  for (double x : weights) total += x;
  SALA_CHECK(total > 0, "sampler: cannot draw from an all-zero distribution");
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  size_t last = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0) continue;
    last = i;
    if (r < weights[i]) return int32_t(i);
    r -= weights[i];
  }
  return int32_t(last);
}

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

}  // namespace sala
