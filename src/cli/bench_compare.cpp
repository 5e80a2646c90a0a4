#include "cli/bench_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_ceilings.h"
#include "cli/bench_timing.h"
#include "cli/random_model.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/memory.h"
#include "engine/roofline.h"

namespace sala::cli {

std::string FormatSpec::label(const std::string& dense) const {
  if (quant.format == WeightFormat::Dense) return dense;
  std::string s = quant.format == WeightFormat::FP8 ? "fp8" : quant.format == WeightFormat::Q8 ? "int8" : "int4";
  if (quant.group > 0) s += " g" + std::to_string(quant.group);
  if (quant.lm_head) s += " + lm_head";
  if (w8a8) s += ", W8A8 prefill";
  return s;
}

FormatSpec parse_format_spec(const std::string& text) {
  FormatSpec f{text, {}};
  auto fail_spec = [&](const std::string& why) {
    fail("bench --compare: '{}': {} (FORMAT[/gN][+lm][+w8a8]; formats bf16, fp8, int8, int4)", text, why);
  };
  // FORMAT[/gN], then each +suffix.
  std::vector<std::string> parts;
  for (size_t b = 0;;) {
    const size_t e = text.find('+', b);
    parts.push_back(text.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  bool lm = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i] != "lm" && parts[i] != "w8a8") fail_spec(fmt::format("unknown suffix '+{}'", parts[i]));
    bool& flag = parts[i] == "lm" ? lm : f.w8a8;
    if (flag) fail_spec(fmt::format("'+{}' twice", parts[i]));
    flag = true;
  }
  std::string name = parts[0];
  int64_t group = 0;
  if (const size_t slash = name.find('/'); slash != std::string::npos) {
    const std::string g = name.substr(slash + 1);
    name.resize(slash);
    const bool digits = g.size() > 1 && g.size() < 6 &&
                        std::all_of(g.begin() + 1, g.end(), [](unsigned char ch) { return std::isdigit(ch) != 0; });
    if (g.empty() || g[0] != 'g' || !digits) fail_spec(fmt::format("the group is written /gN (e.g. int4/g128), not '/{}'", g));
    group = std::stoll(g.substr(1));
    if (group != 32 && group != 64 && group != 128 && group != 256)
      fail_spec(fmt::format("group {} (known: 32, 64, 128, 256)", group));
  }
  if (name != "bf16" && name != "none" && name != "fp8" && name != "int8" && name != "int4")
    fail_spec(fmt::format("unknown format '{}'", name));
  f.quant = parse_random_quant(name);
  if (f.quant.format == WeightFormat::Dense && (lm || group || f.w8a8))
    fail_spec("bf16 has no groups, its lm_head is bf16 already and its prefill has no W8A8");
  if (group && f.quant.format == WeightFormat::FP8) fail_spec("fp8 has one scale per row");
  if (group) f.quant.group = group;
  f.quant.lm_head = lm;
  return f;
}

namespace {

struct Row {
  const FormatSpec* format;
  int64_t context;
  double weights_bytes = 0;
  double bytes_per_step = 0;  // what one decode step must move (engine/roofline.h): the SoL's numerator
  std::vector<double> prefill_tok_s, ms, gpu_ms;  // per round; prefill: the tokens since the previous context
};

}  // namespace

int run_format_comparison(Backend& backend, const CompareOptions& o) {
  SALA_CHECK(!o.formats.empty(), "bench --compare: no formats");
  SALA_CHECK(!o.contexts.empty(), "bench --compare: no contexts");
  SALA_CHECK(o.rounds >= 1, "bench --compare: --rounds must be at least 1, got {}", o.rounds);
  if (!o.json.empty()) {  // before the run, not after it
    std::ofstream probe(o.json);
    SALA_CHECK(probe, "bench --compare: cannot write '{}'", o.json);
  }
  std::vector<Row> rows;
  for (const auto& f : o.formats)
    for (int64_t ctx : o.contexts) rows.push_back({&f, ctx});
  const ModelLimits limits{.max_batch_tokens = o.chunk, .max_logit_rows = 1};
  std::string dense(dtype_name(backend.act_dtype()));  // what a dense model holds here: "bf16" (CUDA), "f32" (CPU)
  std::transform(dense.begin(), dense.end(), dense.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  const int64_t max_ctx = o.contexts.back() + int64_t(o.contexts.size()) * (o.steps + 2) + 1;
  // The speed of light of each row: its bytes per step at this machine's measured bandwidth.
  const double bandwidth = measure_bandwidth(backend, backend.name() != "cpu");
  backend.set_fp8_prefill_by_default(false);  // each row's label says its prefill, not the command line's default
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t fi = 0; fi < o.formats.size(); ++fi) {
      const FormatSpec& f = o.formats[fi];
      // W8A8 prompt products for this format only (the flags act on FP8 resp. int8/int4 weights).
      backend.set_fp8_prefill(f.w8a8 && f.quant.format == WeightFormat::FP8);
      backend.set_int8_prefill(f.w8a8 && f.quant.format != WeightFormat::FP8);
      LoadedModel m = random_model(o.preset, backend, limits, o.seed, f.quant);
      std::mt19937 rng(uint32_t(o.seed));  // every format decodes the same token ids
      std::uniform_int_distribution<int32_t> tok(5, m.config.vocab_size - 1);
      const TokenSource token = [&] { return tok(rng); };
      Engine e(*m.model, {.max_sequences = 1, .max_context = max_ctx});
      {  // warm-up: library handles, heuristics, lazy scratch
        const int w = e.open();
        prefill_to(e, backend, w, std::min(o.chunk, o.contexts.front()), o.chunk, token);
        e.close(w);
      }
      const int s = e.open();
      for (size_t ci = 0; ci < o.contexts.size(); ++ci) {
        const int64_t start = e.length(s);
        const double prefill_s = prefill_to(e, backend, s, o.contexts[ci], o.chunk, token);
        const int seq[] = {s};
        const DecodeTiming d = time_decode_steps(e, backend, seq, o.steps, token);
        Row& r = rows[fi * o.contexts.size() + ci];
        r.weights_bytes = weight_bytes(m.model->weights());
        r.bytes_per_step = decode_cost(m.config, o.contexts[ci], weight_bytes_per_param(m.config, m.model->weights()))
                               .bytes_per_step(1);
        r.prefill_tok_s.push_back(prefill_s > 0 ? double(o.contexts[ci] - start) / prefill_s : 0);
        r.ms.push_back(d.step_s * 1e3);
        r.gpu_ms.push_back(d.gpu_ms);
        std::fprintf(stderr, "round %d/%d  %-34s context %-8lld prefill %.0f tok/s, decode %.3f ms/step\n",
                     round + 1, o.rounds, f.label(dense).c_str(), (long long)o.contexts[ci], r.prefill_tok_s.back(),
                     d.step_s * 1e3);
      }
    }
  }
  backend.set_fp8_prefill(false);
  backend.set_int8_prefill(false);

  const std::string ref = o.formats.front().label(dense);
  std::printf("batch-1 prefill and decode on %s (%s), random %s weights, prompt chunks of %lld: %d round(s), %d timed "
              "decode steps per format and context; medians of the rounds\n",
              backend.device_name().c_str(), backend.name().c_str(), o.preset.c_str(), (long long)o.chunk, o.rounds,
              o.steps);
  const std::string x = "× " + ref;
  std::printf("speed of light (SoL): the step's bytes (weights as packed, states, K/V) at %.0f GB/s, an elementwise "
              "read + write measured in this run\n",
              bandwidth / 1e9);
  std::printf("%-36s %11s %8s %12s %8s  %-24s %9s %8s %9s %8s %8s %6s\n", "format", "weights MiB", "context",
              "prefill t/s", x.c_str(), "ms/step per round", "median", "gpu ms", "tok/s", x.c_str(), "SoL ms", "%SoL");
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    const Row& base = rows[size_t(&r - rows.data()) % o.contexts.size()];  // the first format, same context
    const double ms = median(r.ms), gpu = median(r.gpu_ms), ratio = median(base.ms) / ms;
    const double pf = median(r.prefill_tok_s), pf_base = median(base.prefill_tok_s);
    const double pf_ratio = pf_base > 0 ? pf / pf_base : 0;
    std::string per;
    for (double v : r.ms) per += fmt::format("{:.3f} ", v);
    const double sol_ms = r.bytes_per_step / bandwidth * 1e3;
    std::printf("%-36s %11.1f %8lld %12.0f %7.3fx  %-24s %9.3f %8s %9.1f %7.3fx %8.3f %5.1f%%\n",
                r.format->label(dense).c_str(), r.weights_bytes / double(1 << 20), (long long)r.context, pf, pf_ratio,
                per.c_str(), ms, gpu > 0 ? fmt::format("{:.3f}", gpu).c_str() : "-", 1e3 / ms, ratio, sol_ms,
                100.0 * sol_ms / ms);
    out.push_back({{"format", r.format->text}, {"label", r.format->label(dense)}, {"context", r.context},
                   {"weights_bytes", r.weights_bytes}, {"prefill_tok_s_rounds", r.prefill_tok_s},
                   {"prefill_tok_s", pf}, {"prefill_vs_first", pf_ratio}, {"ms_per_step_rounds", r.ms},
                   {"ms_per_step", ms}, {"gpu_ms_per_step", gpu}, {"decode_tok_s", 1e3 / ms}, {"speedup_vs_first", ratio},
                   {"bytes_per_step", r.bytes_per_step}, {"sol_ms_per_step", sol_ms}, {"pct_sol", 100.0 * sol_ms / ms}});
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    SALA_CHECK(f, "bench --compare: cannot write '{}'", o.json);
    f << nlohmann::json{{"preset", o.preset}, {"backend", backend.name()}, {"device", backend.device_name()},
                        {"rounds", o.rounds}, {"decode_steps", o.steps}, {"chunk", o.chunk}, {"reference", ref},
                        {"bandwidth_bytes_s", bandwidth},
                        {"rows", out}}
             .dump(2)
      << "\n";
  }
  return 0;
}

}  // namespace sala::cli
