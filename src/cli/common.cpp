#include "cli/common.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "core/error.h"

namespace sala::cli {

void BackendOptions::add(CLI::App& app) {
  app.add_option("--backend", backend, "cpu, cuda, or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("-t,--threads", threads, "CPU threads (0: all cores)");
  app.add_flag("--deterministic", deterministic,
               "batch-invariant numerics: a sequence's output does not depend on the other sequences decoded "
               "with it, the thread count or speculation (CPU: slower prefill; CUDA: fixed decode kernels, slower decode)");
  auto* fp8 = app.add_flag("--fp8-prefill", fp8_prefill,
                           "FP8 checkpoints: prefill products (65+ rows) quantize each activation row to e4m3 and run on "
                           "fp8 tensor cores (W8A8: faster prefill, a little more error; decode batches of up to 64 rows "
                           "stay weight-only). The default where the GPU has fp8 tensor cores (compute capability 8.9+)");
  app.add_flag("--no-fp8-prefill", no_fp8_prefill,
               "FP8 checkpoints: weight-only prefill (bf16 activations) even on fp8 tensor cores")
      ->excludes(fp8);
  app.add_flag("--int8-prefill", int8_prefill,
               "int8 and int4 checkpoints: prefill products (65+ rows) quantize each activation row to int8 and run on "
               "int8 tensor cores (W8A8; int4 and grouped int8 weights requantized per row to int8; decode batches of up "
               "to 64 rows stay weight-only)");
}

std::unique_ptr<Backend> BackendOptions::make() const {
  std::string name = backend;
  if (name == "auto") {
    auto names = available_backends();
    name = std::find(names.begin(), names.end(), "cuda") != names.end() ? "cuda" : "cpu";
  }
  auto b = make_backend(name, threads, deterministic);
  if (fp8_prefill || (!no_fp8_prefill && b->native_fp8())) {
    b->set_fp8_prefill(true);
    b->set_fp8_prefill_by_default(!fp8_prefill);
  }
  if (int8_prefill) b->set_int8_prefill(true);
  return b;
}

void print_weight_notes(const ModelConfig& config, const ModelWeights& w, Backend& backend) {
  // Quantized checkpoints: say how the matrices are held (packed, or anything dequantized).
  if (w.lm_head.packed() || (!w.layers.empty() && w.layers[0].gate.packed()) || !w.dequantized.empty())
    std::fprintf(stderr, "weights on %s: %s\n", backend.name().c_str(), describe_weight_formats(config, w).c_str());
  bool fp8 = w.lm_head.format == WeightFormat::FP8;
  for (const auto& l : w.layers) fp8 = fp8 || l.gate.format == WeightFormat::FP8 || l.o.format == WeightFormat::FP8;
  if (fp8 && backend.fp8_prefill())
    std::fprintf(stderr, "fp8 prefill: on%s (products of %lld+ rows quantize activations to e4m3 per row)\n",
                 backend.fp8_prefill_by_default() ? " by default on fp8 tensor cores; --no-fp8-prefill: weight-only" : "",
                 static_cast<long long>(kW8A8PrefillMinRows));
  else if (fp8)
    std::fprintf(stderr, "fp8 prefill: off (weight-only prompt products: bf16 activations%s)\n",
                 backend.native_fp8() ? "" : "; this backend has no fp8 tensor cores");
  else if (backend.fp8_prefill() && !backend.fp8_prefill_by_default())
    std::fprintf(stderr, "warning: --fp8-prefill has no effect: the model has no FP8 weights\n");
  if (backend.int8_prefill()) {
    int exact = 0, requantized = 0;
    auto count = [&](const Weight& m) {
      if (m.format == WeightFormat::Q8 && m.group == m.in()) ++exact;
      else if (m.format == WeightFormat::Q8 || m.format == WeightFormat::Q4) ++requantized;
    };
    count(w.lm_head);
    for (const auto& l : w.layers)
      for (const Weight* m : {&l.q, &l.k, &l.v, &l.z, &l.o_gate, &l.o, &l.gate, &l.up, &l.down}) count(*m);
    if (exact + requantized == 0)
      std::fprintf(stderr, "warning: --int8-prefill has no effect: the model has no int8 or int4 weights\n");
    else
      std::fprintf(stderr, "int8 prefill: on for %d int8 matrices (exact) and %d int4 / grouped int8 matrices "
                           "(requantized per row to int8); products of %lld+ rows quantize activations to int8 per row\n",
                   exact, requantized, static_cast<long long>(kW8A8PrefillMinRows));
  }
}

LoadedModel load_model_verbose(const std::string& ref, Backend& backend, ModelLimits limits) {
  LoadedModel m = load_model(ref, backend, limits);
  if (m.config.random_weights) std::fprintf(stderr, "%s\n", kRandomWeightsNotice);
  print_weight_notes(m.config, m.model->weights(), backend);
  return m;
}

int64_t parse_size(std::string s) {
  SALA_CHECK(!s.empty(), "empty size (examples: 4096, 4k, 1m)");
  const std::string given = s;
  int64_t mult = 1;
  const char last = char(std::tolower(static_cast<unsigned char>(s.back())));
  if (last == 'k') mult = 1024, s.pop_back();
  else if (last == 'm') mult = 1024 * 1024, s.pop_back();
  int64_t v = 0;
  size_t used = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::logic_error&) {  // invalid_argument, out_of_range
    fail("bad size '{}' (examples: 4096, 4k, 1m)", given);
  }
  SALA_CHECK(used == s.size() && v > 0 && v <= std::numeric_limits<int64_t>::max() / mult,
             "bad size '{}' (examples: 4096, 4k, 1m)", given);
  return v * mult;
}

}  // namespace sala::cli
