// Server metrics in the Prometheus text format (GET /metrics). All names start with "sala_":
//   requests_total{endpoint,status}         counter, every HTTP request answered
//   request_finish_total{reason}            counter, generations by finish reason (stop/length/cancelled/error)
//   prompt_tokens_total, generation_tokens_total  counters
//   requests_waiting, requests_running     gauges (waiting: accepted, not yet holding a sequence)
//   cache_sequences_used / _max, cache_tokens_used / _max, cache_usage_ratio  gauges
//   time_to_first_token_seconds, request_latency_seconds  histograms (arrival -> first token / finish)
//   model_loaded                            gauge, 1 once the model serves
//   speculative_verify_steps_total          counter, sequence verify rounds ([x0, drafts] in one forward)
//   speculative_draft_tokens_total, speculative_accepted_tokens_total  counters (acceptance = ratio)
//   speculative_emitted_tokens_total        counter, tokens emitted by verify rounds (/ verify steps =
//                                           tokens per verify step)
//   speculative_skipped_steps_total{reason} counter, decode steps without drafts (end/boundary/budget/no_match)
// The speculative counters stay 0 unless the server runs with --speculative.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/speculative.h"

namespace sala::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last one is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& endpoint, int status);
  void count_finish(const std::string& reason);
  void add_prompt_tokens(int64_t n);
  void add_generated_tokens(int64_t n);
  void observe_ttft(double seconds);
  void observe_latency(double seconds);
  void set_queue(int64_t waiting, int64_t running);
  void set_cache(int64_t sequences_used, int64_t sequences_max, int64_t tokens_used, int64_t tokens_max);
  void set_model_loaded(bool loaded);
  void set_speculative(const SpeculativeStats& stats);  // the scheduler's running totals
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finishes_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  int64_t waiting_ = 0, running_ = 0;
  int64_t seq_used_ = 0, seq_max_ = 0, tok_used_ = 0, tok_max_ = 0;
  bool loaded_ = false;
  SpeculativeStats speculative_;
  Histogram ttft_, latency_;
};

}  // namespace sala::server
