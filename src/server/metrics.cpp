#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace sala::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

namespace {
// Seconds: from a few milliseconds (tiny models) to minutes (long generations on CPU).
const std::vector<double> kLatencyBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                            5,     10,   20,    40,   80,  160, 320, 640};
}  // namespace

Metrics::Metrics() : ttft_(kLatencyBounds), latency_(kLatencyBounds) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{endpoint, status}];
}
void Metrics::count_finish(const std::string& reason) {
  std::lock_guard lk(mu_);
  ++finishes_[reason];
}
void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += uint64_t(n);
}
void Metrics::add_generated_tokens(int64_t n) {
  std::lock_guard lk(mu_);
  generated_tokens_ += uint64_t(n);
}
void Metrics::observe_ttft(double s) {
  std::lock_guard lk(mu_);
  ttft_.observe(s);
}
void Metrics::observe_latency(double s) {
  std::lock_guard lk(mu_);
  latency_.observe(s);
}
void Metrics::set_queue(int64_t waiting, int64_t running) {
  std::lock_guard lk(mu_);
  waiting_ = waiting;
  running_ = running;
}
void Metrics::set_cache(int64_t sequences_used, int64_t sequences_max, int64_t tokens_used, int64_t tokens_max) {
  std::lock_guard lk(mu_);
  seq_used_ = sequences_used;
  seq_max_ = sequences_max;
  tok_used_ = tokens_used;
  tok_max_ = tokens_max;
}
void Metrics::set_model_loaded(bool loaded) {
  std::lock_guard lk(mu_);
  loaded_ = loaded;
}
void Metrics::set_speculative(const SpeculativeStats& stats) {
  std::lock_guard lk(mu_);
  speculative_ = stats;
}

std::string Metrics::render() const {
  std::lock_guard lk(mu_);
  std::string out;
  auto scalar = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  out += "# HELP sala_requests_total HTTP requests answered, by endpoint and status code.\n"
         "# TYPE sala_requests_total counter\n";
  for (const auto& [k, n] : requests_)
    out += fmt::format("sala_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, n);
  out += "# HELP sala_request_finish_total Generations by finish reason.\n"
         "# TYPE sala_request_finish_total counter\n";
  for (const auto& [reason, n] : finishes_)
    out += fmt::format("sala_request_finish_total{{reason=\"{}\"}} {}\n", reason, n);
  scalar("sala_prompt_tokens_total", "counter", "Prompt tokens of accepted generations.", prompt_tokens_);
  scalar("sala_generation_tokens_total", "counter", "Tokens generated.", generated_tokens_);
  scalar("sala_requests_waiting", "gauge", "Generations accepted but not yet running.", waiting_);
  scalar("sala_requests_running", "gauge", "Generations holding a sequence.", running_);
  scalar("sala_cache_sequences_used", "gauge", "Sequence cache slots in use.", seq_used_);
  scalar("sala_cache_sequences_max", "gauge", "Sequence cache slots.", seq_max_);
  scalar("sala_cache_tokens_used", "gauge", "Tokens held in sequence caches (prompt prefilled + generated).",
         tok_used_);
  scalar("sala_cache_tokens_max", "gauge", "Token capacity of the caches.", tok_max_);
  scalar("sala_cache_usage_ratio", "gauge", "cache_tokens_used / cache_tokens_max.",
         tok_max_ > 0 ? double(tok_used_) / double(tok_max_) : 0.0);
  scalar("sala_model_loaded", "gauge", "1 once the model is loaded and serving.", loaded_ ? 1 : 0);
  const SpeculativeStats& sp = speculative_;
  scalar("sala_speculative_verify_steps_total", "counter",
         "Speculative verify rounds (one sequence's [x0, drafts] checked by one forward).", sp.rounds);
  scalar("sala_speculative_draft_tokens_total", "counter", "Draft tokens verified.", sp.drafted);
  scalar("sala_speculative_accepted_tokens_total", "counter", "Draft tokens accepted.", sp.accepted);
  scalar("sala_speculative_emitted_tokens_total", "counter",
         "Tokens emitted by verify rounds (accepted drafts + corrections/bonuses).", sp.emitted);
  out += "# HELP sala_speculative_skipped_steps_total Decode steps of a sequence without drafts, by reason.\n"
         "# TYPE sala_speculative_skipped_steps_total counter\n";
  for (int r = 0; r < kDraftSkipReasons; ++r)
    out += fmt::format("sala_speculative_skipped_steps_total{{reason=\"{}\"}} {}\n", draft_skip_name(DraftSkip(r)),
                       sp.skipped[size_t(r)]);
  ttft_.render(out, "sala_time_to_first_token_seconds", "Time from request arrival to the first generated token.");
  latency_.render(out, "sala_request_latency_seconds", "Time from request arrival to the end of the generation.");
  return out;
}

}  // namespace sala::server
