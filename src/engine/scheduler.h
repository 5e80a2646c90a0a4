// Continuous batching: one scheduler owns the engine; every running request decodes in the same
// step, and waiting prompts are prefilled in chunks inside the same packed batch, so a long
// prompt never stalls streams already running. `sala generate`, `batch`, `chat` and `serve` all
// drive the model through this class.
#pragma once
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"

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
  int64_t max_batch_tokens = 512;  // all tokens of one step (decode rows + prefill chunks)
};

struct SchedulerStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // wall time of steps with / without prompt work
  int64_t steps = 0;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, SchedulerOptions options);
  // Queues a request; throws sala::Error when the prompt cannot fit the context.
  int submit(GenerationRequest request);
  void cancel(int id);   // finishes it with Cancelled at the next step; unknown ids are ignored
  bool step();           // one packed forward; false when there was nothing to do
  void run();            // steps until every request has finished
  bool idle() const { return waiting_.empty() && active_.empty(); }
  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return active_.size(); }
  const SchedulerStats& stats() const { return stats_; }
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
  };
  void finish(Active& a, FinishReason why);

  Engine& engine_;
  SchedulerOptions options_;
  std::deque<Active> waiting_;
  std::vector<Active> active_;
  std::vector<int> cancel_requests_;
  int next_id_ = 0;
  SchedulerStats stats_;
};

}  // namespace sala
