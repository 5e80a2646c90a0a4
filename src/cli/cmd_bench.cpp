// sala bench: prefill and decode speed over context lengths and batch sizes, next to the
// roofline of the same machine (ceilings measured in the same run through the backend's ops), with
// the memory of every row (engine/memory.h + the backend's counters); --plot draws the charts
// (tools/plot_bench.py); --serve URL benchmarks a running `sala serve` instead (cli/bench_serve.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

#include "cli/bench_ceilings.h"
#include "cli/bench_compare.h"
#include "cli/bench_serve.h"
#include "cli/bench_speculative.h"
#include "cli/bench_timing.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/plot_tool.h"
#include "cli/random_model.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/kernel_timeline.h"
#include "engine/memory.h"
#include "engine/roofline.h"
#include "model/presets.h"
#ifdef SALA_HAS_CUDA
#include "backend/cuda/kernel_trace.h"
#endif

namespace sala::cli {
namespace {

double mib(double bytes) { return bytes / double(1 << 20); }

// Writes DIR/bench-{decode,ttft,memory}.png from bench JSON files (tools/plot_bench.py).
void plot(const std::vector<std::string>& jsons, const std::string& dir) {
  std::vector<std::string> args = jsons;
  args.insert(args.end(), {"--out", dir});
  run_plot_tool("plot_bench.py", args, "bench --plot");
}

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, random, contexts = "1k,4k,16k,32k,64k,128k", batches = "1,8,32", json, plot, quant = "none";
    std::vector<std::string> from;
    int64_t chunk = 4096;
    std::string batch_context = "4k";
    int decode_steps = 32;
    int prefill_reps = 1;
    uint64_t seed = 0;
    bool quant_lm_head = false;
    int quant_group = 0;  // the format's own: one scale per row (fp8, int8), 64 (int4)
    std::vector<std::string> compare;
    int rounds = 2;
    bool kernel_trace = false;
    std::string kernel_trace_csv;
    BackendOptions backend;
    ServeBenchOptions serve;
    SpeculativeCostOptions speculative_costs;
    std::string concurrency = "1,8,32";
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "model directory (or use --random)");
  app.add_option("--random", o->random, "random weights of a preset, generated on the backend (tiny, small, 9b)")
      ->check(CLI::IsMember(preset_names()));
  app.add_option("--quant", o->quant, "with --random: packed projections fp8, int8 (per row) or int4 (--quant-group), "
                                     "as `sala quantize` writes them (docs/quantization.md)")
      ->check(CLI::IsMember({"none", "fp8", "int8", "int4"}));
  app.add_flag("--quant-lm-head", o->quant_lm_head, "with --quant: lm_head packed too (`sala quantize --lm-head`)");
  app.add_option("--quant-group", o->quant_group,
                 "with --quant int4 (default 64) or int8 (default: per row): columns per scale/bias group; int8 in "
                 "groups is the layout of MLX 8-bit checkpoints")
      ->check(CLI::IsMember({32, 64, 128, 256}));
  app.add_option("--compare", o->compare,
                 "with --random: batch-1 prefill and decode of these weight formats, FORMAT[/gN][+lm][+w8a8] (bf16, "
                 "fp8, int8, int4; e.g. bf16,fp8+lm,int4/g128+lm), in interleaved rounds on this device, each against "
                 "the first (docs/benchmarks.md)")
      ->delimiter(',');
  app.add_option("--rounds", o->rounds, "with --compare: rounds (every format once per round)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  auto* contexts_opt =
      app.add_option("--contexts", o->contexts, "batch-1 context lengths, e.g. 1k,4k,128k,1m (--compare: 4k unless given)");
  auto* batches_opt = app.add_option("--batches", o->batches, "batch sizes for batched decode (at --batch-context each)");
  app.add_option("--batch-context", o->batch_context, "context of every sequence in the batched rows (e.g. 4096, 4k)")
      ->capture_default_str();
  app.add_option("--chunk", o->chunk, "prefill chunk (tokens per forward)")->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  app.add_option("--decode-steps", o->decode_steps, "timed decode steps per row (after 2 warm-up steps)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--kernel-trace", o->kernel_trace,
               "CUDA: trace the timed decode steps' kernels (CUPTI) and print, per row, which kernels the step "
               "waits on (engine/kernel_timeline.h), and for batch-1 rows the same for the prefill; the rows are "
               "then timed with the trace on");
  app.add_option("--kernel-trace-csv", o->kernel_trace_csv,
                 "with --kernel-trace: write every traced launch here as CSV (row, step, index, kernel, CTAs, "
                 "start/end/exposed µs from the step's first kernel), to read a step launch by launch");
  app.add_option("--prefill-reps", o->prefill_reps,
                 "batch-1 prefill timings per context; above 1, each prefills the context from empty on a fresh "
                 "sequence and the row reports the median (prefill t/s = context / median)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--seed", o->seed, "seed of random weights and tokens");
  app.add_option("--json", o->json, "write the rows as JSON here");
  app.add_option("--plot", o->plot, "write PNG charts here (decode and TTFT vs context with the roofline and the "
                                    "authors' A6000D points, memory vs context); the run's JSON too unless --json");
  app.add_option("--from", o->from, "with --plot: plot these bench JSON files instead of running (comma-separated)")
      ->delimiter(',');
  o->backend.add(app);
  o->speculative_costs.add(app);
  app.add_option("--serve", o->serve.url, "benchmark a running `sala serve` at this URL (http://HOST:PORT) instead of "
                                          "the engine")
      ->group("Serving benchmark");
  app.add_option("--concurrency", o->concurrency, "with --serve: client counts, one level each")
      ->group("Serving benchmark")->capture_default_str();
  app.add_option("--requests", o->serve.requests, "with --serve: requests per level (0: 2 x concurrency)")
      ->group("Serving benchmark")->capture_default_str();
  app.add_option("--prompt-tokens", o->serve.prompt_tokens, "with --serve: prompt length in tokens")
      ->group("Serving benchmark")->capture_default_str();
  app.add_option("--max-tokens", o->serve.max_tokens, "with --serve: tokens generated per request (ignore_eos)")
      ->group("Serving benchmark")->capture_default_str();
  app.add_option("--warmup", o->serve.warmup, "with --serve: untimed requests first")
      ->group("Serving benchmark")->capture_default_str();
  app.add_option("--timeout", o->serve.timeout_s, "with --serve: seconds without a byte before a request fails")
      ->group("Serving benchmark")->capture_default_str();
  return [o, batches_opt, contexts_opt] {
    if (!o->serve.url.empty()) {
      SALA_CHECK(o->model.empty() && o->random.empty() && o->plot.empty() && o->from.empty(),
                 "bench --serve measures a running server: give no MODEL, --random, --plot or --from");
      o->serve.concurrency.clear();
      for (auto& s : CLI::detail::split(o->concurrency, ',')) o->serve.concurrency.push_back(parse_size(s));
      o->serve.json = o->json;
      return run_serve_bench(o->serve);
    }
    if (!o->from.empty()) {
      SALA_CHECK(!o->plot.empty(), "bench: --from needs --plot DIR");
      SALA_CHECK(o->model.empty() && o->random.empty(), "bench: --from plots existing results; give no MODEL or --random");
      for (const auto& f : o->from) SALA_CHECK(std::filesystem::is_regular_file(f), "bench --from: no file '{}'", f);
      plot(o->from, o->plot);
      return 0;
    }
    SALA_CHECK(o->model.empty() != o->random.empty(), "bench: give a MODEL directory or --random PRESET");
    if (!o->plot.empty()) check_plot_tool("plot_bench.py", "bench --plot");  // before a long run, not after
    auto backend = o->backend.make();
    // Device memory before the model: the CUDA context and library handles (not the model's).
    const Backend::MemoryStats mem0 = backend->memory_stats();
    std::vector<int64_t> contexts, batches;
    for (auto& s : CLI::detail::split(o->contexts, ',')) contexts.push_back(parse_size(s));
    for (auto& s : CLI::detail::split(o->batches, ',')) batches.push_back(parse_size(s));
    const int64_t batch_context = parse_size(o->batch_context);
    std::sort(contexts.begin(), contexts.end());
    if (!o->compare.empty()) {
      SALA_CHECK(!o->random.empty(), "bench --compare: compares random weights of one preset; give --random PRESET");
      SALA_CHECK(o->quant == "none" && !o->quant_lm_head && o->quant_group == 0,
                 "bench --compare: the formats are in its list (e.g. int4/g128+lm); drop --quant, --quant-lm-head "
                 "and --quant-group");
      SALA_CHECK(batches_opt->count() == 0, "bench --compare: batch-1 rows only; drop --batches");
      SALA_CHECK(!o->backend.fp8_prefill && !o->backend.int8_prefill,
                 "bench --compare: W8A8 prefill is chosen per format in its list (e.g. fp8+w8a8); drop --fp8-prefill "
                 "and --int8-prefill");
      SALA_CHECK(!o->kernel_trace && !o->speculative_costs.on && o->plot.empty() && o->prefill_reps == 1,
                 "bench --compare: not with --kernel-trace, --speculative-costs, --plot or --prefill-reps");
      if (contexts_opt->count() == 0) contexts = {4096};  // issue #8's targets are at 4K
      CompareOptions c{.preset = o->random, .contexts = contexts, .chunk = o->chunk, .steps = o->decode_steps,
                       .rounds = o->rounds, .seed = o->seed, .json = o->json};
      for (const auto& f : o->compare) c.formats.push_back(parse_format_spec(f));
      return run_format_comparison(*backend, c);
    }
    const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
    ModelLimits limits{.max_batch_tokens = std::max(o->chunk, max_batch), .max_logit_rows = std::max<int64_t>(max_batch, 1)};
    if (o->speculative_costs.on) {  // a verify forward: K + 1 tokens, every logit row
      limits.max_batch_tokens = std::max(limits.max_batch_tokens, o->speculative_costs.verify_rows());
      limits.max_logit_rows = std::max(limits.max_logit_rows, o->speculative_costs.verify_rows());
    }

    LoadedModel m;
    std::string model_name;
    if (!o->random.empty()) {
      RandomQuant quant = parse_random_quant(o->quant);
      SALA_CHECK(!o->quant_lm_head || quant.format != WeightFormat::Dense, "bench: --quant-lm-head needs --quant");
      quant.lm_head = o->quant_lm_head;
      SALA_CHECK(o->quant_group == 0 || quant.format == WeightFormat::Q4 || quant.format == WeightFormat::Q8,
                 "bench: --quant-group {} applies to --quant int4 or int8 (fp8 has one scale per row)", o->quant_group);
      if (o->quant_group) quant.group = o->quant_group;
      m = random_model(o->random, *backend, limits, o->seed, quant);
      model_name = "random " + o->random + (o->quant == "none" ? "" : " " + o->quant) +
                   (quant.group ? " g" + std::to_string(quant.group) : "") +
                   (o->quant_lm_head ? " (lm_head too)" : "");
    } else {
      SALA_CHECK(o->quant == "none", "bench: --quant goes with --random (a quantized MODEL says its own format)");
      m = load_model_verbose(o->model, *backend, limits);
      model_name = m.dir.string();
    }
    if (o->speculative_costs.on) {
      SALA_CHECK(o->plot.empty(), "bench: --plot does not chart --speculative-costs (use --json)");
      return run_speculative_costs(*m.model, model_name, o->speculative_costs, contexts, o->chunk, o->decode_steps,
                                   o->seed, o->json);
    }
    const ModelConfig& c = m.config;
    const bool gpu = backend->name() != "cpu";
#ifdef SALA_HAS_CUDA
    std::unique_ptr<cuda::KernelTrace> trace;
#else
    struct NoTrace {
      uint64_t now() const { return 0; }
      std::vector<KernelSpan> take() { return {}; }
    };
    std::unique_ptr<NoTrace> trace;
#endif
    SALA_CHECK(o->kernel_trace_csv.empty() || o->kernel_trace, "bench --kernel-trace-csv needs --kernel-trace");
    if (o->kernel_trace) {
      SALA_CHECK(backend->name() == "cuda", "bench --kernel-trace: traces CUDA kernels; this is the {} backend",
                 backend->name());
#ifdef SALA_HAS_CUDA
      trace = std::make_unique<cuda::KernelTrace>();
#endif
    }
    std::string timeline;  // the last row's kernel timeline (--kernel-trace)
    std::string prefill_timeline;  // and its batch-1 prefill's
    std::string spans_csv = kKernelSpansCsvHeader;  // every traced row's launches (--kernel-trace-csv)
    int traced_rows = 0;
    const Ceilings ceil = measure_ceilings(*backend, gpu);
    backend->reset_memory_peak();  // the ceilings' buffers are not the model's
    std::fprintf(stderr, "ceilings (%s, %s): %.0f GB/s elementwise read+write, %.1f TFLOP/s matmul (%s)\n",
                 backend->name().c_str(), backend->device_name().c_str(), ceil.bandwidth / 1e9, ceil.matmul / 1e12,
                 std::string(dtype_name(backend->act_dtype())).c_str());
    const double bpp = double(dtype_size(backend->act_dtype()));
    // The roofline's weight term: the bytes the matrices really hold (packed formats included).
    const double weight_bpp = weight_bytes_per_param(c, m.model->weights());

    std::mt19937 rng(uint32_t(o->seed));
    std::uniform_int_distribution<int32_t> tok(5, c.vocab_size - 1);
    auto random_tokens = [&](int64_t n) {
      std::vector<int32_t> t(static_cast<size_t>(n));
      for (auto& x : t) x = tok(rng);
      return t;
    };
    nlohmann::json rows = nlohmann::json::array();
    std::printf("graphs: %s\n", backend->graph_stats().enabled ? "on (decode steps replay CUDA graphs)" : "off");
    std::printf("%-8s %5s %12s %9s %12s %9s %12s %8s %9s %8s %7s %9s %9s %9s %9s %9s %9s\n", "context", "batch",
                "prefill t/s", "%matmul", "TTFT s", "decode t/s", "roofline t/s", "%roof", "ms/step", "gpu ms", "graphs",
                "wts MiB", "K/V MiB", "K1K2 MiB", "state MiB", "work MiB", "peak MiB");
    // Device time of the timed steps' forwards (backend events; 0 where the backend has none) and
    // how many of them replayed a CUDA graph: ms/step − gpu ms is the host-side gap.
    double dec_gpu_ms = 0;
    int64_t dec_replays = 0;

    const TokenSource token = [&] { return tok(rng); };
    auto decode_steps = [&](Engine& e, const std::vector<int>& seqs) {
      std::vector<uint64_t> marks;  // --kernel-trace: where each timed step begins
      if (trace) trace->take();     // the prefill's and earlier rows' kernels
      const DecodeTiming d = time_decode_steps(e, *backend, seqs, o->decode_steps, token, [&] {
        if (trace) marks.push_back(trace->now());
      });
      dec_gpu_ms = d.gpu_ms;
      dec_replays = d.replays;
      if (trace) {
        std::vector<KernelSpan> spans = trace->take();
        timeline = format_kernel_timeline(kernel_timeline(spans, marks));
        if (!o->kernel_trace_csv.empty()) spans_csv += kernel_spans_csv(std::move(spans), marks, traced_rows++);
      }
      return d.step_s;
    };
    // Memory of a row: the caches of its sequences at its context (engine/memory.h, as `sala info
    // --context`; the backends keep K/V/K1/K2 in their activation dtype), the weights, and the
    // workspace: what the backend holds beyond weights and cache pools (activations, scratch,
    // library workspaces) — its own allocation count where it keeps one (CPU), else the device's use
    // minus the use before the model (CUDA). Peak: the backend's high-water mark of device use.
    const double weights = weight_bytes(m.model->weights());
    const bool counted = mem0.allocated >= 0;
    auto report = [&](int64_t ctx, int64_t batch, double prefill_tps, double ttft, double step, const EngineOptions& eo) {
      const CacheBytes cache = cache_bytes(c, ctx, batch, bpp);
      const CacheBytes pool = cache_pool_bytes(c, eo.max_context, eo.max_sequences, bpp);
      const Backend::MemoryStats ms = backend->memory_stats();
      const bool known = counted ? ms.allocated >= 0 : (ms.used >= 0 && mem0.used >= 0);
      const double workspace = (counted ? double(ms.allocated) : double(ms.used - mem0.used)) - weights - pool.total();
      const TokenCost cost = decode_cost(c, ctx, weight_bpp);
      const double roof_step = cost.bytes_per_step(int(batch)) / ceil.bandwidth;
      const double prefill_pct = prefill_tps > 0 ? 100.0 * prefill_tps * prefill_flops_per_token(c, ctx) / ceil.matmul : 0;
      std::printf("%-8lld %5lld %12.0f %8.1f%% %12.2f %9.1f %12.1f %7.1f%% %9.2f %8.2f %3lld/%-3d %9.1f %9.1f %9.2f %9.2f "
                  "%9s %9s\n",
                  (long long)ctx, (long long)batch, prefill_tps, prefill_pct, ttft, double(batch) / step,
                  double(batch) / roof_step, 100.0 * roof_step / step, step * 1e3, dec_gpu_ms, (long long)dec_replays,
                  o->decode_steps, mib(weights), mib(cache.kv), mib(cache.compressed), mib(cache.states),
                  known ? fmt::format("{:.1f}", mib(workspace)).c_str() : "-",
                  ms.peak >= 0 ? fmt::format("{:.1f}", mib(double(ms.peak))).c_str() : "-");
      if (!prefill_timeline.empty()) std::printf("prefill kernels:\n%s", std::exchange(prefill_timeline, {}).c_str());
      if (!timeline.empty()) std::printf("decode kernels:\n%s", std::exchange(timeline, {}).c_str());
      std::fflush(stdout);
      rows.push_back({{"context", ctx}, {"batch", batch}, {"prefill_tok_s", prefill_tps},
                      {"prefill_pct_matmul", prefill_pct}, {"ttft_s", ttft}, {"decode_tok_s", double(batch) / step},
                      {"decode_ms_per_step", step * 1e3}, {"bytes_per_step", cost.bytes_per_step(int(batch))},
                      {"roofline_tok_s", double(batch) / roof_step}, {"pct_roofline", 100.0 * roof_step / step},
                      {"decode_gpu_ms_per_step", dec_gpu_ms}, {"graph_replays", dec_replays},
                      {"weights_bytes", weights}, {"kv_bytes", cache.kv}, {"compressed_keys_bytes", cache.compressed},
                      {"lightning_state_bytes", cache.states}, {"cache_pool_bytes", pool.total()},
                      {"workspace_bytes", known ? nlohmann::json(workspace) : nlohmann::json()},
                      {"peak_memory_bytes", ms.peak >= 0 ? nlohmann::json(ms.peak) : nlohmann::json()},
                      {"device_used_bytes", ms.used >= 0 ? nlohmann::json(ms.used) : nlohmann::json()}});
    };

    // Batch 1: one sequence grows through every context; decode is timed at each.
    {
      const int64_t max_ctx = contexts.back() + int64_t(contexts.size()) * (o->decode_steps + 2) + 1;
      const EngineOptions eo{.max_sequences = 1, .max_context = max_ctx};
      Engine e(*m.model, eo);
      // --kernel-trace: the prefill's kernels too (the whole prefill counts as one step, so
      // "exposed" is each kernel family's share of it).
      auto prefill = [&](int s, int64_t ctx) {
        std::vector<uint64_t> marks;
        if (trace) {
          trace->take();  // earlier kernels
          marks.push_back(trace->now());
        }
        const double t = prefill_to(e, *backend, s, ctx, o->chunk, token);
        if (trace) prefill_timeline = format_kernel_timeline(kernel_timeline(trace->take(), marks));
        return t;
      };
      // Warm-up: one chunk on a throwaway sequence (library handles, heuristics, lazy scratch), so
      // the first row's prefill is not the process's first forward.
      {
        const int w = e.open();
        prefill(w, std::min(o->chunk, contexts.front()));
        e.close(w);
      }
      int s = e.open();
      double prefill_time = 0;
      for (int64_t ctx : contexts) {
        if (o->prefill_reps > 1) {  // each timing from empty; the last sequence goes on to decode
          std::vector<double> t;
          for (int rep = 0; rep < o->prefill_reps; ++rep) {
            e.close(s);
            s = e.open();
            t.push_back(prefill(s, ctx));
          }
          prefill_time = median(t);
          report(ctx, 1, double(ctx) / prefill_time, prefill_time, decode_steps(e, {s}), eo);
          continue;
        }
        const int64_t start = e.length(s);
        const double seg = prefill(s, ctx);
        prefill_time += seg;
        const double step = decode_steps(e, {s});
        report(ctx, 1, seg > 0 ? double(e.length(s) - start) / seg : 0, prefill_time, step, eo);
      }
    }
    // Batched decode at batch_context.
    for (int64_t b : batches) {
      if (b <= 1) continue;
      const EngineOptions eo{.max_sequences = int(b), .max_context = batch_context + o->decode_steps + 3};
      Engine e(*m.model, eo);
      std::vector<int> seqs;
      for (int64_t i = 0; i < b; ++i) {
        int s = e.open();
        seqs.push_back(s);
        while (e.length(s) < batch_context) {
          auto chunk = random_tokens(std::min(o->chunk, batch_context - e.length(s)));
          Engine::Request r{s, chunk, -1, false, false};
          e.step(std::span(&r, 1));
        }
      }
      report(batch_context, b, 0, 0, decode_steps(e, seqs), eo);
    }
    const std::string json_path = !o->json.empty() ? o->json : o->plot.empty() ? "" : o->plot + "/bench.json";
    if (!json_path.empty()) {
      const auto mem = [](int64_t v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(); };
      nlohmann::json doc = {
          {"model", model_name}, {"backend", backend->name()}, {"device", backend->device_name()},
          {"ceilings", {{"bandwidth_bytes_s", ceil.bandwidth}, {"matmul_flop_s", ceil.matmul}}},
          {"decode_steps", o->decode_steps}, {"chunk", o->chunk}, {"prefill_reps", o->prefill_reps},
          {"memory", {{"workspace_from", counted ? "backend allocation count" : "device use minus use before the model"},
                      {"before_model_used_bytes", mem(mem0.used)}, {"device_total_bytes", mem(mem0.total)},
                      {"cache_bytes_per_value", bpp}}},
          {"rows", rows}};
      if (!o->plot.empty()) std::filesystem::create_directories(o->plot);
      std::ofstream f(json_path);
      SALA_CHECK(f, "bench: cannot write '{}'", json_path);
      f << doc.dump(2) << "\n";
    }
    if (!o->kernel_trace_csv.empty()) {
      std::ofstream f(o->kernel_trace_csv);
      SALA_CHECK(f, "bench: cannot write '{}'", o->kernel_trace_csv);
      f << spans_csv;
    }
    if (!o->plot.empty()) plot({json_path}, o->plot);
    return 0;
  };
}

}  // namespace
SALA_COMMAND(bench, "Prefill/decode speed over contexts and batch sizes, with the roofline", setup);
}  // namespace sala::cli
