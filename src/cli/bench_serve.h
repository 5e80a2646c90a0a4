// `sala bench --serve URL`: throughput and latency of a running `sala serve` (issue #7). At each
// concurrency level, that many clients send streaming /v1/completions requests back to back
// (closed loop) with prompts of exactly --prompt-tokens token ids and ignore_eos, so every request
// generates --max-tokens tokens. Per request: TTFT (request sent to the first SSE token chunk),
// latency (to [DONE]) and decode tok/s after the first token; per level: aggregate output tok/s.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sala::cli {

struct ServeBenchOptions {
  std::string url;
  std::vector<int64_t> concurrency{1, 8, 32};
  int64_t requests = 0;  // per level; 0: 2 x concurrency
  int64_t prompt_tokens = 512, max_tokens = 128;
  int warmup = 1;        // untimed requests before the first level
  double timeout_s = 600;
  std::string json;      // write the levels here
};

// Prints a table to stdout; returns 0, or 1 when any request failed (each failure is reported).
int run_serve_bench(const ServeBenchOptions& options);

}  // namespace sala::cli
