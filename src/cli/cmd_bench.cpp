// sala bench: prefill and decode speed over context lengths and batch sizes, next to the
// roofline of the same machine (ceilings measured in the same run through the backend's ops).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/roofline.h"
#include "model/presets.h"

namespace sala::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int64_t parse_size(std::string s) {  // "4k" -> 4096, "1m" -> 1048576
  SALA_CHECK(!s.empty(), "empty size");
  int64_t mult = 1;
  const char last = char(std::tolower(s.back()));
  if (last == 'k') mult = 1024, s.pop_back();
  else if (last == 'm') mult = 1024 * 1024, s.pop_back();
  try {
    return std::stoll(s) * mult;
  } catch (const std::exception&) {
    fail("bad size '{}' (examples: 4096, 4k, 1m)", s);
  }
}

struct Ceilings {
  double bandwidth = 0;  // bytes/s, read + write of a large elementwise op
  double matmul = 0;     // FLOP/s of a large square matmul in the backend's activation dtype
};

// Measures both ceilings with the backend's own ops: a big elementwise scale (reads and writes
// every byte once) and a big matmul. Median of several timed runs after a warm-up.
Ceilings measure_ceilings(Backend& b, bool big) {
  Ceilings c;
  const DType act = b.act_dtype();
  const int64_t rows = big ? 32768 : 2048, cols = 8192;  // 512 MiB (bf16) on GPUs
  auto x = b.alloc(size_t(rows * cols) * dtype_size(act)), y = b.alloc(size_t(rows * cols) * dtype_size(act));
  Mat mx = x->mat(act, rows, cols), my = y->mat(act, rows, cols);
  std::vector<float> host(static_cast<size_t>(cols));
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i % 7) * 0.1f + 0.05f;
  for (int64_t r = 0; r < rows; r += 1) b.upload(mx.slice_rows(r, 1), host.data());
  std::vector<double> t;
  for (int i = 0; i < 8; ++i) {
    b.synchronize();
    auto t0 = Clock::now();
    b.scale(mx, 1.0f, my);
    b.synchronize();
    if (i >= 2) t.push_back(seconds_since(t0));
  }
  c.bandwidth = 2.0 * double(mx.nbytes()) / median(t);

  const int64_t n = big ? 8192 : 1024;
  Weight w = b.random_weight(n, n, 0.0f, 0.02f, 99);
  Mat a = mx.reshape(rows * cols / n, n).slice_rows(0, n), out = my.reshape(rows * cols / n, n).slice_rows(0, n);
  t.clear();
  for (int i = 0; i < 6; ++i) {
    b.synchronize();
    auto t0 = Clock::now();
    b.matmul(a, w, out);
    b.synchronize();
    if (i >= 2) t.push_back(seconds_since(t0));
  }
  c.matmul = 2.0 * double(n) * n * n / median(t);
  return c;
}

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, random, contexts = "1k,4k,16k,32k,64k,128k", batches = "1,8,32", json;
    int64_t chunk = 4096, batch_context = 4096;
    int decode_steps = 32;
    uint64_t seed = 0;
    BackendOptions backend;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "model directory (or use --random)");
  app.add_option("--random", o->random, "random weights of a preset, generated on the backend (tiny, small, 9b)")
      ->check(CLI::IsMember(preset_names()));
  app.add_option("--contexts", o->contexts, "batch-1 context lengths, e.g. 1k,4k,128k,1m");
  app.add_option("--batches", o->batches, "batch sizes for batched decode (at --batch-context each)");
  app.add_option("--batch-context", o->batch_context, "context of every sequence in the batched rows");
  app.add_option("--chunk", o->chunk, "prefill chunk (tokens per forward)");
  app.add_option("--decode-steps", o->decode_steps, "timed decode steps per row (after 2 warm-up steps)");
  app.add_option("--seed", o->seed, "seed of random weights and tokens");
  app.add_option("--json", o->json, "write the rows as JSON here");
  o->backend.add(app);
  return [o] {
    SALA_CHECK(o->model.empty() != o->random.empty(), "bench: give a MODEL directory or --random PRESET");
    auto backend = o->backend.make();
    std::vector<int64_t> contexts, batches;
    for (auto& s : CLI::detail::split(o->contexts, ',')) contexts.push_back(parse_size(s));
    for (auto& s : CLI::detail::split(o->batches, ',')) batches.push_back(parse_size(s));
    std::sort(contexts.begin(), contexts.end());
    const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
    ModelLimits limits{.max_batch_tokens = std::max(o->chunk, max_batch), .max_logit_rows = std::max<int64_t>(max_batch, 1)};

    LoadedModel m;
    std::string model_name;
    if (!o->random.empty()) {
      m.config = preset_config(o->random);
      m.config.random_weights = true;
      auto t0 = Clock::now();
      ModelWeights w = random_weights(m.config, *backend, o->seed);
      backend->synchronize();
      std::fprintf(stderr, "random %s weights generated on %s in %.1f s\n", o->random.c_str(),
                   backend->name().c_str(), seconds_since(t0));
      m.model = std::make_unique<Model>(m.config, std::move(w), *backend, limits);
      model_name = "random " + o->random;
    } else {
      m = load_model_verbose(o->model, *backend, limits);
      model_name = m.dir.string();
    }
    const ModelConfig& c = m.config;
    const bool gpu = backend->name() != "cpu";
    const Ceilings ceil = measure_ceilings(*backend, gpu);
    std::fprintf(stderr, "ceilings (%s): %.0f GB/s elementwise read+write, %.1f TFLOP/s matmul (%s)\n",
                 backend->name().c_str(), ceil.bandwidth / 1e9, ceil.matmul / 1e12,
                 std::string(dtype_name(backend->act_dtype())).c_str());
    const double bpp = double(dtype_size(backend->act_dtype()));

    std::mt19937 rng(uint32_t(o->seed));
    std::uniform_int_distribution<int32_t> tok(5, c.vocab_size - 1);
    auto random_tokens = [&](int64_t n) {
      std::vector<int32_t> t(static_cast<size_t>(n));
      for (auto& x : t) x = tok(rng);
      return t;
    };
    nlohmann::json rows = nlohmann::json::array();
    std::printf("graphs: %s\n", backend->graph_stats().enabled ? "on (decode steps replay CUDA graphs)" : "off");
    std::printf("%-8s %5s %12s %9s %12s %9s %12s %8s %9s %8s %7s\n", "context", "batch", "prefill t/s", "%matmul",
                "TTFT s", "decode t/s", "roofline t/s", "%roof", "ms/step", "gpu ms", "graphs");
    // Device time of the timed steps' forwards (backend events; 0 where the backend has none) and
    // how many of them replayed a CUDA graph: ms/step − gpu ms is the host-side gap.
    double dec_gpu_ms = 0;
    int64_t dec_replays = 0;

    auto decode_steps = [&](Engine& e, const std::vector<int>& seqs) {
      std::vector<double> t;
      Backend::GraphStats g0;
      for (int i = 0; i < o->decode_steps + 2; ++i) {
        std::vector<std::vector<int32_t>> next;
        std::vector<Engine::Request> reqs;
        for (int s : seqs) next.push_back(random_tokens(1));
        for (size_t k = 0; k < seqs.size(); ++k) reqs.push_back({seqs[k], next[k]});
        if (i == 2) g0 = backend->graph_stats();
        auto t0 = Clock::now();
        e.step(reqs);  // returns logits on the host: the device work is finished
        if (i >= 2) t.push_back(seconds_since(t0));
      }
      const Backend::GraphStats g1 = backend->graph_stats();
      dec_gpu_ms = (g1.gpu_ms - g0.gpu_ms) / double(std::max(o->decode_steps, 1));
      dec_replays = g1.replays - g0.replays;
      return median(t);
    };
    auto report = [&](int64_t ctx, int64_t batch, double prefill_tps, double ttft, double step) {
      const TokenCost cost = decode_cost(c, ctx, bpp);
      const double roof_step = cost.bytes_per_step(int(batch)) / ceil.bandwidth;
      const double prefill_pct = prefill_tps > 0 ? 100.0 * prefill_tps * prefill_flops_per_token(c, ctx) / ceil.matmul : 0;
      std::printf("%-8lld %5lld %12.0f %8.1f%% %12.2f %9.1f %12.1f %7.1f%% %9.2f %8.2f %3lld/%-3d\n", (long long)ctx,
                  (long long)batch, prefill_tps, prefill_pct, ttft, double(batch) / step, double(batch) / roof_step,
                  100.0 * roof_step / step, step * 1e3, dec_gpu_ms, (long long)dec_replays, o->decode_steps);
      std::fflush(stdout);
      rows.push_back({{"context", ctx}, {"batch", batch}, {"prefill_tok_s", prefill_tps},
                      {"prefill_pct_matmul", prefill_pct}, {"ttft_s", ttft}, {"decode_tok_s", double(batch) / step},
                      {"decode_ms_per_step", step * 1e3}, {"bytes_per_step", cost.bytes_per_step(int(batch))},
                      {"roofline_tok_s", double(batch) / roof_step}, {"pct_roofline", 100.0 * roof_step / step},
                      {"decode_gpu_ms_per_step", dec_gpu_ms}, {"graph_replays", dec_replays}});
    };

    // Batch 1: one sequence grows through every context; decode is timed at each.
    {
      const int64_t max_ctx = contexts.back() + int64_t(contexts.size()) * (o->decode_steps + 2) + 1;
      Engine e(*m.model, {.max_sequences = 1, .max_context = max_ctx});
      int s = e.open();
      double prefill_time = 0;
      int64_t prefilled = 0;
      for (int64_t ctx : contexts) {
        const int64_t start = e.length(s);
        double seg = 0;
        while (e.length(s) < ctx) {
          auto chunk = random_tokens(std::min(o->chunk, ctx - e.length(s)));
          Engine::Request r{s, chunk, -1, false, e.length(s) + int64_t(chunk.size()) == ctx};
          auto t0 = Clock::now();
          e.step(std::span(&r, 1));
          backend->synchronize();
          seg += seconds_since(t0);
        }
        prefill_time += seg;
        prefilled += e.length(s) - start;
        const double step = decode_steps(e, {s});
        report(ctx, 1, seg > 0 ? double(e.length(s) - start) / seg : 0, prefill_time, step);
      }
      (void)prefilled;
    }
    // Batched decode at batch_context.
    for (int64_t b : batches) {
      if (b <= 1) continue;
      Engine e(*m.model, {.max_sequences = int(b), .max_context = o->batch_context + o->decode_steps + 3});
      std::vector<int> seqs;
      for (int64_t i = 0; i < b; ++i) {
        int s = e.open();
        seqs.push_back(s);
        while (e.length(s) < o->batch_context) {
          auto chunk = random_tokens(std::min(o->chunk, o->batch_context - e.length(s)));
          Engine::Request r{s, chunk, -1, false, false};
          e.step(std::span(&r, 1));
        }
      }
      report(o->batch_context, b, 0, 0, decode_steps(e, seqs));
    }
    if (!o->json.empty()) {
      nlohmann::json doc = {{"model", model_name}, {"backend", backend->name()},
                            {"ceilings", {{"bandwidth_bytes_s", ceil.bandwidth}, {"matmul_flop_s", ceil.matmul}}},
                            {"decode_steps", o->decode_steps}, {"chunk", o->chunk}, {"rows", rows}};
      std::ofstream(o->json) << doc.dump(2) << "\n";
    }
    return 0;
  };
}

}  // namespace
SALA_COMMAND(bench, "Prefill/decode speed over contexts and batch sizes, with the roofline", setup);
}  // namespace sala::cli
