#include "cli/bench_timing.h"

#include <algorithm>

#include "core/error.h"

namespace sala::cli {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double prefill_to(Engine& e, Backend& backend, int seq, int64_t length, int64_t chunk, const TokenSource& token) {
  SALA_CHECK(chunk > 0, "bench: --chunk must be positive, got {}", chunk);
  double t = 0;
  while (e.length(seq) < length) {
    std::vector<int32_t> part(static_cast<size_t>(std::min(chunk, length - e.length(seq))));
    for (auto& x : part) x = token();
    Engine::Request r{seq, part, -1, false, e.length(seq) + int64_t(part.size()) == length};
    const auto t0 = BenchClock::now();
    e.step(std::span(&r, 1));
    backend.synchronize();
    t += seconds_since(t0);
  }
  return t;
}

DecodeTiming time_decode_steps(Engine& e, Backend& backend, std::span<const int> seqs, int steps,
                               const TokenSource& token, const std::function<void()>& before_timed_step) {
  std::vector<double> t;
  Backend::GraphStats g0;
  for (int i = 0; i < steps + 2; ++i) {
    std::vector<std::vector<int32_t>> next(seqs.size());
    std::vector<Engine::Request> reqs;
    for (size_t k = 0; k < seqs.size(); ++k) {
      next[k] = {token()};
      reqs.push_back({seqs[k], next[k]});
    }
    if (i == 2) g0 = backend.graph_stats();
    if (i >= 2 && before_timed_step) before_timed_step();
    const auto t0 = BenchClock::now();
    e.step(reqs);
    if (i >= 2) t.push_back(seconds_since(t0));
  }
  const Backend::GraphStats g1 = backend.graph_stats();
  return {median(t), (g1.gpu_ms - g0.gpu_ms) / double(std::max(steps, 1)), g1.replays - g0.replays};
}

}  // namespace sala::cli
