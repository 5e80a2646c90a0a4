// `sala bench --speculative-costs`: what one speculative round costs next to a plain decode step,
// at batch 1 and each context (docs/speculative.md, "Costs"), and the speedup that predicts.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace sala::cli {

struct SpeculativeCostOptions {
  bool on = false;
  int draft_layers = 8;      // self-draft depth (clamped to the model)
  int max_draft_tokens = 8;  // K = 1 .. this
  void add(CLI::App& app);
  int64_t verify_rows() const { return int64_t(max_draft_tokens) + 1; }  // tokens/logit rows of the largest verify
};

// Grows one sequence through `contexts` (prefill in `chunk`-token forwards) and at each measures,
// with device-synchronised medians of `reps` runs after 2 warm-ups: a plain decode step, the
// verify of K + 1 tokens (snapshot + forward with every logit row + Engine::rollback) for every K,
// and one self-draft forward. Prints the table and writes the rows to `json_path` (if not empty).
// The model's limits must allow verify_rows() tokens and logit rows per forward.
int run_speculative_costs(Model& model, const std::string& model_name, const SpeculativeCostOptions& o,
                          const std::vector<int64_t>& contexts, int64_t chunk, int reps, uint64_t seed,
                          const std::string& json_path);

}  // namespace sala::cli
