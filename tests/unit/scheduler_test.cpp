// Continuous-batching fairness of the Scheduler (tiny random model, CPU): while a long prompt is
// prefilled in chunks, a sequence that is already decoding gets one token in every step — the
// prompt neither stalls it nor is prefilled in one go — also when the step's token budget is
// tight; and the decode stream is the same as when it runs alone.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "test_helpers.h"

using namespace sala;
namespace fs = std::filesystem;

namespace {

fs::path tiny_checkpoint() { return test::tiny_checkpoint("sched_test", 5); }

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(5, 500);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

struct Stream {
  std::vector<int32_t> tokens;
  bool finished = false;
};

GenerationRequest request(std::vector<int32_t> prompt, int max_tokens, Stream& s) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.on_token = [&s](const SampledToken& t) {
    s.tokens.push_back(t.id);
    return true;
  };
  r.on_finish = [&s](FinishReason) { s.finished = true; };
  return r;
}

struct Fixture {
  CpuBackend backend{2, /*batch_invariant=*/true};
  LoadedModel m;
  Fixture() { m = load_model(tiny_checkpoint().string(), backend, {.max_batch_tokens = 512, .max_logit_rows = 8}); }
};

// A decodes; then B's prompt of `prompt_len` tokens arrives. Returns the steps B needed until its
// first token, checking that A got exactly one token in each of them.
int decode_while_prefilling(Fixture& f, int64_t prefill_chunk, int64_t batch_tokens, int prompt_len,
                            std::vector<int32_t>* a_tokens) {
  Engine e(*f.m.model, {.max_sequences = 2, .max_context = 1024});
  Scheduler sch(e, {.prefill_chunk = prefill_chunk, .max_batch_tokens = batch_tokens});
  Stream a, b;
  sch.submit(request(random_tokens(10, 1), 200, a));
  // A's prompt fits one chunk: its first token comes with the first step.
  EXPECT_TRUE(sch.step());
  EXPECT_EQ(a.tokens.size(), 1u);
  sch.submit(request(random_tokens(prompt_len, 2), 4, b));
  int steps = 0;
  while (b.tokens.empty()) {
    const size_t before = a.tokens.size();
    EXPECT_TRUE(sch.step());
    ++steps;
    EXPECT_EQ(a.tokens.size(), before + 1) << "A emitted no token in step " << steps << " of B's prefill";
    if (steps > prompt_len) {
      ADD_FAILURE() << "B never finished its prefill";
      break;
    }
  }
  EXPECT_FALSE(a.finished);
  sch.run();
  EXPECT_TRUE(a.finished && b.finished);
  EXPECT_EQ(b.tokens.size(), 4u);
  if (a_tokens) *a_tokens = a.tokens;
  return steps;
}

}  // namespace

TEST(Scheduler, RunningSequenceDecodesEveryStepWhileALongPromptPrefillsInChunks) {
  Fixture f;
  // 200 prompt tokens in chunks of 16: 13 steps, each also carrying A's decode row.
  std::vector<int32_t> mixed;
  const int steps = decode_while_prefilling(f, 16, 512, 200, &mixed);
  EXPECT_EQ(steps, 13);
  // Sharing the steps with B changes nothing in A's greedy stream (batch-invariant CPU backend).
  Engine e(*f.m.model, {.max_sequences = 2, .max_context = 1024});
  Scheduler sch(e, {.prefill_chunk = 16, .max_batch_tokens = 512});
  Stream alone;
  sch.submit(request(random_tokens(10, 1), 200, alone));
  sch.run();
  EXPECT_EQ(alone.tokens, mixed);
}

TEST(Scheduler, DecodeRowsComeFirstWhenTheStepBudgetIsTight) {
  Fixture f;
  // 17 tokens a step: A's decode row first, then 16 of B's prompt (the chunk limit is 64), so
  // 160 prompt tokens take 10 steps and A never waits.
  EXPECT_EQ(decode_while_prefilling(f, 64, 17, 160, nullptr), 10);
}

TEST(Scheduler, ALongPromptAloneUsesWholeChunks) {
  // Control for the tests above: with no sequence decoding, the prompt takes ceil(200 / 16) steps.
  Fixture f;
  Engine e(*f.m.model, {.max_sequences = 2, .max_context = 1024});
  Scheduler sch(e, {.prefill_chunk = 16, .max_batch_tokens = 512});
  Stream b;
  sch.submit(request(random_tokens(200, 2), 1, b));
  int steps = 0;
  while (b.tokens.empty() && steps < 100) {
    sch.step();
    ++steps;
  }
  EXPECT_EQ(steps, 13);
  EXPECT_EQ(sch.stats().prompt_tokens, 200);
}
