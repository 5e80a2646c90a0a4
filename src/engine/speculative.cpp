#include "engine/speculative.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace sala {

SpeculativeMode parse_speculative_mode(const std::string& name) {
  if (name.empty() || name == "off" || name == "none") return SpeculativeMode::Off;
  if (name == "self") return SpeculativeMode::Self;
  if (name == "lookup") return SpeculativeMode::Lookup;
  fail("unknown speculative mode '{}' (expected self, lookup or off)", name);
}

const char* speculative_mode_name(SpeculativeMode mode) {
  switch (mode) {
    case SpeculativeMode::Off: return "off";
    case SpeculativeMode::Self: return "self";
    case SpeculativeMode::Lookup: return "lookup";
  }
  return "?";
}

void SpeculativeOptions::validate() const {
  SALA_CHECK(draft_tokens >= 1 && draft_tokens <= 32, "--draft-tokens must be in [1, 32], got {}", draft_tokens);
  SALA_CHECK(draft_layers >= 1, "--draft-layers must be positive, got {}", draft_layers);
}

int adapt_draft_tokens(int k, int drafted, int accepted, int max_k) {
  if (drafted > 0 && accepted >= drafted) ++k;
  else if (2 * accepted < drafted) --k;
  return std::clamp(k, 1, std::max(1, max_k));
}

const char* draft_skip_name(DraftSkip why) {
  switch (why) {
    case DraftSkip::End: return "end";
    case DraftSkip::Boundary: return "boundary";
    case DraftSkip::Budget: return "budget";
    case DraftSkip::NoMatch: return "no_match";
  }
  return "?";
}

int64_t SpeculativeStats::skipped_total() const { return std::accumulate(skipped.begin(), skipped.end(), int64_t(0)); }

void SelfDrafter::propose(Engine& engine, std::span<DraftJob> jobs) {
  std::vector<int32_t> cur;
  std::vector<int64_t> start;
  int rounds = 0;
  for (const DraftJob& j : jobs) {
    SALA_CHECK(j.k >= 1, "self-draft: sequence {} asks for {} tokens", j.seq, j.k);
    cur.push_back(j.x0);
    start.push_back(engine.length(j.seq));
    rounds = std::max(rounds, j.k);
  }
  std::vector<Engine::Request> reqs;
  std::vector<size_t> owner;
  for (int r = 0; r < rounds; ++r) {
    reqs.clear();
    owner.clear();
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].k <= r) continue;
      reqs.push_back({jobs[i].seq, std::span(&cur[i], 1)});
      owner.push_back(i);
    }
    auto logits = engine.step(reqs, layers_);
    for (size_t q = 0; q < reqs.size(); ++q) {
      const auto& row = logits[q];
      const size_t i = owner[q];
      cur[i] = int32_t(std::max_element(row.begin(), row.end()) - row.begin());  // greedy: first max
      jobs[i].drafts.push_back(cur[i]);
    }
  }
  // The draft layers wrote KV and lightning state for x0, d1..d(k-1).
  for (size_t i = 0; i < jobs.size(); ++i) engine.rollback(jobs[i].seq, start[i]);
}

std::vector<int32_t> LookupDrafter::lookup(std::span<const int32_t> ctx, int k, int max_ngram) {
  const int64_t L = int64_t(ctx.size());
  for (int n = max_ngram; n >= 1; --n) {
    if (L <= n) continue;
    const auto suffix = ctx.subspan(size_t(L - n));
    // Most recent earlier occurrence whose continuation is non-empty.
    for (int64_t i = L - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), ctx.begin() + i)) continue;
      const int64_t from = i + n, to = std::min<int64_t>(from + k, L);
      return {ctx.begin() + from, ctx.begin() + to};
    }
  }
  return {};
}

size_t LookupIndex::KeyHash::operator()(const Key& k) const noexcept {
  uint64_t x = uint32_t(k.t[0]);
  x = x * 0x9E3779B97F4A7C15ull + uint32_t(k.t[1]);
  x = x * 0x9E3779B97F4A7C15ull + uint32_t(k.t[2]);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return size_t(x);
}

void LookupIndex::extend(std::span<const int32_t> h) {
  const int64_t L = int64_t(h.size());
  if (L < indexed_ || (indexed_ > 0 && h[size_t(indexed_ - 1)] != last_token_)) {  // not an extension
    for (auto& m : last_) m.clear();
    indexed_ = 0;
    ++rebuilds_;
  }
  // Every n-gram ending at e (in order, so a later start overwrites an earlier one).
  for (int64_t e = indexed_; e < L; ++e)
    for (int n = 1; n <= 3 && e - n + 1 >= 0; ++n) {
      Key key{{0, 0, 0}};
      for (int t = 0; t < n; ++t) key.t[t] = h[size_t(e - n + 1 + t)];
      last_[n - 1][key] = e - n + 1;
    }
  indexed_ = L;
  if (L > 0) last_token_ = h[size_t(L - 1)];
}

std::vector<int32_t> LookupIndex::propose(std::span<const int32_t> h, int32_t x0, int k) {
  extend(h);
  // The context is h + x0 (length L); the n-grams of h are exactly the earlier occurrences with a
  // non-empty continuation that lookup() scans for.
  const int64_t L = int64_t(h.size()) + 1;
  auto at = [&](int64_t i) { return i + 1 == L ? x0 : h[size_t(i)]; };
  for (int n = 3; n >= 1; --n) {
    if (L <= n) continue;
    Key key{{0, 0, 0}};
    for (int t = 0; t < n; ++t) key.t[t] = at(L - n + t);
    const auto it = last_[n - 1].find(key);
    if (it == last_[n - 1].end()) continue;
    const int64_t from = it->second + n, to = std::min<int64_t>(from + k, L);
    std::vector<int32_t> out;
    out.reserve(size_t(to - from));
    for (int64_t i = from; i < to; ++i) out.push_back(at(i));
    return out;
  }
  return {};
}

void LookupDrafter::propose(Engine& engine, std::span<DraftJob> jobs) {
  for (DraftJob& j : jobs) j.drafts = index_[j.seq].propose(engine.tokens(j.seq), j.x0, j.k);
}

int max_draft_tokens(int64_t length, int64_t max_context, int64_t tokens_left, int64_t dense_len, int k,
                     DraftSkip* why) {
  // Tokens the round may emit: max_tokens, and plain decoding ends once length + 1 reaches the
  // context, so at most max_context - length - 1 more tokens.
  const int64_t emit = std::min(tokens_left, max_context - length - 1);
  int64_t K = std::min<int64_t>(k, emit - 1);
  if (K <= 0) {
    *why = DraftSkip::End;
    return 0;
  }
  // Verify of K + 1 tokens from `length`: one regime for all (spec §4.2, the call's final length);
  // plain decode gives the token at position p the regime of p + 1. Both agree when every token
  // is on one side: length + K + 1 < dense_len, or length + 1 >= dense_len.
  if (length + 1 < dense_len && length + K + 1 >= dense_len) K = dense_len - length - 2;
  if (K <= 0) {
    *why = DraftSkip::Boundary;
    return 0;
  }
  return int(K);
}

namespace {
int32_t argmax(std::span<const double> p) { return int32_t(std::max_element(p.begin(), p.end()) - p.begin()); }
}  // namespace

Verdict accept_drafts(Sampler& sampler, std::span<const float> logits, std::span<const int32_t> drafts,
                      std::span<const int32_t> tokens) {
  const size_t K = drafts.size();
  SALA_CHECK(K >= 1 && logits.size() % (K + 1) == 0, "accept_drafts: {} logits for {} drafts", logits.size(), K);
  SALA_CHECK(tokens.size() >= K + 1, "accept_drafts: {} tokens for {} drafts", tokens.size(), K);
  const size_t V = logits.size() / (K + 1);
  const size_t base = tokens.size() - K;  // history of row 0: everything up to x0
  const bool greedy = sampler.params().temperature == 0.0f;
  const int top_n = std::min<int>(sampler.params().top_logprobs, int(V));
  std::vector<float> logsm;
  std::vector<int32_t> order;
  Verdict v;
  for (size_t i = 0; i <= K; ++i) {
    std::vector<double> p = sampler.distribution(logits.subspan(i * V, V), tokens.first(base + i), &logsm);
    SampledToken tok;
    bool accepted = false;
    if (i < K) {
      const int32_t d = drafts[i];
      if (greedy) {
        tok.id = argmax(p);
        accepted = tok.id == d;
      } else {
        accepted = sampler.uniform() < p[size_t(d)];
        if (accepted) {
          tok.id = d;
        } else {
          p[size_t(d)] = 0;  // residual: the target with the draft's mass removed, renormalised
          tok.id = sampler.draw(p);
        }
      }
    } else {  // bonus token after K accepted drafts
      tok.id = greedy ? argmax(p) : sampler.draw(p);
    }
    tok.logprob = logsm[size_t(tok.id)];
    if (top_n > 0) {  // the alternatives Sampler::sample reports, from the same log-softmax
      order.resize(V);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + top_n, order.end(),
                        [&](int32_t a, int32_t b) { return logsm[size_t(a)] > logsm[size_t(b)]; });
      for (int t = 0; t < top_n; ++t) tok.top.emplace_back(order[size_t(t)], logsm[size_t(order[size_t(t)])]);
    }
    v.tokens.push_back(std::move(tok));
    if (!accepted) break;
    ++v.accepted;
  }
  return v;
}

}  // namespace sala
