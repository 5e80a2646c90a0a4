// Speculative decoding with exact rollback (spec §6, docs/speculative.md): the parts the
// continuous-batching Scheduler uses to speculate for every decoding sequence of a step — the
// options, the drafters (which propose up to K tokens per sequence), the per-sequence draft length
// (context, max_tokens, the dense/sparse boundary), the acceptance rule, and the statistics.
// The Scheduler verifies [x0, d1..dK] of every drafting sequence in its one packed forward and cuts
// each sequence back with Engine::rollback — KV pages as bookkeeping, lightning states exactly
// (γ^keep · snapshot + Σ k⊗v). Greedy output is identical to plain greedy decoding; with
// temperature > 0 the acceptance rule (accept d with probability p(d), else sample the residual
// p − δ_d renormalised) emits exact samples of the target distribution, since both drafters are
// deterministic (q = point mass).
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"

namespace sala {

enum class SpeculativeMode { Off, Self, Lookup };
// "" / "off" / "none" -> Off, "self", "lookup"; anything else throws sala::Error.
SpeculativeMode parse_speculative_mode(const std::string& name);
const char* speculative_mode_name(SpeculativeMode mode);

struct SpeculativeOptions {
  SpeculativeMode mode = SpeculativeMode::Off;
  int draft_layers = 8;   // self-draft: first N layers + final norm + lm_head (clamped to num_layers)
  int draft_tokens = 4;   // K: tokens drafted per sequence and step (1..32); adaptive: the largest K
  // Adaptive K (--adaptive-draft): each sequence drafts k_s tokens, 1 <= k_s <= draft_tokens,
  // starting at min(4, draft_tokens) and moved after every verify round by adapt_draft_tokens().
  bool adaptive = false;
  void validate() const;  // throws sala::Error naming the flag
};

// The adaptive-K rule (docs/speculative.md, "Adaptive K"): after a verify round of `drafted` draft
// tokens of which `accepted` were accepted, a sequence that drafted `k` tokens next drafts
//   k + 1 (at most max_k)  when every draft was accepted,
//   k - 1 (at least 1)     when fewer than half were accepted (2 * accepted < drafted),
//   k                      otherwise.
int adapt_draft_tokens(int k, int drafted, int accepted, int max_k);
inline constexpr int kAdaptiveStartTokens = 4;  // first k of a sequence: min(4, max_k)

// One sequence's drafting request. x0 is the sequence's last emitted token, not yet in its caches.
struct DraftJob {
  int seq = -1;
  int32_t x0 = 0;
  int k = 0;                    // most tokens to propose (>= 1)
  std::vector<int32_t> drafts;  // out: at most k tokens (none: nothing to propose)
};

// Proposes draft tokens for several sequences at once.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // True when propose() runs forwards on the sequences: Engine::begin_speculation must have been
  // called for every job's sequence at its current length, and propose() leaves each sequence as
  // it found it (Engine::rollback).
  virtual bool runs_forwards() const = 0;
  virtual void propose(Engine& engine, std::span<DraftJob> jobs) = 0;
  // The sequence was closed (its id may be reused for another request): drop what is kept for it.
  virtual void forget(int /*seq*/) {}
};

// Self-draft (spec §6.1/§6.2): the first N layers run on the real caches, greedy, K rounds of one
// packed forward over every job's sequence; then each sequence is rolled back to where it was.
class SelfDrafter final : public Drafter {
 public:
  explicit SelfDrafter(int layers) : layers_(layers) {}
  bool runs_forwards() const override { return true; }
  void propose(Engine& engine, std::span<DraftJob> jobs) override;

 private:
  int layers_;
};

// The incremental form of LookupDrafter::lookup for one growing sequence: an index of every
// n-gram (n = 1..3) of the history to its most recent start, extended by the tokens appended since
// the last call, so one proposal costs O(new tokens + k), not O(context). propose(history, x0, k)
// equals lookup(history + x0, k) for any history that extends the previous one; a history that does
// not (shorter, or a different token where the last one was) rebuilds the index.
// Memory: three hash maps of at most `history` entries each (distinct n-grams only).
class LookupIndex {
 public:
  std::vector<int32_t> propose(std::span<const int32_t> history, int32_t x0, int k);
  int64_t indexed() const { return indexed_; }  // history tokens consumed so far
  int64_t rebuilds() const { return rebuilds_; }

 private:
  struct Key {
    int32_t t[3];
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const noexcept;
  };
  void extend(std::span<const int32_t> history);
  std::unordered_map<Key, int64_t, KeyHash> last_[3];  // n-gram of n = i + 1 -> its latest start
  int64_t indexed_ = 0;   // tokens of the history whose n-grams (ending there) are indexed
  int32_t last_token_ = -1;
  int64_t rebuilds_ = 0;
};

// Prompt lookup: the continuation of the most recent earlier occurrence of the longest suffix
// n-gram of the sequence + x0 (n = 3, 2, 1). No forward at all; proposes nothing without a match.
// Keeps one LookupIndex per sequence (incremental: the cost per step does not grow with the
// context); forget(seq) drops it.
class LookupDrafter final : public Drafter {
 public:
  bool runs_forwards() const override { return false; }
  void propose(Engine& engine, std::span<DraftJob> jobs) override;
  void forget(int seq) override { index_.erase(seq); }
  // The reference (a scan of the whole context): what LookupIndex::propose must equal.
  static std::vector<int32_t> lookup(std::span<const int32_t> context, int k, int max_ngram = 3);

 private:
  std::unordered_map<int, LookupIndex> index_;
};

// Why a decoding sequence ran a step without drafts.
enum class DraftSkip {
  End,       // its next token is its last (max_tokens or the context end): nothing to verify
  Boundary,  // one more token reaches dense_len: a verify call would straddle the regime switch
  Budget,    // the step's logit rows or batch tokens were used up by other sequences
  NoMatch,   // the drafter proposed nothing (lookup: no earlier n-gram)
};
inline constexpr int kDraftSkipReasons = 4;
const char* draft_skip_name(DraftSkip why);  // "end", "boundary", "budget", "no_match"

// The most draft tokens (<= k) a sequence of `length` cached tokens, with x0 pending, may verify
// this step: the round emits at most K + 1 tokens, so K + 1 stays within `tokens_left` (max_tokens
// minus generated) and within the context; and the verify call (regime decided once, for all its
// tokens) must not straddle dense_len, where plain decode switches regime per token (spec §4.2).
// 0 with `why` set when no draft fits.
int max_draft_tokens(int64_t length, int64_t max_context, int64_t tokens_left, int64_t dense_len, int k,
                     DraftSkip* why);

// The outcome of one verify round of a sequence.
struct Verdict {
  std::vector<SampledToken> tokens;  // the accepted drafts, then one correction or bonus token
  int accepted = 0;
};
// The acceptance rule (docs/speculative.md, "Accept"). `logits`: the K + 1 verify rows; row i
// predicts the token after x0, d1..di. `tokens`: the sequence after the verify forward, ending
// with x0, d1..dK (penalties of row i see the history up to di). Greedy: accept while the argmax
// equals the draft, then the argmax as correction or bonus. Temperature > 0: accept d with
// probability p_i(d), else a sample of the residual. Uses (and advances) the request's sampler.
Verdict accept_drafts(Sampler& sampler, std::span<const float> logits, std::span<const int32_t> drafts,
                      std::span<const int32_t> tokens);

struct SpeculativeStats {
  int64_t rounds = 0;    // sequence verify rounds ([x0, d1..dK] of one sequence in one forward)
  int64_t drafted = 0;   // draft tokens verified
  int64_t accepted = 0;  // draft tokens accepted
  int64_t emitted = 0;   // tokens emitted by verify rounds (accepted + corrections/bonuses)
  int64_t all_accepted = 0;     // rounds that accepted every draft (their last token is the bonus)
  int64_t partly_accepted = 0;  // rounds that accepted some drafts, then rejected one
  std::array<int64_t, kDraftSkipReasons> skipped{};  // decode steps without drafts, by DraftSkip
  double draft_seconds = 0;   // snapshots + drafting
  double verify_seconds = 0;  // forwards that verified drafts (prompt chunks packed with them included)
  int64_t skipped_total() const;
  double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
  double tokens_per_round() const { return rounds > 0 ? double(emitted) / double(rounds) : 0.0; }
};

}  // namespace sala
