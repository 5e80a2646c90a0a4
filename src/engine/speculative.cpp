#include "engine/speculative.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"

namespace sala {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

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

std::vector<int32_t> SelfDrafter::propose(Engine& engine, int seq, std::span<const int32_t> context, int k) {
  SALA_CHECK(!context.empty(), "self-draft: empty context");
  const int64_t start = engine.length(seq);
  std::vector<int32_t> drafts;
  int32_t cur = context.back();
  for (int i = 0; i < k; ++i) {
    Engine::Request r{seq, std::span(&cur, 1)};
    auto logits = engine.step(std::span(&r, 1), layers_);
    const auto& row = logits[0];
    cur = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    drafts.push_back(cur);
  }
  engine.rollback(seq, start);  // the draft layers wrote KV/state for x0, d1..d(k-1)
  return drafts;
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

std::vector<int32_t> LookupDrafter::propose(Engine&, int, std::span<const int32_t> context, int k) {
  return lookup(context, k);
}

SpeculativeGenerator::SpeculativeGenerator(Engine& engine, SpeculativeOptions options, SchedulerOptions scheduling)
    : engine_(engine), options_(options), scheduling_(scheduling) {
  SALA_CHECK(options.draft_tokens >= 1 && options.draft_tokens <= 32, "--draft-tokens must be in [1, 32], got {}",
             options.draft_tokens);
  SALA_CHECK(options.draft_layers >= 1, "--draft-layers must be positive, got {}", options.draft_layers);
  SALA_CHECK(scheduling.prefill_chunk > 0 && scheduling.max_batch_tokens > 0,
             "speculative: chunk sizes must be positive");
  options_.draft_layers = std::min(options.draft_layers, engine.model().config().num_layers);
  switch (options.mode) {
    case SpeculativeMode::Self: drafter_ = std::make_unique<SelfDrafter>(options_.draft_layers); break;
    case SpeculativeMode::Lookup: drafter_ = std::make_unique<LookupDrafter>(); break;
    case SpeculativeMode::Off: break;
  }
}

FinishReason SpeculativeGenerator::run(GenerationRequest req) {
  const int64_t ctx = engine_.options().max_context;
  const int64_t plen = int64_t(req.prompt.size());
  SALA_CHECK(plen > 0, "empty prompt");
  SALA_CHECK(plen < ctx, "prompt of {} tokens does not fit the context of {} tokens", plen, ctx);
  const int vocab = engine_.model().config().vocab_size;
  for (int32_t t : req.prompt) SALA_CHECK(t >= 0 && t < vocab, "prompt token {} outside the vocabulary", t);
  Sampler sampler(req.sampling);
  auto done = [&](FinishReason why, int seq) {
    if (seq >= 0) engine_.close(seq);
    if (req.on_finish) req.on_finish(why);
    return why;
  };
  if (req.max_tokens <= 0) return done(FinishReason::Length, -1);

  const int seq = engine_.open();
  try {
    // Prefill, every chunk in the regime of the whole prompt (spec §4.2).
    const auto t0 = Clock::now();
    const int64_t chunk = std::min(scheduling_.prefill_chunk, scheduling_.max_batch_tokens);
    std::vector<float> last;
    for (int64_t at = 0; at < plen; at += chunk) {
      const int64_t take = std::min(chunk, plen - at);
      const bool fin = at + take == plen;
      Engine::Request r{seq, std::span(req.prompt).subspan(size_t(at), size_t(take)), plen, false, fin};
      auto out = engine_.step(std::span(&r, 1));
      ++stats_.steps;
      if (fin) last = std::move(out[0]);
    }
    stats_.prefill_seconds += since(t0);
    stats_.prompt_tokens += plen;

    const auto& eos = engine_.model().config().eos_token_ids;
    int generated = 0;
    std::optional<FinishReason> finished;
    // Reports one token chosen after `fed` tokens were in the sequence; false when it ends it.
    auto emit = [&](const SampledToken& tok, int64_t fed) {
      ++generated;
      ++stats_.generated_tokens;
      const bool is_eos = !req.ignore_eos && std::find(eos.begin(), eos.end(), tok.id) != eos.end();
      bool keep_going = true;
      if (!is_eos && req.on_token) keep_going = req.on_token(tok);
      if (is_eos || !keep_going) finished = FinishReason::Stop;
      else if (generated >= req.max_tokens || fed + 1 >= ctx) finished = FinishReason::Length;
      return !finished;
    };

    SampledToken first = sampler.sample(last, engine_.tokens(seq));
    if (!emit(first, plen)) return done(*finished, seq);
    int32_t x0 = first.id;
    const int64_t dense_len = engine_.model().config().sparse.dense_len;
    const int max_rows = int(engine_.model().limits().max_logit_rows);
    std::vector<int32_t> context, verify;
    std::vector<float> logsm;

    const auto t1 = Clock::now();
    while (true) {
      const int64_t C = engine_.length(seq);
      int64_t K = drafter_ ? options_.draft_tokens : 0;
      K = std::min<int64_t>({K, ctx - C - 1, int64_t(req.max_tokens - generated - 1), int64_t(max_rows - 1)});
      // Never let one verify call straddle the dense/sparse switch: plain decode decides the
      // regime per token (§4.2), a multi-token call once for all its tokens.
      if (C + 1 < dense_len && C + K + 1 >= dense_len) K = std::max<int64_t>(0, dense_len - C - 2);
      K = std::max<int64_t>(K, 0);

      std::vector<int32_t> drafts;
      if (K > 0) {
        engine_.begin_speculation(seq);
        auto hist = engine_.tokens(seq);
        context.assign(hist.begin(), hist.end());
        context.push_back(x0);
        const auto td = Clock::now();
        drafts = drafter_->propose(engine_, seq, context, int(K));
        spec_.draft_seconds += since(td);
        if (int64_t(drafts.size()) > K) drafts.resize(size_t(K));
      }

      const auto tv = Clock::now();
      ++spec_.rounds;
      if (drafts.empty()) {  // a plain decode step
        Engine::Request r{seq, std::span(&x0, 1)};
        auto logits = engine_.step(std::span(&r, 1));
        ++stats_.steps;
        spec_.verify_seconds += since(tv);
        SampledToken tok = sampler.sample(logits[0], engine_.tokens(seq));
        ++spec_.emitted;
        if (!emit(tok, C + 1)) break;
        x0 = tok.id;
        continue;
      }

      verify.assign(1, x0);
      verify.insert(verify.end(), drafts.begin(), drafts.end());
      Engine::Request r{seq, verify, -1, true};
      auto logits = engine_.step(std::span(&r, 1));
      ++stats_.steps;
      spec_.verify_seconds += since(tv);
      spec_.drafted += int64_t(drafts.size());
      const std::vector<float>& all = logits[0];
      const auto hist = engine_.tokens(seq);  // ..., x0, d1..dK
      const bool greedy = req.sampling.temperature == 0.0f;

      int64_t a = 0;
      bool stop = false;
      int32_t next = -1;
      for (size_t i = 0; i <= drafts.size() && !stop; ++i) {
        std::span<const float> row(all.data() + i * size_t(vocab), size_t(vocab));
        std::vector<double> p = sampler.distribution(row, hist.first(size_t(C + 1) + i), &logsm);
        SampledToken tok;
        bool accepted = false;
        if (i < drafts.size()) {
          const int32_t d = drafts[i];
          if (greedy) {
            tok.id = int32_t(std::max_element(p.begin(), p.end()) - p.begin());
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
          tok.id = greedy ? int32_t(std::max_element(p.begin(), p.end()) - p.begin()) : sampler.draw(p);
        }
        tok.logprob = logsm[size_t(tok.id)];
        ++spec_.emitted;
        if (accepted) ++a, ++spec_.accepted;
        if (!emit(tok, C + 1 + int64_t(i))) {
          stats_.decode_seconds += since(t1);
          return done(*finished, seq);
        }
        if (!accepted) {
          next = tok.id;
          stop = true;
        }
      }
      engine_.rollback(seq, C + a + 1);  // keep x0, d1..da
      x0 = next;
    }
    stats_.decode_seconds += since(t1);
    return done(*finished, seq);
  } catch (...) {
    engine_.close(seq);
    throw;
  }
}

}  // namespace sala
