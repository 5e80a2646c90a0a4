// The timing loops `sala bench` rows share (cmd_bench.cpp, bench_compare.cpp): prefill a sequence
// to a length in chunks, and time decode steps after warm-ups.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"

namespace sala::cli {

using BenchClock = std::chrono::steady_clock;
inline double seconds_since(BenchClock::time_point t0) {
  return std::chrono::duration<double>(BenchClock::now() - t0).count();
}
double median(std::vector<double> v);

// A token for the next position (random ids: the benchmarks' inputs).
using TokenSource = std::function<int32_t()>;

// Prefills sequence `seq` of `e` up to `length` tokens in forwards of at most `chunk` tokens (the
// last one asks for logits); the seconds it took, device work included.
double prefill_to(Engine& e, Backend& backend, int seq, int64_t length, int64_t chunk, const TokenSource& token);

struct DecodeTiming {
  double step_s = 0;       // median wall time of a step (Engine::step returns host logits: device work done)
  double gpu_ms = 0;       // device time per step from the backend's events (0 where it keeps none)
  int64_t replays = 0;     // timed steps that replayed a CUDA graph
};
// Times `steps` decode steps of `seqs` (one new token each per step) after 2 warm-up steps.
// before_timed_step runs just before each timed step starts (kernel-trace marks).
DecodeTiming time_decode_steps(Engine& e, Backend& backend, std::span<const int> seqs, int steps,
                               const TokenSource& token, const std::function<void()>& before_timed_step = {});

}  // namespace sala::cli
