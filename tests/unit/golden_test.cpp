// The CPU engine against the golden logits of the independent PyTorch reference
// (tests/golden/, made by tests/reference/make_goldens.py): relative error < 1e-4, same top-1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/npy.h"
#include "engine/replay.h"
#include "model/loader.h"

using namespace sala;
namespace fs = std::filesystem;

namespace {

const fs::path kGolden = fs::path(SALA_TEST_DATA) / "golden";

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  if (fs::exists(kGolden))
    for (auto& e : fs::directory_iterator(kGolden))
      if (fs::exists(e.path() / "case.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, CpuEngineMatchesReference) {
  const fs::path dir = kGolden / GetParam();
  nlohmann::json c = nlohmann::json::parse(std::ifstream(dir / "case.json"));
  std::vector<std::vector<int32_t>> seqs;
  int64_t longest = 0;
  for (auto& s : c["seq"]) {
    seqs.push_back(s["tokens"].get<std::vector<int32_t>>());
    longest = std::max<int64_t>(longest, int64_t(seqs.back().size()));
  }
  const int64_t chunk = c["chunk"].get<int64_t>();
  CpuBackend backend(2);
  const int64_t rows = chunk * int64_t(seqs.size());
  LoadedModel m = load_model((kGolden / c["model"].get<std::string>()).string(), backend,
                             {.max_batch_tokens = rows, .max_logit_rows = rows});
  Engine engine(*m.model, {.max_sequences = int(seqs.size()), .max_context = longest});
  auto logits = replay(engine, seqs, {c["prefill"].get<int64_t>(), chunk, c["regime"] == "final"});

  const size_t V = size_t(m.config.vocab_size);
  for (size_t si = 0; si < seqs.size(); ++si) {
    const auto& s = c["seq"][si];
    NpyArray golden = read_npy(dir / s["logits"].get<std::string>());
    const auto stored = s["rows"].get<std::vector<int64_t>>();
    ASSERT_EQ(golden.shape, (Shape{int64_t(stored.size()), int64_t(V)}));
    ASSERT_EQ(logits[si].size(), seqs[si].size() * V);
    int top1_mismatch = 0;
    for (size_t r = 0; r < stored.size(); ++r) {
      const float* got = logits[si].data() + size_t(stored[r]) * V;
      const float* want = golden.data.data() + r * V;
      float max_diff = 0, max_ref = 0;
      for (size_t v = 0; v < V; ++v) {
        max_diff = std::max(max_diff, std::fabs(got[v] - want[v]));
        max_ref = std::max(max_ref, std::fabs(want[v]));
      }
      EXPECT_LT(max_diff / max_ref, 1e-4) << "sequence " << si << " position " << stored[r];
      top1_mismatch += std::max_element(got, got + V) - got != std::max_element(want, want + V) - want;
    }
    EXPECT_EQ(top1_mismatch, 0) << "sequence " << si;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Golden, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Golden);

TEST(GoldenFiles, Present) {
  // The goldens are committed; their absence would silently turn the parity test into nothing.
  EXPECT_GE(case_names().size(), 7u) << "tests/golden has no cases: run tests/reference/make_goldens.py";
}

}  // namespace
