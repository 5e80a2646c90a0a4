// Needle-in-a-haystack helpers: exact prompt lengths, needle placement at each depth (checked by
// tokenizing back), the answer matchers, and the greedy runner against replayed logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/needle.h"
#include "engine/replay.h"
#include "model/loader.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "tokenizer/tiny_tokenizer.h"

using namespace sala;
namespace fs = std::filesystem;

namespace {

const Tokenizer& tiny_tok() {
  static Tokenizer t = Tokenizer::from_json(make_tiny_tokenizer_json(512));
  return t;
}

ChatOptions no_think() {
  ChatOptions c;
  c.enable_thinking = false;
  return c;
}

// Every property the haystack promises, checked independently of how it was built.
void check_haystack(const Tokenizer& tok, const Haystack& h, const NeedleSpec& spec, int64_t target, double depth,
                    const ChatOptions& chat) {
  ASSERT_EQ(int64_t(h.prompt.size()), target);
  // Tokenizing the user message back through the chat template gives the same prompt.
  const ChatMessage msg{"user", h.user_text};
  EXPECT_EQ(encode_chat(tok, std::span(&msg, 1), chat), h.prompt);
  // The needle appears exactly once in the decoded prompt, and the reported token holds it.
  const std::string full = tok.decode(h.prompt);
  const size_t at = full.find(spec.needle);
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(full.find(spec.needle, at + 1), std::string::npos);
  ASSERT_GE(h.needle_token, 0);
  const size_t before = tok.decode(std::span(h.prompt).first(size_t(h.needle_token))).size();
  const size_t through = tok.decode(std::span(h.prompt).first(size_t(h.needle_token + 1))).size();
  EXPECT_LE(before, at);
  EXPECT_GT(through, at);
  // The question comes after the haystack, at the end of the user message.
  EXPECT_GT(full.find(spec.question), at);
  // Placement: at the requested depth of the haystack text, within the needle's own length plus
  // the move to a word start.
  ASSERT_GT(h.content_end, h.content_begin);
  const int64_t needle_len = int64_t(tok.encode(spec.needle, false).size());
  const double tol = 100.0 * double(needle_len + 8) / double(h.content_end - h.content_begin);
  EXPECT_NEAR(h.actual_depth, depth, tol) << "target " << target << " depth " << depth;
  if (depth == 0) {
    EXPECT_EQ(h.needle_token, h.content_begin);
  }
}

}  // namespace

TEST(Needle, ExactLengthsAndPlacementTinyTokenizer) {
  const NeedleSpec spec;
  for (int64_t target : {200, 256, 300, 512, 777, 1024, 2048})
    for (double depth : {0.0, 25.0, 50.0, 75.0, 95.0, 100.0}) {
      SCOPED_TRACE(testing::Message() << "target " << target << " depth " << depth);
      const Haystack h = build_haystack(tiny_tok(), default_filler_text(), spec, target, depth, no_think());
      check_haystack(tiny_tok(), h, spec, target, depth, no_think());
    }
}

TEST(Needle, DepthsAreOrdered) {
  const NeedleSpec spec;
  int64_t prev = -1;
  for (double depth : {0.0, 25.0, 50.0, 75.0, 95.0}) {
    const Haystack h = build_haystack(tiny_tok(), default_filler_text(), spec, 1024, depth, no_think());
    EXPECT_GT(h.needle_token, prev);
    prev = h.needle_token;
  }
}

TEST(Needle, CustomFillerNeedleAndThinkingTemplate) {
  NeedleSpec spec{"Zoe keeps the key under the blue pot.", "Where is the key?", "blue pot"};
  ChatOptions chat;  // thinking on, plus a system prompt
  chat.system_prompt = "You answer briefly.";
  const std::string filler = "abc def, ghi! jkl\n\tmno pqr stu vwx yz 0123 456 789 - ; : ? \"q\" ";
  for (int64_t target : {150, 333, 600})
    for (double depth : {0.0, 50.0, 95.0}) {
      SCOPED_TRACE(testing::Message() << "target " << target << " depth " << depth);
      check_haystack(tiny_tok(), build_haystack(tiny_tok(), filler, spec, target, depth, chat), spec, target, depth,
                     chat);
    }
}

TEST(Needle, RealTokenizerWhenPresent) {
  const fs::path dir = default_tokenizer_dir();
  if (dir.empty()) GTEST_SKIP() << "real tokenizer files not present";
  const Tokenizer tok = Tokenizer::load(dir);
  const NeedleSpec spec;
  for (int64_t target : {1000, 4096})
    for (double depth : {0.0, 50.0, 95.0}) {
      SCOPED_TRACE(testing::Message() << "target " << target << " depth " << depth);
      check_haystack(tok, build_haystack(tok, default_filler_text(), spec, target, depth, no_think()), spec, target,
                     depth, no_think());
    }
}

TEST(Needle, TooSmallOrBadDepthFails) {
  const NeedleSpec spec;
  EXPECT_THROW(build_haystack(tiny_tok(), default_filler_text(), spec, 20, 50, no_think()), Error);
  EXPECT_THROW(build_haystack(tiny_tok(), default_filler_text(), spec, 512, 101, no_think()), Error);
  EXPECT_THROW(build_haystack(tiny_tok(), "", spec, 512, 50, no_think()), Error);
}

TEST(Needle, Matchers) {
  EXPECT_TRUE(answer_matches("The number is 7481.", "7481", MatchMode::Contains));
  EXPECT_TRUE(answer_matches("BLUE Pot", "blue pot", MatchMode::Contains));
  EXPECT_FALSE(answer_matches("748 1", "7481", MatchMode::Contains));
  EXPECT_FALSE(answer_matches("", "7481", MatchMode::Contains));
  EXPECT_TRUE(answer_matches("  7481\n", "7481", MatchMode::Exact));
  EXPECT_FALSE(answer_matches("7481.", "7481", MatchMode::Exact));
  EXPECT_FALSE(answer_matches("Blue pot", "blue pot", MatchMode::Exact));
  EXPECT_TRUE(answer_matches("it is 7481!", "\\b7481\\b", MatchMode::Regex));
  EXPECT_FALSE(answer_matches("it is 74812", "\\b7481\\b", MatchMode::Regex));
  EXPECT_TRUE(answer_matches("Under the BLUE pot", "(?:blue|BLUE) pot", MatchMode::Regex));
  EXPECT_THROW(answer_matches("x", "(unclosed", MatchMode::Regex), Error);
  EXPECT_EQ(parse_match_mode("regex"), MatchMode::Regex);
  EXPECT_STREQ(match_mode_name(MatchMode::Exact), "exact");
  EXPECT_THROW(parse_match_mode("fuzzy"), Error);
}

TEST(Needle, GreedyRunMatchesReplayArgmax) {
  const fs::path d = fs::temp_directory_path() / ("sala_needle_test_" + std::to_string(::getpid()));
  write_random_checkpoint(d, preset_config("tiny"), {.seed = 3, .dtype = DType::F32});
  CpuBackend backend{2};
  LoadedModel m = load_model(d.string(), backend, {.max_batch_tokens = 300, .max_logit_rows = 300});
  const Haystack h = build_haystack(tiny_tok(), default_filler_text(), NeedleSpec{}, 280, 50, no_think());
  Engine engine(*m.model, {.max_sequences = 1, .max_context = 300});
  GreedyRunOptions opt;
  opt.chunk = 64;
  opt.max_new_tokens = 6;  // no stop ids: exactly 6 tokens
  int64_t last_done = 0, forwards = 0;
  opt.on_prefill = [&](int64_t done, int64_t total) {
    EXPECT_GT(done, last_done);
    EXPECT_EQ(total, 280);
    EXPECT_EQ(forwards, (done + 63) / 64);  // on_forward runs first, once per chunk
    last_done = done;
  };
  // Where `sala needle` samples device memory: after every forward, prefill chunks and decode steps.
  opt.on_forward = [&] { ++forwards; };
  const GreedyRunResult r = greedy_run(engine, h.prompt, opt);
  EXPECT_EQ(last_done, 280);
  ASSERT_EQ(r.output.size(), 6u);
  EXPECT_EQ(r.decode_steps, 5);
  EXPECT_EQ(forwards, 5 + 5);  // ceil(280 / 64) prefill chunks + 5 decode steps
  EXPECT_GT(r.prefill_seconds, 0);
  EXPECT_GT(r.decode_seconds, 0);
  // The same tokens replayed: each output token is the argmax of the logits before it.
  std::vector<int32_t> all = h.prompt;
  all.insert(all.end(), r.output.begin(), r.output.end());
  auto logits = replay(engine, {all}, {int64_t(h.prompt.size()), 64, true});
  const int V = m.config.vocab_size;
  for (size_t i = 0; i < r.output.size(); ++i) {
    const float* row = logits[0].data() + (h.prompt.size() - 1 + i) * size_t(V);
    EXPECT_EQ(int32_t(std::max_element(row, row + V) - row), r.output[i]) << "token " << i;
  }
  EXPECT_GT(peak_rss_bytes(), 0);
  fs::remove_all(d);
}
