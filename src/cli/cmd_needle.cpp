// sala needle [MODEL]: needle-in-a-haystack over context lengths x depths. Each cell is a chat
// prompt of exactly the requested token count (filler + needle at the depth + question), answered
// greedily and checked with the matcher; prefill/decode speed and peak memory are reported per
// cell, as a table, JSON, and PNGs (tools/plot_needle.py, matplotlib).
// Memory per cell: `peak_rss_bytes`, the host process's resident-set high-water mark since it
// started (VmHWM; every backend), and on a device backend (CUDA) `peak_device_bytes`, the highest
// device memory in use (device-wide, cudaMemGetInfo) sampled after every forward of the cell, the
// peak reset before each cell; null on the CPU backend, whose memory is the RSS.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/generation.h"
#include "core/error.h"
#include "engine/needle.h"

namespace sala::cli {
namespace {

namespace fs = std::filesystem;

double parse_depth(const std::string& s) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    SALA_CHECK(used == s.size() && v >= 0 && v <= 100, "bad depth '{}' (a percentage within 0..100)", s);
    return v;
  } catch (const std::logic_error&) {
    fail("bad depth '{}' (a percentage within 0..100)", s);
  }
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

fs::path tools_dir() {
  if (const char* d = std::getenv("SALA_TOOLS_DIR"); d && *d) return d;
  return fs::path(SALA_SOURCE_DIR) / "tools";
}

// A progress bar on stderr while a long prompt is prefilled (terminals only).
struct ProgressBar {
  bool enabled = ::isatty(STDERR_FILENO) != 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now(), last;
  bool drawn = false;
  void update(int64_t done, int64_t total, const std::string& label) {
    if (!enabled) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total && drawn && now - last < std::chrono::milliseconds(200)) return;
    last = now;
    const double secs = std::chrono::duration<double>(now - start).count();
    const int width = 30, fill = int(double(width) * double(done) / double(std::max<int64_t>(total, 1)));
    std::fprintf(stderr, "\r%s [%s%s] %3d%% %lld/%lld tok %.0f tok/s ", label.c_str(), std::string(size_t(fill), '#').c_str(),
                 std::string(size_t(width - fill), '.').c_str(), int(100 * done / std::max<int64_t>(total, 1)),
                 (long long)done, (long long)total, secs > 0 ? double(done) / secs : 0.0);
    drawn = true;
    if (done >= total) std::fprintf(stderr, "\r%*s\r", 100, "");
    std::fflush(stderr);
  }
};

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, contexts = "4k,8k,16k,32k", depths = "0,25,50,75,95", filler, json, png;
    std::string match = "contains";
    NeedleSpec spec;
    int max_tokens = 32;
    int64_t chunk = 2048;
    BackendOptions backend;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "model directory (default: the built-in random model)");
  app.add_option("--context", o->contexts, "prompt lengths in tokens, e.g. 4k,8k,128k,1m")->capture_default_str();
  app.add_option("--depth", o->depths, "needle depths, percent of the filler")->capture_default_str();
  app.add_option("--needle", o->spec.needle, "the sentence hidden in the haystack")->capture_default_str();
  app.add_option("--question", o->spec.question, "the question asked after the haystack")->capture_default_str();
  app.add_option("--answer", o->spec.answer, "the expected answer (text, or a pattern with --match regex)")
      ->capture_default_str();
  app.add_option("--match", o->match, "how the answer is checked: contains (ignoring case), exact, regex")
      ->check(CLI::IsMember({"contains", "exact", "regex"}))
      ->capture_default_str();
  app.add_option("--filler", o->filler, "filler text file (default: built-in prose), repeated as needed");
  app.add_option("-n,--max-tokens", o->max_tokens, "most tokens of each answer")->capture_default_str();
  app.add_option("--chunk", o->chunk, "prefill chunk (tokens per forward)")->capture_default_str();
  app.add_option("--json", o->json, "write the results as JSON here");
  app.add_option("--png", o->png, "write the found/not-found heatmap here, and a speed plot beside it (*-speed.png)");
  o->backend.add(app);
  app.footer(
      "Memory per cell: 'peak RSS' is the host process's resident-set high-water mark since it started (VmHWM); "
      "'peak dev' (device backends: CUDA) is the highest device memory in use, device-wide, sampled after every "
      "forward of the cell and reset before each cell ('-' on the CPU backend). JSON: peak_rss_bytes, "
      "peak_device_bytes (null on CPU).");
  return [o] {
    const MatchMode mode = parse_match_mode(o->match);
    if (mode == MatchMode::Regex) answer_matches("", o->spec.answer, mode);  // a bad pattern fails now
    SALA_CHECK(o->max_tokens >= 1, "--max-tokens must be at least 1");
    SALA_CHECK(o->chunk >= 1, "--chunk must be positive");
    std::vector<int64_t> contexts;
    std::vector<double> depths;
    for (auto& s : CLI::detail::split(o->contexts, ',')) contexts.push_back(parse_size(s));
    for (auto& s : CLI::detail::split(o->depths, ',')) depths.push_back(parse_depth(s));
    SALA_CHECK(!contexts.empty() && !depths.empty(), "give at least one --context and one --depth");
    std::string filler = default_filler_text();
    if (!o->filler.empty()) {
      std::ifstream f(o->filler, std::ios::binary);
      SALA_CHECK(f, "cannot read filler file '{}'", o->filler);
      std::stringstream ss;
      ss << f.rdbuf();
      filler = ss.str();
      SALA_CHECK(!filler.empty(), "filler file '{}' is empty", o->filler);
    }

    const fs::path dir = resolve_model_dir(resolve_model_ref(o->model));
    SALA_CHECK(fs::exists(dir / "tokenizer.json"), "model directory '{}' has no tokenizer.json", dir.string());
    const Tokenizer tok = Tokenizer::load(dir);
    if (auto w = chat_template_warning(dir)) std::fprintf(stderr, "warning: %s\n", w->c_str());
    auto backend = o->backend.make();
    LoadedModel m = load_model_verbose(dir.string(), *backend, {.max_batch_tokens = o->chunk, .max_logit_rows = 1});
    const ModelConfig& cfg = m.config;
    SALA_CHECK(tok.vocab_size() <= cfg.vocab_size, "tokenizer has {} ids but the model's vocabulary is {}",
               tok.vocab_size(), cfg.vocab_size);
    if (cfg.random_weights)
      std::fprintf(stderr,
                   "note: RANDOM weights cannot find needles: every cell will (almost surely) say 'not found'; "
                   "these results only check the harness (prompt lengths, speed, memory)\n");
    const int64_t max_ctx = *std::max_element(contexts.begin(), contexts.end());
    if (max_ctx > cfg.max_position_embeddings)
      std::fprintf(stderr, "note: context %lld exceeds the model's max_position_embeddings (%d)\n", (long long)max_ctx,
                   cfg.max_position_embeddings);
    Engine engine(*m.model, {.max_sequences = 1, .max_context = max_ctx + o->max_tokens + 1});

    ChatOptions chat;
    chat.enable_thinking = false;  // a direct answer: the empty think block is part of the prompt
    GreedyRunOptions run;
    run.chunk = o->chunk;
    run.max_new_tokens = o->max_tokens;
    run.stop_ids.assign(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());

    nlohmann::json cells = nlohmann::json::array();
    // A device backend reports its own memory (CUDA: device-wide use); the CPU backend's memory is
    // the process RSS, already in its own column.
    const bool device_memory = backend->name() != "cpu";
    const int64_t device_total = device_memory ? backend->memory_stats().total : -1;
    std::printf("%-9s %6s %7s %-6s %10s %12s %11s %12s %12s  %s\n", "context", "depth", "actual", "found", "prefill s",
                "prefill t/s", "decode t/s", "peak RSS MiB", "peak dev MiB", "answer");
    int found_count = 0;
    for (int64_t ctx : contexts) {
      for (double depth : depths) {
        const Haystack h = build_haystack(tok, filler, o->spec, ctx, depth, chat);
        ProgressBar bar;
        const std::string label = fmt::format("prefill {}@{}%", ctx, depth);
        run.on_prefill = [&](int64_t done, int64_t total) {
          if (total > o->chunk) bar.update(done, total, label);
        };
        int64_t device_peak = -1;
        auto sample_device = [&] {
          if (device_memory) device_peak = std::max(device_peak, backend->memory_stats().peak);
        };
        if (device_memory) backend->reset_memory_peak();  // per cell (the CPU's would reset the RSS peak)
        sample_device();
        run.on_forward = sample_device;
        const GreedyRunResult r = greedy_run(engine, h.prompt, run);
        run.on_forward = nullptr;
        sample_device();
        const std::string answer = tok.decode(r.output, /*skip_special_tokens=*/true);
        const bool found = answer_matches(answer, o->spec.answer, mode);
        found_count += found;
        const double prefill_tps = r.prefill_seconds > 0 ? double(h.prompt.size()) / r.prefill_seconds : 0;
        const double decode_tps = r.decode_seconds > 0 ? double(r.decode_steps) / r.decode_seconds : 0;
        const int64_t rss = peak_rss_bytes();
        std::string shown = answer.substr(0, 40);
        std::replace(shown.begin(), shown.end(), '\n', ' ');
        const std::string dev = device_peak >= 0 ? fmt::format("{:.1f}", double(device_peak) / (1 << 20)) : "-";
        std::printf("%-9lld %5.0f%% %6.1f%% %-6s %10.3f %12.1f %11.1f %12.1f %12s  %s\n", (long long)ctx, depth,
                    h.actual_depth, found ? "yes" : "no", r.prefill_seconds, prefill_tps, decode_tps,
                    double(rss) / (1 << 20), dev.c_str(), shown.c_str());
        std::fflush(stdout);
        cells.push_back({{"context", ctx}, {"prompt_tokens", int64_t(h.prompt.size())}, {"depth", depth},
                         {"actual_depth", h.actual_depth}, {"needle_token", h.needle_token}, {"found", found},
                         {"output", answer}, {"output_tokens", int64_t(r.output.size())},
                         {"prefill_s", r.prefill_seconds}, {"prefill_tok_s", prefill_tps},
                         {"decode_tok_s", decode_tps}, {"decode_steps", r.decode_steps},
                         {"peak_rss_bytes", rss},
                         {"peak_device_bytes", device_peak >= 0 ? nlohmann::json(device_peak) : nlohmann::json()}});
      }
    }
    std::printf("found %d of %zu cells\n", found_count, cells.size());
    nlohmann::json doc = {{"model", dir.string()},
                          {"backend", backend->name()},
                          {"random_weights", cfg.random_weights},
                          {"needle", o->spec.needle},
                          {"question", o->spec.question},
                          {"answer", o->spec.answer},
                          {"match", match_mode_name(mode)},
                          {"max_tokens", o->max_tokens},
                          {"chunk", o->chunk},
                          {"device_memory", device_memory},
                          {"device_total_bytes",
                           device_total >= 0 ? nlohmann::json(device_total) : nlohmann::json()},
                          {"found", found_count},
                          {"cells", cells}};
    fs::path json_path = o->json;
    fs::path tmp_json;
    if (json_path.empty() && !o->png.empty()) {
      tmp_json = fs::temp_directory_path() / ("sala_needle_" + std::to_string(::getpid()) + ".json");
      json_path = tmp_json;
    }
    if (!json_path.empty()) {
      std::ofstream f(json_path);
      SALA_CHECK(f, "cannot write '{}'", json_path.string());
      f << doc.dump(2) << "\n";
    }
    int rc = 0;
    if (!o->png.empty()) {
      fs::path speed = fs::path(o->png);
      speed.replace_filename(speed.stem().string() + "-speed" + speed.extension().string());
      const std::string cmd = "/usr/bin/python3 " + shell_quote((tools_dir() / "plot_needle.py").string()) + " " +
                              shell_quote(json_path.string()) + " --heatmap " + shell_quote(o->png) + " --speed " +
                              shell_quote(speed.string());
      if (std::system(cmd.c_str()) != 0) {
        std::fprintf(stderr, "error: plotting failed (needs /usr/bin/python3 with matplotlib: scripts/setup.sh)\n");
        rc = 1;
      } else {
        std::fprintf(stderr, "wrote %s and %s\n", o->png.c_str(), speed.string().c_str());
      }
    }
    if (!tmp_json.empty()) fs::remove(tmp_json);
    return rc;
  };
}

}  // namespace
SALA_COMMAND(needle, "Needle-in-a-haystack over context lengths and depths (found, speed, memory)", setup);
}  // namespace sala::cli
