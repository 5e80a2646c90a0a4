// Speculative decoding with exact rollback (spec §6, docs/speculative.md): a drafter proposes up
// to K tokens, the full model verifies [x0, d1..dK] in ONE multi-token forward on the real caches,
// the accepted prefix plus a correction/bonus token is emitted, and Engine::rollback cuts the
// caches back — KV pages as bookkeeping, lightning states exactly (γ^keep · snapshot + Σ k⊗v).
// Greedy output is identical to plain greedy decoding; with temperature > 0 the acceptance rule
// (accept d with probability p(d), else sample the residual p − δ_d renormalised) emits exact
// samples of the target distribution, since both drafters are deterministic (q = point mass).
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"

namespace sala {

enum class SpeculativeMode { Off, Self, Lookup };
// "" / "off" / "none" -> Off, "self", "lookup"; anything else throws sala::Error.
SpeculativeMode parse_speculative_mode(const std::string& name);
const char* speculative_mode_name(SpeculativeMode mode);

struct SpeculativeOptions {
  SpeculativeMode mode = SpeculativeMode::Self;
  int draft_layers = 8;   // self-draft: first N layers + final norm + lm_head (clamped to num_layers)
  int draft_tokens = 4;   // K: tokens drafted per round (1..32)
};

// Proposes draft tokens for a sequence. `context` is every token of the sequence so far followed
// by x0, the last emitted token, which is not yet in the caches. A drafter may run forwards on
// the sequence (Engine::begin_speculation has been called at the current length) but must leave
// it as it found it (Engine::rollback).
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::vector<int32_t> propose(Engine& engine, int seq, std::span<const int32_t> context, int k) = 0;
};

// Self-draft (spec §6.1/§6.2): the first N layers run autoregressively on the real caches, greedy,
// one token per forward; then the sequence is rolled back to where it was.
class SelfDrafter final : public Drafter {
 public:
  explicit SelfDrafter(int layers) : layers_(layers) {}
  std::vector<int32_t> propose(Engine& engine, int seq, std::span<const int32_t> context, int k) override;

 private:
  int layers_;
};

// Prompt lookup: the continuation of the most recent earlier occurrence of the longest suffix
// n-gram of the context (n = 3, 2, 1). No forward at all; proposes nothing without a match.
class LookupDrafter final : public Drafter {
 public:
  std::vector<int32_t> propose(Engine& engine, int seq, std::span<const int32_t> context, int k) override;
  static std::vector<int32_t> lookup(std::span<const int32_t> context, int k, int max_ngram = 3);
};

struct SpeculativeStats {
  int64_t rounds = 0;       // verify forwards (a round without drafts is a plain decode step)
  int64_t drafted = 0;      // draft tokens proposed
  int64_t accepted = 0;     // draft tokens accepted
  int64_t emitted = 0;      // tokens emitted by rounds (accepted + corrections/bonuses)
  double draft_seconds = 0, verify_seconds = 0;
  double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
  double tokens_per_round() const { return rounds > 0 ? double(emitted) / double(rounds) : 0.0; }
};

// Runs requests one at a time on their own sequence of the engine (prompt prefill in chunks, the
// first token from the prefill logits, then speculative rounds), with the same callbacks, stop
// rules (EOS, on_token returning false, max_tokens, context) and statistics as Scheduler.
class SpeculativeGenerator {
 public:
  SpeculativeGenerator(Engine& engine, SpeculativeOptions options, SchedulerOptions scheduling = {});
  FinishReason run(GenerationRequest request);
  const SchedulerStats& stats() const { return stats_; }
  const SpeculativeStats& spec_stats() const { return spec_; }
  const SpeculativeOptions& options() const { return options_; }

 private:
  Engine& engine_;
  SpeculativeOptions options_;
  SchedulerOptions scheduling_;
  std::unique_ptr<Drafter> drafter_;
  SchedulerStats stats_;
  SpeculativeStats spec_;
};

}  // namespace sala
