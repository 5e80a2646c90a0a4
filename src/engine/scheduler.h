// Continuous batching: one scheduler owns the engine; every running request decodes in the same
// step, and waiting prompts are prefilled in chunks inside the same packed batch, so a long
// prompt never stalls streams already running. With speculative options, every decoding sequence
// drafts up to K tokens first and the step's one packed forward verifies them all (together with
// the prompt chunks; docs/speculative.md). `sala generate`, `batch`, `chat` and `serve` all drive
// the model through this class.
#pragma once
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/speculative.h"

namespace sala {

enum class FinishReason { Stop, Length, Cancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled"

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 256;
  bool ignore_eos = false;
  // Called for each generated token; return false to finish with "stop" (stop strings) — the token
  // itself is kept. Called on the scheduler's thread.
  std::function<bool(const SampledToken&)> on_token;
  std::function<void(FinishReason)> on_finish;
};

struct SchedulerOptions {
  int64_t prefill_chunk = 256;     // prompt tokens per sequence per step
  int64_t max_batch_tokens = 512;  // all tokens of one step (decode rows + drafts + prefill chunks)
  // Off by default. On, the model's max_logit_rows bounds the verify rows of a step (each
  // drafting sequence K + 1); it must leave room for one full verify next to every other sequence.
  SpeculativeOptions speculative;
};

struct SchedulerStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // wall time of steps with / without prompt work
  int64_t steps = 0;
  SpeculativeStats speculative;  // all zero unless the scheduler speculates
};

class Scheduler {
 public:
  Scheduler(Engine& engine, SchedulerOptions options);
  // Queues a request; throws sala::Error when the prompt cannot fit the context.
  int submit(GenerationRequest request);
  void cancel(int id);   // finishes it with Cancelled at the next step; unknown ids are ignored
  bool step();           // one packed forward (after the draft forwards); false when there was nothing to do
  void run();            // steps until every request has finished
  bool idle() const { return waiting_.empty() && active_.empty(); }
  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return active_.size(); }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerOptions& options() const { return options_; }  // draft_layers clamped to the model
  bool speculative() const { return drafter_ != nullptr; }
  Engine& engine() { return engine_; }

 private:
  struct Active {
    int id;
    GenerationRequest req;
    int seq = -1;
    int64_t prefilled = 0;     // prompt tokens already in the cache
    int32_t pending = -1;      // sampled, not yet fed
    int generated = 0;
    std::optional<Sampler> sampler;
    bool cancelled = false;
    std::vector<int32_t> verify;  // this step's [x0, d1..dK] (speculation)
    int draft_k = 0;              // adaptive K: this sequence's next k (0: not started yet)
  };
  void finish(Active& a, FinishReason why);
  // Reports one token chosen after `fed` tokens were in the sequence; false when that finished it
  // (EOS, on_token returning false, max_tokens, the context end).
  bool deliver(Active& a, const SampledToken& tok, int64_t fed);
  // Drafts for the decoding sequences (indices into active_) within the logit rows and batch tokens
  // left for drafts; fills Active::verify ([x0, d1..dK]) of those with drafts.
  void draft(const std::vector<size_t>& decoding, int64_t rows_left, int64_t tokens_left);

  Engine& engine_;
  SchedulerOptions options_;
  std::deque<Active> waiting_;
  std::vector<Active> active_;
  std::vector<int> cancel_requests_;
  int next_id_ = 0;
  SchedulerStats stats_;
  std::unique_ptr<Drafter> drafter_;  // null: no speculation
  int64_t capture_rows_ = 0;          // lightning k/v rows the verify forward captures
};

}  // namespace sala
