#include "server/inference_worker.h"

#include <algorithm>

#include "core/error.h"
#include "server/api_error.h"
#include "server/metrics.h"

namespace sala::server {

void Channel::push(Event e) {
  {
    std::lock_guard lk(mu_);
    if (closed_) return;
    if (e.kind != Event::Kind::Delta) closed_ = true;
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

std::vector<Event> Channel::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !events_.empty(); });
  std::vector<Event> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

// A request inside the scheduler (worker thread only).
struct InferenceWorker::Live {
  Live(const Tokenizer& tok, Job&& j, std::shared_ptr<Channel> c)
      : channel(std::move(c)), text(tok, std::move(j.text)), want_reasoning(j.want_reasoning),
        want_logprobs(j.want_logprobs), prompt_tokens(int64_t(j.prompt.size())), arrival(j.arrival) {}
  std::shared_ptr<Channel> channel;
  TextStream text;
  bool want_reasoning, want_logprobs;
  int64_t prompt_tokens, generated = 0;
  Clock::time_point arrival;
  int sched_id = -1;
  size_t script_pos = 0;     // --debug-script: next scripted token
  bool script_done = false;  // --debug-script: ended after the script
};

InferenceWorker::InferenceWorker(WorkerOptions options, Metrics& metrics) : options_(options), metrics_(metrics) {
  SALA_CHECK(options.max_running > 0, "--max-running must be positive");
  SALA_CHECK(options.ctx_size > 1, "--ctx-size must be at least 2");
  SALA_CHECK(options.max_queue >= 0, "--max-queue must be >= 0");
  options.speculative.validate();
}

InferenceWorker::~InferenceWorker() { shutdown(); }

void InferenceWorker::start(Loader loader) {
  thread_ = std::thread([this, loader = std::move(loader)]() mutable { main(std::move(loader)); });
}

InferenceWorker::State InferenceWorker::state() const {
  std::lock_guard lk(mu_);
  return state_;
}

std::string InferenceWorker::load_error() const {
  std::lock_guard lk(mu_);
  return load_error_;
}

bool InferenceWorker::wait_loaded() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return state_ != State::Loading; });
  return state_ == State::Ready;
}

std::shared_ptr<Channel> InferenceWorker::submit(Job job) {
  std::shared_ptr<Channel> ch;
  {
    std::lock_guard lk(mu_);
    if (stopping_ || state_ == State::Stopped) throw ApiError(503, "the server is shutting down");
    if (state_ == State::Loading) throw ApiError(503, "the model is still loading", "", "model_loading");
    if (state_ == State::Failed) throw ApiError(503, "the model failed to load: " + load_error_);
    if (waiting_ >= size_t(options_.max_queue))
      throw ApiError(429,
                     fmt::format("server overloaded: {} requests are already waiting (--max-queue); retry later",
                                 waiting_),
                     "", "server_overloaded");
    ch = std::make_shared<Channel>(next_ticket_++);
    inbox_.push_back({std::move(job), ch});
    ++waiting_;
  }
  cv_.notify_all();
  return ch;
}

void InferenceWorker::cancel(const Channel& channel) {
  {
    std::lock_guard lk(mu_);
    cancels_.push_back(channel.ticket());
  }
  cv_.notify_all();
}

void InferenceWorker::shutdown() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void InferenceWorker::main(Loader loader) {
  try {
    ModelLimits limits;
    limits.max_batch_tokens = options_.max_batch_tokens;
    // Each step returns at most one logits row per running sequence; speculating, every running
    // sequence may verify K drafts (K + 1 rows) in the same step.
    const bool spec = options_.speculative.mode != SpeculativeMode::Off;
    limits.max_logit_rows = int64_t(options_.max_running) * (spec ? options_.speculative.draft_tokens + 1 : 1);
    bundle_ = loader(limits);
    SALA_CHECK(bundle_.model.model && bundle_.tokenizer, "model loader returned no model");
    if (!options_.debug_script.empty()) script_ = bundle_.tokenizer->encode(options_.debug_script, false);
    engine_ = std::make_unique<Engine>(*bundle_.model.model,
                                       EngineOptions{.max_sequences = options_.max_running, .max_context = options_.ctx_size});
    scheduler_ = std::make_unique<Scheduler>(
        *engine_, SchedulerOptions{.prefill_chunk = options_.prefill_chunk,
                                   .max_batch_tokens = options_.max_batch_tokens,
                                   .speculative = options_.speculative});
  } catch (const std::exception& e) {
    {
      std::lock_guard lk(mu_);
      state_ = State::Failed;
      load_error_ = e.what();
    }
    cv_.notify_all();
    return;
  }
  {
    std::lock_guard lk(mu_);
    state_ = State::Ready;
  }
  metrics_.set_model_loaded(true);
  {
    std::lock_guard lk(mu_);
    publish_gauges();
  }
  cv_.notify_all();
  serve();
  {
    std::lock_guard lk(mu_);
    state_ = State::Stopped;
  }
  metrics_.set_model_loaded(false);
  cv_.notify_all();
}

void InferenceWorker::start_job(Pending& p) {
  auto live = std::make_shared<Live>(*bundle_.tokenizer, std::move(p.job), p.channel);
  GenerationRequest req;
  req.prompt = std::move(p.job.prompt);
  req.sampling = p.job.sampling;
  req.max_tokens = p.job.max_tokens;
  req.ignore_eos = p.job.ignore_eos || !script_.empty();  // a script ends where it ends
  const uint64_t ticket = p.channel->ticket();
  Live* l = live.get();  // the callbacks live inside the scheduler, which never outlives live_'s entry
  req.on_token = [this, l](const SampledToken& sampled) {
    const SampledToken* t = &sampled;
    SampledToken scripted;
    if (!script_.empty()) {
      if (l->script_pos >= script_.size()) {
        l->script_done = true;  // the script is over: stop, dropping this (model) token
        return false;
      }
      scripted = sampled;
      scripted.id = script_[l->script_pos++];
      t = &scripted;
    }
    const SampledToken& tok = *t;
    if (l->generated++ == 0)
      metrics_.observe_ttft(std::chrono::duration<double>(Clock::now() - l->arrival).count());
    metrics_.add_generated_tokens(1);
    Event e;
    e.content = l->text.push(tok.id);
    if (l->want_reasoning) e.reasoning = l->text.reasoning();
    if (l->want_logprobs) e.tokens.push_back(tok);
    if (!e.content.empty() || !e.reasoning.empty() || !e.tokens.empty()) l->channel->push(std::move(e));
    return !l->text.stopped();
  };
  req.on_finish = [this, l, ticket](FinishReason why) {
    if (why != FinishReason::Cancelled) {
      Event e;
      e.content = l->text.finish();
      if (l->want_reasoning) e.reasoning = l->text.reasoning();
      if (!e.content.empty() || !e.reasoning.empty()) l->channel->push(std::move(e));
    }
    // The EOS token is not passed to on_token but is a generated token (as vLLM counts it).
    if (why == FinishReason::Stop && !l->text.stopped() && !l->script_done) {
      ++l->generated;
      metrics_.add_generated_tokens(1);
    }
    Event f;
    f.kind = Event::Kind::Finish;
    f.finish_reason = finish_reason_name(why);
    f.prompt_tokens = l->prompt_tokens;
    f.completion_tokens = l->generated;
    l->channel->push(std::move(f));
    metrics_.count_finish(finish_reason_name(why));
    metrics_.observe_latency(std::chrono::duration<double>(Clock::now() - l->arrival).count());
    live_.erase(ticket);  // last: destroys *l (the scheduler holds no other reference to it)
  };
  try {
    live->sched_id = scheduler_->submit(std::move(req));
  } catch (const Error& e) {
    Event err;
    err.kind = Event::Kind::Error;
    err.status = 400;
    err.message = e.what();
    p.channel->push(std::move(err));
    std::lock_guard lk(mu_);
    --waiting_;
    return;
  }
  metrics_.add_prompt_tokens(live->prompt_tokens);
  live_.emplace(ticket, std::move(live));
}

void InferenceWorker::fail_all(int status, const std::string& message) {
  for (auto& [ticket, l] : live_) {
    Event e;
    e.kind = Event::Kind::Error;
    e.status = status;
    e.message = message;
    l->channel->push(std::move(e));  // closes the channel: the Finish that follows is dropped
    scheduler_->cancel(l->sched_id);
  }
}

void InferenceWorker::publish_gauges() {
  metrics_.set_speculative(scheduler_->stats().speculative);
  const int64_t running = int64_t(scheduler_->running());
  // Tokens in the caches, from what the worker sees: a request that has produced tokens holds its
  // prompt and all but its newest token; one still prefilling is not counted.
  int64_t tokens = 0;
  for (const auto& [t, l] : live_)
    if (l->generated > 0) tokens += l->prompt_tokens + l->generated - 1;
  metrics_.set_queue(int64_t(scheduler_->waiting()) + int64_t(inbox_.size()), running);
  metrics_.set_cache(running, options_.max_running, tokens, int64_t(options_.max_running) * options_.ctx_size);
}

void InferenceWorker::serve() {
  for (;;) {
    std::vector<Pending> jobs;
    std::vector<uint64_t> cancels;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || !scheduler_->idle(); });
      if (stopping_) break;
      jobs.swap(inbox_);
      cancels.swap(cancels_);
    }
    for (auto& p : jobs) start_job(p);
    for (uint64_t t : cancels)
      if (auto it = live_.find(t); it != live_.end()) scheduler_->cancel(it->second->sched_id);
    try {
      scheduler_->step();
    } catch (const std::exception& e) {
      // The step's state is unknown: end every request rather than risk wrong output.
      fail_all(500, fmt::format("inference failed: {}", e.what()));
    }
    {
      std::lock_guard lk(mu_);
      waiting_ = scheduler_->waiting() + inbox_.size();
      publish_gauges();
    }
  }

  // Shutdown: refuse what is queued, end what runs, and free the caches.
  std::vector<Pending> jobs;
  {
    std::lock_guard lk(mu_);
    jobs.swap(inbox_);
  }
  for (auto& p : jobs) {
    Event e;
    e.kind = Event::Kind::Error;
    e.status = 503;
    e.message = "the server is shutting down";
    p.channel->push(std::move(e));
  }
  fail_all(503, "the server is shutting down");
  for (int i = 0; i < 4 && !scheduler_->idle(); ++i) {
    try {
      scheduler_->step();
    } catch (const std::exception&) {
      break;
    }
  }
  std::lock_guard lk(mu_);
  waiting_ = 0;
  publish_gauges();
}

}  // namespace sala::server
