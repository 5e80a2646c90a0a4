// `sala bench --speculative-costs` (docs/speculative.md, "Costs"): at batch 1 and each context,
//   decode     one plain decode step (lightning k/v capture off, so CUDA graphs replay as in plain
//              serving);
//   verify(K)  one speculative verify of K + 1 tokens as Engine does it: the state snapshot
//              (begin_speculation), the full-model forward with all K + 1 logit rows, and the
//              exact rollback that keeps K of them (keep = K: the largest rollback that does work;
//              keeping all K + 1 needs none);
//   draft      one self-draft forward of the first N layers (+ final norm + lm_head), capture off as
//              in the Scheduler's draft forwards, and the keep-0 rollback (state copy) that ends a
//              draft pass;
// then predicts the speedup for acceptance rate a (i.i.d. per draft token): a round emits
// E = (1 − a^{K+1}) / (1 − a) tokens and costs K·draft + restore + verify(K) (self) or verify(K)
// (lookup, whose drafting is a host-side n-gram search, ~0), against E plain decode steps.
// The sequence is returned to the same length after every verify/draft measurement (rollback to
// the snapshot), so all K are measured at the same context.
#include "cli/bench_speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "engine/engine.h"

namespace sala::cli {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  SALA_CHECK(!v.empty(), "speculative costs: no timed runs");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr int kWarmup = 2;
constexpr double kAcceptance[] = {0.5, 0.7, 0.9};

// Expected tokens emitted by a round of K drafts at acceptance rate a (accepted prefix + 1).
double expected_tokens(double a, int K) { return (1.0 - std::pow(a, K + 1)) / (1.0 - a); }

}  // namespace

void SpeculativeCostOptions::add(CLI::App& app) {
  const char* group = "Speculative decoding costs";
  app.add_flag("--speculative-costs", on,
               "instead of the speed table: cost of speculative verify (K = 1..--max-draft-tokens) and self-draft "
               "forwards against a decode step at batch 1 and each --contexts (--decode-steps runs each), with "
               "predicted speedups")
      ->group(group);
  app.add_option("--draft-layers", draft_layers, "with --speculative-costs: self-draft layers (clamped to the model)")
      ->group(group)
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-draft-tokens", max_draft_tokens, "with --speculative-costs: largest K measured (1..32)")
      ->group(group)
      ->capture_default_str()
      ->check(CLI::Range(1, 32));
}

int run_speculative_costs(Model& model, const std::string& model_name, const SpeculativeCostOptions& o,
                          const std::vector<int64_t>& contexts, int64_t chunk, int reps, uint64_t seed,
                          const std::string& json_path) {
  const ModelConfig& c = model.config();
  Backend& be = model.backend();
  const int kmax = o.max_draft_tokens;
  const int n_draft = std::min(o.draft_layers, c.num_layers);
  SALA_CHECK(reps >= 1, "bench --speculative-costs: --decode-steps must be at least 1, got {}", reps);
  SALA_CHECK(kmax >= 1 && kmax <= 32, "bench --speculative-costs: --max-draft-tokens must be in [1, 32], got {}", kmax);
  SALA_CHECK(o.draft_layers >= 1, "bench --speculative-costs: --draft-layers must be positive, got {}", o.draft_layers);
  SALA_CHECK(chunk >= 1, "bench --speculative-costs: --chunk must be positive, got {}", chunk);
  SALA_CHECK(!contexts.empty() && contexts.front() >= 1, "bench --speculative-costs: contexts must be at least 1 token");
  SALA_CHECK(model.limits().max_batch_tokens >= o.verify_rows() && model.limits().max_logit_rows >= o.verify_rows(),
             "bench --speculative-costs: the model allows {} tokens / {} logit rows per forward, K = {} needs {}",
             model.limits().max_batch_tokens, model.limits().max_logit_rows, kmax, o.verify_rows());

  std::mt19937 rng(uint32_t(seed) ^ 0x5eedu);
  std::uniform_int_distribution<int32_t> tok(5, c.vocab_size - 1);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = tok(rng);
    return t;
  };
  // Plain decode grows the sequence by kWarmup + reps per context; verify/draft runs return to it.
  const int64_t max_ctx = contexts.back() + int64_t(contexts.size()) * (kWarmup + reps) + kmax + 2;
  Engine e(model, {.max_sequences = 1, .max_context = max_ctx});
  const int s = e.open();
  // Runs f (kWarmup + reps) times between device synchronisations; the median of the timed runs.
  // `after` runs untimed after each (returning the sequence to where it was).
  auto timed = [&](const auto& f, const auto& after) {
    std::vector<double> t;
    for (int i = 0; i < kWarmup + reps; ++i) {
      be.synchronize();
      const auto t0 = Clock::now();
      f();
      be.synchronize();
      if (i >= kWarmup) t.push_back(ms_since(t0));
      after();
    }
    return median(std::move(t));
  };
  auto nothing = [] {};

  std::printf("speculative costs: %s on %s, batch 1, self-draft %d of %d layers, medians of %d runs (ms)\n",
              model_name.c_str(), be.name().c_str(), n_draft, c.num_layers, reps);
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t ctx : contexts) {
    // Contexts closer together than the decode growth are measured where the sequence already is.
    while (e.length(s) < ctx) {
      const auto part = random_tokens(std::min(chunk, ctx - e.length(s)));
      Engine::Request r{s, part, -1, false, e.length(s) + int64_t(part.size()) == ctx};
      e.step(std::span(&r, 1));
    }

    // Plain decode, as without speculation (no capture, so decode forwards may replay graphs).
    model.capture_lightning_kv(false);
    const Backend::GraphStats g0 = be.graph_stats();
    const double decode = timed(
        [&] {
          const int32_t t = tok(rng);
          Engine::Request r{s, std::span(&t, 1)};
          e.step(std::span(&r, 1));
        },
        nothing);
    const int64_t replays = be.graph_stats().replays - g0.replays;
    const int64_t C = e.length(s);

    // Self-draft forward and the restore to the snapshot at C (which stays valid for every later
    // rollback at this context). As in the Scheduler, drafts run without the k/v capture, so they
    // may replay CUDA graphs too.
    e.begin_speculation(s);
    model.capture_lightning_kv(false);
    std::vector<double> restore_t;
    const double draft = timed(
        [&] {
          const int32_t t = tok(rng);
          Engine::Request r{s, std::span(&t, 1)};
          e.step(std::span(&r, 1), n_draft);
        },
        [&] {
          const auto t0 = Clock::now();
          e.rollback(s, C);
          be.synchronize();
          restore_t.push_back(ms_since(t0));
        });
    restore_t.erase(restore_t.begin(), restore_t.begin() + kWarmup);
    const double restore = median(restore_t);

    const bool sparse = C + 1 >= c.sparse.dense_len;
    std::printf("\ncontext %lld (%s): decode %.3f ms/step (%lld/%d graph replays), self-draft %.3f ms/token "
                "(%d layers) + %.3f ms restore\n",
                (long long)C, sparse ? "sparse" : "dense", decode, (long long)replays, kWarmup + reps, draft, n_draft,
                restore);
    std::printf("%3s %10s %8s %9s %9s %9s | %-23s | %-23s\n", "K", "verify ms", "/decode", "fwd ms", "snap ms",
                "rollb ms", "self a=.5 / .7 / .9", "lookup a=.5 / .7 / .9");
    model.capture_lightning_kv(true);  // verify forwards capture (begin_speculation would turn it on too)
    for (int K = 1; K <= kmax; ++K) {
      std::vector<double> snap_t, fwd_t, rb_t;
      const double verify = timed(
          [&] {
            const auto v = random_tokens(K + 1);
            auto t0 = Clock::now();
            e.begin_speculation(s);
            be.synchronize();
            snap_t.push_back(ms_since(t0));
            t0 = Clock::now();
            Engine::Request r{s, v, -1, true};
            e.step(std::span(&r, 1));
            be.synchronize();
            fwd_t.push_back(ms_since(t0));
            t0 = Clock::now();
            e.rollback(s, C + K);
            be.synchronize();
            rb_t.push_back(ms_since(t0));
          },
          [&] { e.rollback(s, C); });
      // The warm-up runs are in the part timings too: drop them.
      for (auto* v : {&snap_t, &fwd_t, &rb_t}) v->erase(v->begin(), v->begin() + kWarmup);
      const double self_round = K * draft + restore + verify;
      nlohmann::json speedup = nlohmann::json::array();
      double self_s[3], lookup_s[3];
      for (int i = 0; i < 3; ++i) {
        const double E = expected_tokens(kAcceptance[i], K);
        self_s[i] = E * decode / self_round;
        lookup_s[i] = E * decode / verify;
        speedup.push_back({{"acceptance", kAcceptance[i]}, {"tokens_per_round", E}, {"self", self_s[i]},
                           {"lookup", lookup_s[i]}});
      }
      std::printf("%3d %10.3f %8.2f %9.3f %9.3f %9.3f | %6.2f  %6.2f  %6.2f    | %6.2f  %6.2f  %6.2f\n", K, verify,
                  verify / decode, median(fwd_t), median(snap_t), median(rb_t), self_s[0], self_s[1], self_s[2],
                  lookup_s[0], lookup_s[1], lookup_s[2]);
      std::fflush(stdout);
      rows.push_back({{"context", C},
                      {"requested_context", ctx},
                      {"regime", C + K + 1 >= c.sparse.dense_len ? "sparse" : "dense"},  // of the verify call
                      {"k", K},
                      {"decode_ms", decode},
                      {"decode_graph_replays", replays},
                      {"verify_ms", verify},
                      {"verify_over_decode", verify / decode},
                      {"verify_forward_ms", median(fwd_t)},
                      {"snapshot_ms", median(snap_t)},
                      {"rollback_ms", median(rb_t)},
                      {"draft_layers", n_draft},
                      {"draft_ms_per_token", draft},
                      {"draft_over_decode", draft / decode},
                      {"draft_restore_ms", restore},
                      {"self_round_ms", self_round},
                      {"speedup", speedup}});
    }
  }
  std::printf("\nspeedup = E·decode / round, E = (1 − a^(K+1)) / (1 − a) tokens per round; round = K·draft + restore "
              "+ verify (self), verify (lookup: drafting ~0)\n");
  if (!json_path.empty()) {
    const nlohmann::json doc = {{"model", model_name},       {"backend", be.name()},
                                {"mode", "speculative_costs"}, {"batch", 1},
                                {"runs", reps},               {"draft_layers", n_draft},
                                {"max_draft_tokens", kmax},   {"rows", rows}};
    std::ofstream f(json_path);
    SALA_CHECK(f.good(), "bench: cannot write {}", json_path);
    f << doc.dump(2) << "\n";
  }
  return 0;
}

}  // namespace sala::cli
