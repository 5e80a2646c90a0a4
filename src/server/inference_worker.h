// The thread that owns the model: it loads it, then steps the continuous-batching Scheduler for
// as long as there is work. HTTP handler threads hand it jobs through a locked inbox and read the
// results from a per-request Channel; the scheduler itself is only ever touched by this thread.
// Detokenization, the <think> split and stop strings run here too (in the token callback), so a
// stop string ends its sequence in the very step that produced it.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "engine/text_stream.h"
#include "model/loader.h"
#include "tokenizer/tokenizer.h"

namespace sala::server {

class Metrics;
using Clock = std::chrono::steady_clock;

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 256;
  bool ignore_eos = false;
  TextStreamOptions text;       // stop strings, think hiding
  bool want_reasoning = false;  // hidden <think> text is sent as reasoning deltas
  bool want_logprobs = false;   // deltas carry their SampledTokens
  Clock::time_point arrival = Clock::now();
};

struct Event {
  enum class Kind { Delta, Finish, Error };
  Kind kind = Kind::Delta;
  std::string content, reasoning;     // Delta
  std::vector<SampledToken> tokens;   // Delta, with want_logprobs
  std::string finish_reason;          // Finish: stop / length / cancelled
  int64_t prompt_tokens = 0, completion_tokens = 0;  // Finish
  int status = 500;                   // Error
  std::string message;                // Error
};

// One request's results, written by the worker, read by its handler. Nothing is accepted after
// the first Finish or Error.
class Channel {
 public:
  explicit Channel(uint64_t ticket) : ticket_(ticket) {}
  uint64_t ticket() const { return ticket_; }
  void push(Event e);
  // Everything queued, waiting up to `timeout` for the first event (may return none).
  std::vector<Event> wait(std::chrono::milliseconds timeout);

 private:
  uint64_t ticket_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  bool closed_ = false;
};

struct WorkerOptions {
  int max_running = 8;             // sequences decoding together
  int64_t ctx_size = 4096;         // tokens per sequence
  int max_queue = 128;             // waiting requests beyond this are refused (429)
  int64_t prefill_chunk = 256;     // prompt tokens per sequence per step
  int64_t max_batch_tokens = 512;  // tokens per step
  SpeculativeOptions speculative;  // --speculative: drafts verified inside the batched steps
  // Tests only (`sala serve --debug-script TEXT`): every request's generated tokens are replaced,
  // as they reach the text stream, by the tokens of this text, and the request stops ("stop")
  // after them; a deterministic way to push e.g. a <think> block through the reasoning split,
  // stop strings and the HTTP formatting, which a random model never emits. Empty: off.
  std::string debug_script;
};

// What the worker owns once loaded. Members are destroyed bottom-up: the model before its backend.
struct ModelBundle {
  std::unique_ptr<Backend> backend;
  LoadedModel model;
  std::unique_ptr<Tokenizer> tokenizer;
};
using Loader = std::function<ModelBundle(const ModelLimits&)>;

class InferenceWorker {
 public:
  enum class State { Loading, Ready, Failed, Stopped };

  InferenceWorker(WorkerOptions options, Metrics& metrics);
  ~InferenceWorker();
  InferenceWorker(const InferenceWorker&) = delete;
  InferenceWorker& operator=(const InferenceWorker&) = delete;

  void start(Loader loader);  // loads on the worker thread, then serves
  State state() const;
  std::string load_error() const;
  bool wait_loaded();  // blocks while Loading; true when Ready

  // Valid once Ready (never change afterwards).
  const Tokenizer& tokenizer() const { return *bundle_.tokenizer; }
  const ModelConfig& config() const { return bundle_.model.config; }
  const std::filesystem::path& model_dir() const { return bundle_.model.dir; }
  const WorkerOptions& options() const { return options_; }

  // Queues a job. ApiError 503 when not ready or stopping, 429 when max_queue requests wait.
  std::shared_ptr<Channel> submit(Job job);
  void cancel(const Channel& channel);  // the request finishes with "cancelled" and frees its caches
  // Stops: queued and running requests end with an Error event (503); joins the thread.
  void shutdown();

 private:
  struct Live;
  struct Pending {
    Job job;
    std::shared_ptr<Channel> channel;
  };
  void main(Loader loader);
  void serve();
  void start_job(Pending& p);
  void fail_all(int status, const std::string& message);
  void publish_gauges();  // needs mu_ (reads the inbox)

  WorkerOptions options_;
  Metrics& metrics_;
  ModelBundle bundle_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<uint64_t, std::shared_ptr<Live>> live_;  // worker thread only
  std::vector<int32_t> script_;  // options_.debug_script, tokenized at load

  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::Loading;
  std::string load_error_;
  bool stopping_ = false;
  std::vector<Pending> inbox_;
  std::vector<uint64_t> cancels_;
  size_t waiting_ = 0;  // accepted, not yet holding a sequence (inbox + scheduler queue)
  uint64_t next_ticket_ = 1;
  std::thread thread_;
};

}  // namespace sala::server
