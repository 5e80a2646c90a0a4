#include "cli/bench_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_timing.h"
#include "cli/random_model.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/memory.h"

namespace sala::cli {

std::string FormatSpec::label(const std::string& dense) const {
  if (quant.format == WeightFormat::Dense) return dense;
  std::string s = quant.format == WeightFormat::FP8 ? "fp8" : quant.format == WeightFormat::Q8 ? "int8" : "int4";
  if (quant.group > 0) s += " g" + std::to_string(quant.group);
  if (quant.lm_head) s += " + lm_head";
  return s;
}

FormatSpec parse_format_spec(const std::string& text) {
  FormatSpec f{text, {}};
  std::string rest = text;
  const bool lm = rest.size() > 3 && rest.ends_with("+lm");
  if (lm) rest.resize(rest.size() - 3);
  int64_t group = 0;
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    const std::string g = rest.substr(slash + 1);
    rest.resize(slash);
    const bool ok = g.size() > 1 && g[0] == 'g' && std::all_of(g.begin() + 1, g.end(), [](unsigned char ch) { return std::isdigit(ch) != 0; }) && g.size() < 6;
    SALA_CHECK(ok, "bench --compare: '{}': the group is written /gN (e.g. int4/g128), not '/{}'", text, g);
    group = std::stoll(g.substr(1));
    SALA_CHECK(group == 32 || group == 64 || group == 128 || group == 256,
               "bench --compare: '{}': group {} (known: 32, 64, 128, 256)", text, group);
  }
  SALA_CHECK(rest == "bf16" || rest == "none" || rest == "fp8" || rest == "int8" || rest == "int4",
             "bench --compare: unknown format '{}' in '{}' (known: bf16, fp8, int8, int4, as FORMAT[/gN][+lm])", rest,
             text);
  f.quant = parse_random_quant(rest);
  SALA_CHECK(f.quant.format != WeightFormat::Dense || (!lm && group == 0),
             "bench --compare: '{}': bf16 has no groups and its lm_head is bf16 already", text);
  SALA_CHECK(group == 0 || f.quant.format != WeightFormat::FP8, "bench --compare: '{}': fp8 has one scale per row",
             text);
  if (group) f.quant.group = group;
  f.quant.lm_head = lm;
  return f;
}

namespace {

struct Row {
  const FormatSpec* format;
  int64_t context;
  double weights_bytes = 0;
  std::vector<double> ms, gpu_ms;  // per round
};

}  // namespace

int run_format_comparison(Backend& backend, const CompareOptions& o) {
  SALA_CHECK(!o.formats.empty(), "bench --compare: no formats");
  SALA_CHECK(!o.contexts.empty(), "bench --compare: no contexts");
  SALA_CHECK(o.rounds >= 1, "bench --compare: --rounds must be at least 1, got {}", o.rounds);
  std::vector<Row> rows;
  for (const auto& f : o.formats)
    for (int64_t ctx : o.contexts) rows.push_back({&f, ctx});
  const ModelLimits limits{.max_batch_tokens = o.chunk, .max_logit_rows = 1};
  std::string dense(dtype_name(backend.act_dtype()));  // what a dense model holds here: "bf16" (CUDA), "f32" (CPU)
  std::transform(dense.begin(), dense.end(), dense.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  const int64_t max_ctx = o.contexts.back() + int64_t(o.contexts.size()) * (o.steps + 2) + 1;
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t fi = 0; fi < o.formats.size(); ++fi) {
      const FormatSpec& f = o.formats[fi];
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
        prefill_to(e, backend, s, o.contexts[ci], o.chunk, token);
        const int seq[] = {s};
        const DecodeTiming d = time_decode_steps(e, backend, seq, o.steps, token);
        Row& r = rows[fi * o.contexts.size() + ci];
        r.weights_bytes = weight_bytes(m.model->weights());
        r.ms.push_back(d.step_s * 1e3);
        r.gpu_ms.push_back(d.gpu_ms);
        std::fprintf(stderr, "round %d/%d  %-22s context %-8lld %.3f ms/step\n", round + 1, o.rounds,
                     f.label(dense).c_str(), (long long)o.contexts[ci], d.step_s * 1e3);
      }
    }
  }

  const std::string ref = o.formats.front().label(dense);
  std::printf("batch-1 decode on %s (%s), random %s weights: %d round(s) of %d timed steps per format and context\n",
              backend.device_name().c_str(), backend.name().c_str(), o.preset.c_str(), o.rounds, o.steps);
  std::printf("%-24s %11s %8s  %-24s %9s %8s %9s %9s\n", "format", "weights MiB", "context", "ms/step per round",
              "median", "gpu ms", "tok/s", ("× " + ref).c_str());
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    const Row& base = rows[size_t(&r - rows.data()) % o.contexts.size()];  // the first format, same context
    const double ms = median(r.ms), gpu = median(r.gpu_ms), ratio = median(base.ms) / ms;
    std::string per;
    for (double v : r.ms) per += fmt::format("{:.3f} ", v);
    std::printf("%-24s %11.1f %8lld  %-24s %9.3f %8s %9.1f %8.3fx\n", r.format->label(dense).c_str(),
                r.weights_bytes / double(1 << 20), (long long)r.context, per.c_str(), ms,
                gpu > 0 ? fmt::format("{:.3f}", gpu).c_str() : "-", 1e3 / ms, ratio);
    out.push_back({{"format", r.format->text}, {"label", r.format->label(dense)}, {"context", r.context},
                   {"weights_bytes", r.weights_bytes}, {"ms_per_step_rounds", r.ms}, {"ms_per_step", ms},
                   {"gpu_ms_per_step", gpu}, {"decode_tok_s", 1e3 / ms}, {"speedup_vs_first", ratio}});
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    SALA_CHECK(f, "bench --compare: cannot write '{}'", o.json);
    f << nlohmann::json{{"preset", o.preset}, {"backend", backend.name()}, {"device", backend.device_name()},
                        {"rounds", o.rounds}, {"decode_steps", o.steps}, {"chunk", o.chunk}, {"reference", ref},
                        {"rows", out}}
             .dump(2)
      << "\n";
  }
  return 0;
}

}  // namespace sala::cli
