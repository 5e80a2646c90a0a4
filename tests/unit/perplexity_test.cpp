// Sliding-window perplexity on a tiny random checkpoint equals the value computed directly from
// replayed logits, for overlapping (stride < ctx) and disjoint (stride == ctx) windows.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/perplexity.h"
#include "engine/replay.h"
#include "model/loader.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"

using namespace sala;
namespace fs = std::filesystem;

namespace {

struct Tiny {
  fs::path dir = fs::temp_directory_path() / ("sala_ppl_test_" + std::to_string(::getpid()));
  CpuBackend backend{2};
  LoadedModel m;
  Tiny() {
    write_random_checkpoint(dir, preset_config("tiny"), {.seed = 11, .dtype = DType::F32});
    m = load_model(dir.string(), backend, {.max_batch_tokens = 128, .max_logit_rows = 128});
  }
  ~Tiny() { fs::remove_all(dir); }
};

Tiny& tiny() {
  static Tiny t;
  return t;
}

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(5, 511);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

// The recipe written out from scratch: every window replayed in full, its logits scored in double.
double reference_nll(Engine& e, const std::vector<int32_t>& ids, int64_t ctx, int64_t stride, int64_t* scored,
                     int64_t* windows) {
  const int V = e.model().config().vocab_size;
  const int64_t n = int64_t(ids.size());
  double sum = 0;
  *scored = 0;
  *windows = 0;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < n; begin += stride) {
    const int64_t end = std::min(begin + ctx, n);
    std::vector<int32_t> w(ids.begin() + begin, ids.begin() + end);
    auto logits = replay(e, {w}, {-1, 0, true})[0];
    bool any = false;
    for (int64_t t = std::max(prev_end, begin + 1); t < end; ++t) {  // target t, scored from row t-1
      const float* row = logits.data() + size_t(t - 1 - begin) * size_t(V);
      double mx = -1e300, z = 0;
      for (int v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      for (int v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
      sum += std::log(z) + mx - double(row[ids[size_t(t)]]);
      ++*scored;
      any = true;
    }
    *windows += any;
    prev_end = end;
    if (end == n) break;
  }
  return sum / double(*scored);
}

void check(int n, int64_t ctx, int64_t stride, int64_t chunk) {
  SCOPED_TRACE(testing::Message() << "n " << n << " ctx " << ctx << " stride " << stride << " chunk " << chunk);
  Engine e(*tiny().m.model, {.max_sequences = 1, .max_context = ctx});
  const auto ids = random_tokens(n, uint32_t(n + ctx + stride));
  int64_t scored = 0, windows = 0;
  const double ref = reference_nll(e, ids, ctx, stride, &scored, &windows);
  int calls = 0;
  PerplexityOptions o;
  o.ctx = ctx;
  o.stride = stride;
  o.chunk = chunk;
  o.progress = [&](int64_t w, int64_t total, int64_t, double) {
    ++calls;
    EXPECT_EQ(w, calls);
    EXPECT_EQ(total, windows);
  };
  const PerplexityResult r = perplexity(e, ids, o);
  // Overlapping windows score every token after the first once; disjoint ones also skip each
  // window's first token (HF recipe: it has no context in its window).
  if (stride < ctx) EXPECT_EQ(r.tokens, n - 1);
  EXPECT_EQ(r.tokens, scored);
  EXPECT_EQ(r.windows, windows);
  EXPECT_EQ(calls, windows);
  EXPECT_NEAR(r.nll, ref, 1e-4 * std::abs(ref));
  EXPECT_NEAR(r.ppl, std::exp(ref), 1e-3 * std::exp(ref));
  EXPECT_GT(r.nll, 0);
}

}  // namespace

TEST(Perplexity, Windows) {
  // HF recipe, n=10 ctx=4 stride=2: [0,4) scores 1..3, [2,6) scores 4..5, [4,8) 6..7, [6,10) 8..9.
  auto w = perplexity_windows(10, 4, 2);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[0].begin, 0);
  EXPECT_EQ(w[0].score_from, 1);
  EXPECT_EQ(w[1].begin, 2);
  EXPECT_EQ(w[1].score_from, 4);
  EXPECT_EQ(w[3].end, 10);
  EXPECT_EQ(w[3].score_from, 8);
  auto d = perplexity_windows(10, 4, 4);  // disjoint: [0,4) [4,8) [8,10)
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[1].score_from, 5);  // HF: a window's first token has no context, so it is not scored
  EXPECT_EQ(d[2].end, 10);
  EXPECT_THROW(perplexity_windows(10, 4, 5), Error);
  EXPECT_THROW(perplexity_windows(10, 1, 1), Error);
}

TEST(Perplexity, TokenNll) {
  std::vector<float> row{0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_NEAR(token_nll(row, 2), std::log(4.0), 1e-12);
  row = {1000.0f, 0.0f};
  EXPECT_NEAR(token_nll(row, 0), 0.0, 1e-12);
}

TEST(Perplexity, OverlappingWindowsMatchReplay) { check(200, 64, 24, 0); }
TEST(Perplexity, OverlappingWindowsChunked) { check(150, 96, 40, 32); }
TEST(Perplexity, DisjointWindowsMatchReplay) { check(200, 64, 64, 0); }
TEST(Perplexity, SingleWindow) { check(50, 64, 64, 16); }
