// Speculative decoding (spec §6): exact rollback of lightning states and KV pages; speculation
// inside the continuous-batching Scheduler with several concurrent requests (some prefilling while
// others verify) giving output identical to plain greedy decoding (self-draft and prompt lookup,
// dense and sparse regimes); and exact target-distribution sampling at temperature > 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "model/loader.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "test_helpers.h"

using namespace sala;
namespace fs = std::filesystem;

namespace {

fs::path tiny_checkpoint() { return test::tiny_checkpoint("spec_test", 11); }

using test::random_tokens;
using test::rel_err;

struct Fixture {
  CpuBackend backend{2, /*batch_invariant=*/true};
  LoadedModel m;
  Fixture() { m = load_model(tiny_checkpoint().string(), backend, {.max_batch_tokens = 512, .max_logit_rows = 64}); }
  int vocab() const { return m.config.vocab_size; }
  std::vector<float> feed(Engine& e, int s, std::span<const int32_t> t, int64_t regime = -1, bool all = false) {
    Engine::Request r{s, t, regime, all};
    return e.step(std::span(&r, 1))[0];
  }
};

// Logits of `next` after prompt + kept tokens, once through speculation + rollback (verify of
// `verify` tokens, keep the first `keep`; optionally a self-draft pass first) and once plainly.
void check_rollback(int prompt_len, int keep, bool draft_pass) {
  Fixture f;
  const auto prompt = random_tokens(prompt_len, f.vocab(), 3);
  const auto verify = random_tokens(5, f.vocab(), 4);
  const int32_t next = 77;
  std::vector<float> spec, plain;
  {
    Engine e(*f.m.model, {.max_sequences = 1, .max_context = 1024});
    const int s = e.open();
    f.feed(e, s, prompt, prompt_len);
    e.begin_speculation(s);
    if (draft_pass) {
      for (int i = 0; i < 3; ++i) {
        Engine::Request r{s, std::span(&verify[size_t(i)], 1)};
        e.step(std::span(&r, 1), 2);
      }
      e.rollback(s, prompt_len);
      ASSERT_EQ(e.length(s), prompt_len);
    }
    f.feed(e, s, verify, -1, true);
    e.rollback(s, prompt_len + keep);
    ASSERT_EQ(e.length(s), prompt_len + keep);
    spec = f.feed(e, s, std::span(&next, 1));
  }
  {
    Engine e(*f.m.model, {.max_sequences = 1, .max_context = 1024});
    const int s = e.open();
    f.feed(e, s, prompt, prompt_len);
    if (keep > 0) f.feed(e, s, std::span(verify).first(size_t(keep)));
    plain = f.feed(e, s, std::span(&next, 1));
  }
  EXPECT_LT(rel_err(spec, plain), 1e-6) << "prompt " << prompt_len << " keep " << keep << " draft " << draft_pass;
}

struct Generated {
  std::vector<int32_t> tokens;
  FinishReason why = FinishReason::Cancelled;
};

GenerationRequest make_request(std::vector<int32_t> prompt, SamplingParams p, int max_tokens, Generated& out,
                               bool ignore_eos = true) {
  GenerationRequest req;
  req.prompt = std::move(prompt);
  req.sampling = p;
  req.max_tokens = max_tokens;
  req.ignore_eos = ignore_eos;
  req.on_token = [&out](const SampledToken& t) {
    out.tokens.push_back(t.id);
    return true;
  };
  req.on_finish = [&out](FinishReason r) { out.why = r; };
  return req;
}

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 0;
  bool ignore_eos = true;
};

// Runs every job through one Scheduler of `max_sequences` sequences: jobs beyond that wait for a
// free sequence, and prompts longer than `prefill_chunk` prefill over several steps, packed with
// the decode/verify rows of the others.
std::vector<Generated> run_jobs(Fixture& f, const std::vector<Job>& jobs, int max_sequences, SpeculativeOptions spec,
                                SchedulerStats* stats = nullptr, int64_t prefill_chunk = 32) {
  Engine e(*f.m.model, {.max_sequences = max_sequences, .max_context = 1024});
  Scheduler sch(e, {.prefill_chunk = prefill_chunk, .max_batch_tokens = 512, .speculative = spec});
  std::vector<Generated> out(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i)
    sch.submit(make_request(jobs[i].prompt, jobs[i].sampling, jobs[i].max_tokens, out[i], jobs[i].ignore_eos));
  sch.run();
  if (stats) *stats = sch.stats();
  return out;
}

Generated plain_generate(Fixture& f, const Job& job) {
  return run_jobs(f, {job}, 1, {}, nullptr, 256)[0];
}

}  // namespace

TEST(Speculative, CpuLightningRollbackMatchesRecurrence) {
  CpuBackend be(2);
  CacheSpec spec;
  spec.lightning_layers = 2;
  spec.lightning_heads = 4;
  spec.lightning_dim = 8;
  spec.log_decay = {-0.7f, -0.3f, -0.05f, -1.9f};
  spec.max_slots = 3;
  be.create_caches(spec);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int d = 8, Hkv = 2, keep = 5;
  for (int l = 0; l < 2; ++l)
    for (int i = 0; i < 4 * d * d; ++i) be.state(1, l)[i] = nd(rng);
  std::vector<float> k(size_t(7 * Hkv * d)), v(k.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  Mat K{k.data(), DType::F32, 7, Hkv * d}, V{v.data(), DType::F32, 7, Hkv * d};
  be.lightning_rollback(1, 0, 1, K, V, keep);
  for (int h = 0; h < 4; ++h) {
    const double g = std::exp(double(spec.log_decay[size_t(h)]));
    std::vector<double> S(be.state(1, 1) + h * d * d, be.state(1, 1) + (h + 1) * d * d);
    for (int j = 0; j < keep; ++j)
      for (int a = 0; a < d; ++a)
        for (int b = 0; b < d; ++b)
          S[size_t(a * d + b)] = g * S[size_t(a * d + b)] + double(k[size_t(j * Hkv * d + (h / 2) * d + a)]) *
                                                                 v[size_t(j * Hkv * d + (h / 2) * d + b)];
    for (int i = 0; i < d * d; ++i)
      EXPECT_NEAR(be.state(0, 1)[h * d * d + i], S[size_t(i)], 1e-5 * (1 + std::abs(S[size_t(i)])));
  }
  be.lightning_rollback(0, 0, 1, K, V, 0);  // keep 0 = the snapshot itself
  for (int i = 0; i < 4 * d * d; ++i) EXPECT_EQ(be.state(0, 0)[i], be.state(1, 0)[i]);
}

TEST(Speculative, RollbackEqualsNeverSeeingRejectedTokensDense) {
  for (int keep : {0, 1, 3, 5}) check_rollback(40, keep, false);
  check_rollback(40, 2, true);
}

TEST(Speculative, RollbackEqualsNeverSeeingRejectedTokensSparse) {
  // 318 + 5 crosses the page boundary at 320 (and K1/K2 chunk ends): pages and chunks are recut.
  for (int keep : {0, 1, 2, 4}) check_rollback(318, keep, false);
  check_rollback(318, 1, true);
}

TEST(Speculative, RollbackNeedsTheVerifyCapture) {
  Fixture f;
  Engine e(*f.m.model, {.max_sequences = 1, .max_context = 256});
  const int s = e.open();
  const auto t = random_tokens(10, f.vocab(), 9);
  EXPECT_THROW(e.rollback(s, 0), Error);  // no begin_speculation
  f.feed(e, s, std::span(t).first(4));
  e.begin_speculation(s);
  f.feed(e, s, std::span(t).subspan(4, 3));
  f.feed(e, s, std::span(t).subspan(7, 3));
  EXPECT_THROW(e.rollback(s, 6), Error);  // the last forward did not start at the snapshot
  EXPECT_THROW(e.rollback(s, 3), Error);  // before the snapshot
  e.rollback(s, 4);
  EXPECT_EQ(e.length(s), 4);
}

TEST(Speculative, LookupProposesContinuationOfLongestNgram) {
  const std::vector<int32_t> c = {1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3, 4};
  // Suffix 2 3 4 last occurred at 6..8, followed by 7 8 2 ...
  EXPECT_EQ(LookupDrafter::lookup(c, 3), (std::vector<int32_t>{7, 8, 2}));
  EXPECT_EQ(LookupDrafter::lookup(std::vector<int32_t>{5, 6, 5}, 4), (std::vector<int32_t>{6, 5}));
  EXPECT_TRUE(LookupDrafter::lookup(std::vector<int32_t>{1, 2, 3}, 4).empty());
}

// The incremental index (what LookupDrafter uses) equals the whole-context scan at every step of
// growing sequences: a repetitive one (long matches), a random one over a small alphabet (matches of
// every n), growth by 1..5 tokens per step as verify rounds append, and a sequence that is replaced
// by another (rebuild) or cut back.
TEST(Speculative, LookupIndexEqualsTheScan) {
  std::mt19937 rng(17);
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<int32_t> seq;
    const std::vector<int32_t> para = {11, 12, 13, 14, 15, 16, 17, 12, 13, 18};
    while (seq.size() < 1200) {
      if (variant == 0) {  // a paragraph repeated, with an occasional edit
        seq.insert(seq.end(), para.begin(), para.end());
        if (rng() % 4 == 0) seq.push_back(int32_t(20 + rng() % 5));
      } else {
        seq.push_back(int32_t(rng() % (variant == 1 ? 6 : 40)));
      }
    }
    LookupIndex index;
    std::vector<int32_t> ctx;
    int64_t len = 0, checks = 0, proposals = 0;
    while (len + 1 < int64_t(seq.size())) {
      const std::span<const int32_t> hist = std::span(seq).first(size_t(len));
      const int32_t x0 = seq[size_t(len)];
      const int k = 1 + int(rng() % 8);
      ctx.assign(hist.begin(), hist.end());
      ctx.push_back(x0);
      const auto want = LookupDrafter::lookup(ctx, k);
      ASSERT_EQ(index.propose(hist, x0, k), want) << "variant " << variant << " length " << len << " k " << k;
      ++checks;
      proposals += !want.empty();
      len += 1 + int64_t(rng() % 5);  // x0 and up to 4 accepted drafts enter the cache
    }
    EXPECT_EQ(index.rebuilds(), 0) << "extensions must not rebuild";
    EXPECT_GT(proposals, checks / 2);
    // Cut back (a new request on the same sequence id without forget()): rebuilt, still equal.
    const std::vector<int32_t> other = {1, 2, 3, 1, 2};
    EXPECT_EQ(index.propose(other, 3, 4), LookupDrafter::lookup(std::vector<int32_t>{1, 2, 3, 1, 2, 3}, 4));
    EXPECT_EQ(index.rebuilds(), 1);
    EXPECT_EQ(index.indexed(), 5);
  }
  // Same length, different last token: rebuilt.
  LookupIndex index;
  EXPECT_EQ(index.propose(std::vector<int32_t>{5, 6, 7}, 5, 2), (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(index.propose(std::vector<int32_t>{5, 6, 8, 9}, 8, 2), (std::vector<int32_t>{9, 8}));
  EXPECT_EQ(index.rebuilds(), 1);
}

TEST(Speculative, AdaptiveDraftRule) {
  EXPECT_EQ(adapt_draft_tokens(4, 4, 4, 8), 5);  // every draft accepted: grow
  EXPECT_EQ(adapt_draft_tokens(8, 8, 8, 8), 8);  // at most max
  EXPECT_EQ(adapt_draft_tokens(4, 2, 2, 8), 5);  // fewer drafted (capped), all accepted: grow
  EXPECT_EQ(adapt_draft_tokens(4, 4, 2, 8), 4);  // half: keep
  EXPECT_EQ(adapt_draft_tokens(4, 4, 1, 8), 3);  // fewer than half: shrink
  EXPECT_EQ(adapt_draft_tokens(1, 1, 0, 8), 1);  // at least 1
  EXPECT_EQ(adapt_draft_tokens(5, 5, 3, 4), 4);  // clamped into [1, max]
}

TEST(Speculative, MaxDraftTokensRespectsEndContextAndRegimeBoundary) {
  DraftSkip why = DraftSkip::Budget;
  EXPECT_EQ(max_draft_tokens(100, 1024, 50, 256, 4, &why), 4);
  EXPECT_EQ(max_draft_tokens(100, 1024, 3, 256, 4, &why), 2);  // K + 1 tokens within max_tokens
  EXPECT_EQ(max_draft_tokens(100, 1024, 1, 256, 4, &why), 0);
  EXPECT_EQ(why, DraftSkip::End);
  EXPECT_EQ(max_draft_tokens(1020, 1024, 50, 256, 4, &why), 2);  // plain decode ends at length 1023
  EXPECT_EQ(max_draft_tokens(1022, 1024, 50, 256, 4, &why), 0);
  EXPECT_EQ(why, DraftSkip::End);
  // dense_len 256: the token at position p decodes sparse iff p + 1 >= 256.
  EXPECT_EQ(max_draft_tokens(250, 1024, 50, 256, 4, &why), 4);  // positions 250..254: all dense
  EXPECT_EQ(max_draft_tokens(252, 1024, 50, 256, 4, &why), 2);  // 252..254 dense, 255 would be sparse
  EXPECT_EQ(max_draft_tokens(254, 1024, 50, 256, 4, &why), 0);
  EXPECT_EQ(why, DraftSkip::Boundary);
  EXPECT_EQ(max_draft_tokens(255, 1024, 50, 256, 4, &why), 4);  // all sparse
}

TEST(Speculative, SchedulerNeedsRoomForOneFullVerify) {
  Fixture f;  // max_logit_rows 64
  Engine e(*f.m.model, {.max_sequences = 40, .max_context = 256});
  SpeculativeOptions spec{.mode = SpeculativeMode::Self, .draft_layers = 2, .draft_tokens = 25};
  EXPECT_THROW(Scheduler(e, {.speculative = spec}), Error);  // 40 + 25 rows > 64
  spec.draft_tokens = 33;
  Engine e2(*f.m.model, {.max_sequences = 1, .max_context = 256});
  EXPECT_THROW(Scheduler(e2, {.speculative = spec}), Error);
  spec.draft_tokens = 24;
  Scheduler ok(e2, {.speculative = spec});
  EXPECT_TRUE(ok.speculative());
  EXPECT_EQ(ok.options().speculative.draft_layers, 2);
}

namespace {
// Several concurrent greedy requests of different prompt lengths through one speculating
// Scheduler (3 sequences for 5 requests, 32-token prefill chunks: prompts prefill while other
// sequences verify) against each request decoded alone without speculation.
void check_greedy_identity(const std::vector<int>& prompt_lens, const std::vector<int>& max_tokens, uint32_t seed) {
  Fixture f;
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<Job> jobs;
  for (size_t i = 0; i < prompt_lens.size(); ++i) {
    Job j{random_tokens(prompt_lens[i], f.vocab(), seed + uint32_t(i)), greedy, max_tokens[i]};
    if (i == 1) j.sampling.repetition_penalty = 1.3f;  // penalties see the drafts of each verify row
    if (i == 2) j.ignore_eos = false;                  // may end early, on an EOS inside a verify round
    jobs.push_back(std::move(j));
  }
  std::vector<Generated> ref;
  for (const Job& j : jobs) ref.push_back(plain_generate(f, j));
  EXPECT_EQ(ref[0].tokens.size(), size_t(max_tokens[0]));
  // Fixed K 4 for both drafters, and adaptive K (up to 6 / 8: k per sequence changes between rounds).
  const std::vector<SpeculativeOptions> configs = {
      {.mode = SpeculativeMode::Self, .draft_layers = 2, .draft_tokens = 4},
      {.mode = SpeculativeMode::Lookup, .draft_layers = 2, .draft_tokens = 4},
      {.mode = SpeculativeMode::Self, .draft_layers = 2, .draft_tokens = 6, .adaptive = true},
      {.mode = SpeculativeMode::Lookup, .draft_layers = 2, .draft_tokens = 8, .adaptive = true},
  };
  for (const SpeculativeOptions& opt : configs) {
    const auto mode = opt.mode;
    const std::string what = std::string(speculative_mode_name(mode)) + (opt.adaptive ? " adaptive" : "");
    SchedulerStats st;
    const auto got = run_jobs(f, jobs, 3, opt, &st);
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_EQ(got[i].tokens, ref[i].tokens) << what << " request " << i << " (prompt " << prompt_lens[i] << ")";
      EXPECT_EQ(got[i].why, ref[i].why) << what << " request " << i;
    }
    const SpeculativeStats& sp = st.speculative;
    EXPECT_GT(sp.rounds, 0);
    EXPECT_GT(sp.accepted, 0);
    EXPECT_LE(sp.accepted, sp.drafted);
    EXPECT_LE(sp.emitted, sp.accepted + sp.rounds);
    // Every generated token came from a prefill logit row, a verify round or a plain decode step.
    // (The first token of each request comes from its prefill; an EOS is generated but not reported.)
    int64_t generated = 0;
    for (const auto& g : got) generated += int64_t(g.tokens.size()) + (g.why == FinishReason::Stop ? 1 : 0);
    EXPECT_EQ(st.generated_tokens, generated);
    EXPECT_EQ(int64_t(jobs.size()) + sp.emitted + sp.skipped_total(), generated)
        << "every decode step is a verify round or a counted skip";
    EXPECT_LE(sp.drafted, sp.rounds * opt.draft_tokens);
    if (opt.adaptive) {  // K moved: the drafts per round are neither all 4 nor all the maximum
      EXPECT_NE(sp.drafted, 4 * sp.rounds) << what;
      EXPECT_LT(sp.drafted, sp.rounds * opt.draft_tokens) << what;
    }
    std::printf("  %s prompts", what.c_str());
    for (int l : prompt_lens) std::printf(" %d", l);
    std::printf(": %lld verify rounds, %.2f drafts/verify, acceptance %.3f, %.2f tokens/verify, skipped: end %lld "
                "boundary %lld budget %lld no_match %lld\n",
                (long long)sp.rounds, sp.rounds ? double(sp.drafted) / double(sp.rounds) : 0.0, sp.acceptance(),
                sp.tokens_per_round(), (long long)sp.skipped[0],
                (long long)sp.skipped[1], (long long)sp.skipped[2], (long long)sp.skipped[3]);
  }
}
}  // namespace

// Dense prompts, decoding across dense_len 256 (two of them), and one admitted late.
TEST(Speculative, GreedyIdenticalToPlainDense) {
  check_greedy_identity({20, 150, 7, 90, 230}, {300, 260, 200, 120, 300}, 21);
}
// Sparse prompts (>= 256), one of them prefilling across several steps while the others verify.
TEST(Speculative, GreedyIdenticalToPlainSparse) {
  check_greedy_identity({300, 260, 420, 270, 257}, {300, 250, 300, 100, 200}, 22);
}

// Logit rows for only one full verify next to the other sequence's row: drafts go to the first
// decoding sequence, the other decodes plainly (a counted budget skip); output stays identical.
TEST(Speculative, GreedyIdenticalUnderATightRowBudget) {
  CpuBackend backend(2, /*batch_invariant=*/true);
  LoadedModel m = load_model(tiny_checkpoint().string(), backend, {.max_batch_tokens = 512, .max_logit_rows = 6});
  SamplingParams greedy;
  greedy.temperature = 0;
  const int V = m.config.vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(30, V, 31), random_tokens(70, V, 32)};
  auto run = [&](SpeculativeOptions spec, SchedulerStats* st) {
    Engine e(*m.model, {.max_sequences = 2, .max_context = 512});
    Scheduler sch(e, {.prefill_chunk = 32, .max_batch_tokens = 512, .speculative = spec});
    std::vector<Generated> out(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) sch.submit(make_request(prompts[i], greedy, 120, out[i]));
    sch.run();
    if (st) *st = sch.stats();
    return out;
  };
  const auto plain = run({}, nullptr);
  SchedulerStats st;
  const auto spec = run({.mode = SpeculativeMode::Self, .draft_layers = 2, .draft_tokens = 4}, &st);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(spec[i].tokens, plain[i].tokens) << "request " << i;
  EXPECT_GT(st.speculative.rounds, 0);
  EXPECT_GT(st.speculative.skipped[size_t(DraftSkip::Budget)], 0);
}

TEST(Speculative, DraftLayersEqualToModelAcceptsEverything) {
  Fixture f;
  SamplingParams p;
  p.temperature = 0;
  SchedulerStats st;
  run_jobs(f, {{random_tokens(30, f.vocab(), 5), p, 60}, {random_tokens(45, f.vocab(), 6), p, 50}}, 2,
           {.mode = SpeculativeMode::Self, .draft_layers = 99, .draft_tokens = 4}, &st);
  EXPECT_GT(st.speculative.drafted, 0);
  EXPECT_EQ(st.speculative.accepted, st.speculative.drafted);
}

// A stop from on_token in the middle of a verify round ends the request at exactly that token.
TEST(Speculative, StopInsideAVerifyRound) {
  Fixture f;
  SamplingParams p;
  p.temperature = 0;
  const auto prompt = random_tokens(40, f.vocab(), 12);
  auto run = [&](SpeculativeOptions spec) {
    Engine e(*f.m.model, {.max_sequences = 2, .max_context = 512});
    Scheduler sch(e, {.speculative = spec});
    std::vector<Generated> out(2);
    for (int i = 0; i < 2; ++i) {
      GenerationRequest req = make_request(prompt, p, 100, out[size_t(i)]);
      const size_t stop_at = i == 0 ? 37 : 61;
      req.on_token = [&g = out[size_t(i)], stop_at](const SampledToken& t) {
        g.tokens.push_back(t.id);
        return g.tokens.size() < stop_at;
      };
      sch.submit(std::move(req));
    }
    sch.run();
    EXPECT_TRUE(sch.idle());
    return out;
  };
  const auto plain = run({});
  const auto spec = run({.mode = SpeculativeMode::Self, .draft_layers = 99, .draft_tokens = 7});
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(spec[size_t(i)].tokens, plain[size_t(i)].tokens);
    EXPECT_EQ(spec[size_t(i)].why, FinishReason::Stop);
  }
  EXPECT_EQ(plain[0].tokens.size(), 37u);
}

// Temperature > 0: the joint distribution of the first two generated tokens (the second comes from
// a verify round with one self-drafted token) against the exact p(t1)·p(t2 | t1). The requests run
// four at a time through a speculating Scheduler, each with its own seed.
TEST(Speculative, SamplingPreservesTargetDistribution) {
  Fixture f;
  const auto prompt = random_tokens(24, f.vocab(), 8);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 4;
  const int V = f.vocab();
  std::map<std::pair<int, int>, double> exact;
  {
    Engine e(*f.m.model, {.max_sequences = 1, .max_context = 256});
    Sampler sm(p);
    int s = e.open();
    auto l1 = f.feed(e, s, prompt);
    auto p1 = sm.distribution(l1, prompt);
    e.close(s);
    for (int t1 = 0; t1 < V; ++t1) {
      if (p1[size_t(t1)] == 0) continue;
      s = e.open();
      auto ctx = prompt;
      ctx.push_back(t1);
      auto l2 = f.feed(e, s, ctx);
      auto p2 = sm.distribution(l2, ctx);
      e.close(s);
      for (int t2 = 0; t2 < V; ++t2)
        if (p2[size_t(t2)] > 0) exact[{t1, t2}] = p1[size_t(t1)] * p2[size_t(t2)];
    }
  }
  const int N = 4000;
  std::vector<Job> jobs;
  for (int i = 0; i < N; ++i) {
    p.seed = uint64_t(1000 + i);
    jobs.push_back({prompt, p, 3});
  }
  SchedulerStats st;
  const auto got = run_jobs(f, jobs, 4, {.mode = SpeculativeMode::Self, .draft_layers = 2, .draft_tokens = 4}, &st);
  std::map<std::pair<int, int>, double> seen;
  for (const auto& g : got) {
    ASSERT_GE(g.tokens.size(), 2u);
    seen[{g.tokens[0], g.tokens[1]}] += 1.0 / N;
  }
  const SpeculativeStats& sp = st.speculative;
  EXPECT_EQ(sp.rounds, N);  // the second token of every request comes from a verify round
  EXPECT_GT(sp.accepted, 0);
  EXPECT_LT(sp.accepted, sp.drafted);  // both branches exercised
  double tv = 0;
  for (auto& [k, q] : exact) tv += std::abs(q - (seen.count(k) ? seen[k] : 0.0));
  for (auto& [k, q] : seen)
    if (!exact.count(k)) tv += q;
  tv /= 2;
  // 16 cells, 4000 draws: E[TV] <= 0.5 * sqrt(2/(pi N)) * sum sqrt(p) <= 0.026 (fixed seeds: deterministic).
  EXPECT_LT(tv, 0.05) << "total variation";
  std::printf("  TV(empirical, exact) = %.4f over %d draws, %zu cells, acceptance %.3f\n", tv, N, exact.size(),
              sp.acceptance());
}

namespace {
// TV distance between two distributions over the same cells.
double total_variation(const std::map<std::vector<int>, double>& a, const std::map<std::vector<int>, double>& b) {
  double tv = 0;
  for (const auto& [k, q] : a) {
    const auto it = b.find(k);
    tv += std::abs(q - (it == b.end() ? 0.0 : it->second));
  }
  for (const auto& [k, q] : b)
    if (!a.count(k)) tv += q;
  return tv / 2;
}
}  // namespace

// The acceptance rule with K = 3 drafts per round, at temperature 1, on fixed verify rows: the
// outcome of a round (how many drafts were accepted, and the token that ends the round: the
// correction sampled from the residual after a rejection, or the bonus from the last row) against
// plain sampling of the same rows. Plain sampling emits "d1..dj, then t != d(j+1)" with probability
// p0(d1)···p(j-1)(dj)·pj(t), and "d1..d3, then b" with probability p0(d1)p1(d2)p2(d3)·p3(b). All 17
// outcomes have mass >= 0.005 (acceptance 0.49, 0.44, 0.45 per row), so rejection at rows 0, 1 and 2 (after 0, 1, 2 accepted drafts) and
// the bonus are all exercised. 200000 rounds through one seeded sampler: E[TV] <= 0.5·sqrt(2/(pi·N))·
// sum sqrt(p) ~ 0.0035 here; bound 0.01. Two wrong rules, computed exactly, are far outside it:
// resampling the rejected row from p instead of the residual (TV 0.43), and accepting a draft iff it
// is the row's argmax (TV 0.90).
TEST(Speculative, AcceptRuleWithSeveralDraftsMatchesTarget) {
  const int V = 5, K = 3;
  const std::vector<int32_t> drafts = {2, 0, 3};
  // Row i's logits: the draft d(i+1) the most likely token (acceptance 0.45..0.6), then the others.
  const std::vector<std::vector<float>> rows = {
      {0.1f, -0.5f, 1.2f, 0.3f, -1.0f}, {1.0f, 0.2f, -0.3f, 0.0f, -0.8f}, {-0.2f, 0.1f, 0.0f, 1.3f, 0.4f},
      {0.5f, 0.4f, -0.6f, 0.9f, 0.0f}};
  std::vector<float> logits;
  for (const auto& r : rows) logits.insert(logits.end(), r.begin(), r.end());
  const std::vector<int32_t> tokens = {4, 2, 0, 3};  // x0, d1, d2, d3 (no penalties: history unused)
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.seed = 20261125;
  Sampler sampler(sp);
  std::vector<std::vector<double>> p;
  for (const auto& r : rows) p.push_back(sampler.distribution(r, tokens));
  // Exact outcome distributions, cell = {accepted, last token}: the target, and two wrong rules.
  std::map<std::vector<int>, double> exact, no_residual, argmax_rule;
  double prefix = 1, prefix_argmax = 1;
  for (int j = 0; j <= K; ++j) {
    const auto& pj = p[size_t(j)];
    const int d = j < K ? drafts[size_t(j)] : -1;
    const int amax = int(std::max_element(pj.begin(), pj.end()) - pj.begin());
    for (int t = 0; t < V; ++t) {
      if (t != d) exact[{j, t}] = prefix * pj[size_t(t)];
      // Wrong 1: reject with 1 - p(d), then a sample of p itself (d may come out as a "correction").
      no_residual[{j, t}] = prefix * (j < K ? (1 - pj[size_t(d)]) : 1.0) * pj[size_t(t)];
      // Wrong 2: accept iff d is the argmax; otherwise a sample of the residual.
      if (t != d)
        argmax_rule[{j, t}] =
            prefix_argmax * (j < K && d == amax ? 0.0 : pj[size_t(t)] / (j < K ? 1 - pj[size_t(d)] : 1.0));
    }
    if (j < K) {
      prefix *= pj[size_t(d)];
      prefix_argmax *= d == amax ? 1.0 : 0.0;
    }
  }
  for (const auto& [cell, q] : exact) ASSERT_GT(q, 0.005) << "outcome " << cell[0] << "," << cell[1];
  const double bound = 0.01;
  const double tv_wrong1 = total_variation(no_residual, exact), tv_wrong2 = total_variation(argmax_rule, exact);
  EXPECT_GT(tv_wrong1, 5 * bound);
  EXPECT_GT(tv_wrong2, 5 * bound);

  const int N = 200000;
  std::map<std::vector<int>, double> seen;
  std::array<int, K + 1> by_accepted{};
  for (int n = 0; n < N; ++n) {
    const Verdict v = accept_drafts(sampler, logits, drafts, tokens);
    ASSERT_EQ(v.tokens.size(), size_t(v.accepted + 1));
    for (int i = 0; i < v.accepted; ++i) ASSERT_EQ(v.tokens[size_t(i)].id, drafts[size_t(i)]);
    seen[{v.accepted, v.tokens.back().id}] += 1.0 / N;
    ++by_accepted[size_t(v.accepted)];
  }
  for (int a = 0; a <= K; ++a) EXPECT_GT(by_accepted[size_t(a)], N / 100) << a << " accepted drafts";
  const double tv = total_variation(seen, exact);
  EXPECT_LT(tv, bound) << "total variation";
  std::printf("  K 3: TV(empirical, exact) = %.4f over %d rounds (bound %.2f; wrong rules: no residual %.3f, "
              "argmax acceptance %.3f); rounds by accepted drafts 0..3: %d %d %d %d\n",
              tv, N, bound, tv_wrong1, tv_wrong2, by_accepted[0], by_accepted[1], by_accepted[2], by_accepted[3]);
}

// Temperature > 0 through the speculating Scheduler with K = 3 drafts per round (self-draft with
// every layer, so the drafts are the target's argmax and are accepted often): the joint
// distribution of the first three generated tokens — t2 from row 0 of the first verify round, t3
// from its row 1 when d1 was accepted (a position inside the round) or from the next round —
// against the exact p(t1)·p(t2|t1)·p(t3|t1,t2) (top-k 3: 27 cells). 4000 seeded requests:
// E[TV] = 0.030 for these cells (sd ~0.005; seeds 5000.. give 0.040, other seed ranges 0.025-0.031);
// bound 0.06. The wrong rule "resample p on
// rejection" gives the exact distribution p(t1)·q(t2|t1)·q(t3|t1,t2), q = (1 - p(d))·p + p(d)·δ_d,
// computed below: its TV must exceed the bound (so this test can fail).
TEST(Speculative, SamplingInsideAVerifyRoundPreservesTargetDistribution) {
  Fixture f;
  const auto prompt = random_tokens(26, f.vocab(), 13);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 3;
  const int V = f.vocab();
  Engine e(*f.m.model, {.max_sequences = 1, .max_context = 256});
  Sampler sm(p);
  auto dist = [&](const std::vector<int32_t>& ctx) {
    const int s = e.open();
    auto l = f.feed(e, s, ctx);
    e.close(s);
    return sm.distribution(l, ctx);
  };
  auto argmax = [](const std::vector<double>& q) { return int(std::max_element(q.begin(), q.end()) - q.begin()); };
  auto wrong = [&](std::vector<double> q) {  // q = (1 - p(d)) p + p(d) δ_d, d = argmax
    const int d = argmax(q);
    const double pd = q[size_t(d)];
    for (auto& x : q) x *= 1 - pd;
    q[size_t(d)] += pd;
    return q;
  };
  std::map<std::vector<int>, double> exact, wrong_rule;
  const auto p1 = dist(prompt);
  for (int t1 = 0; t1 < V; ++t1) {
    if (p1[size_t(t1)] == 0) continue;
    auto c1 = prompt;
    c1.push_back(t1);
    const auto p2 = dist(c1), q2 = wrong(p2);
    for (int t2 = 0; t2 < V; ++t2) {
      if (p2[size_t(t2)] == 0) continue;
      auto c2 = c1;
      c2.push_back(t2);
      const auto p3 = dist(c2), q3 = wrong(p3);
      for (int t3 = 0; t3 < V; ++t3) {
        if (p3[size_t(t3)] == 0) continue;
        exact[{t1, t2, t3}] = p1[size_t(t1)] * p2[size_t(t2)] * p3[size_t(t3)];
        wrong_rule[{t1, t2, t3}] = p1[size_t(t1)] * q2[size_t(t2)] * q3[size_t(t3)];
      }
    }
  }
  ASSERT_EQ(exact.size(), 27u);
  const double bound = 0.06;
  const double tv_wrong = total_variation(wrong_rule, exact);
  EXPECT_GT(tv_wrong, 1.5 * bound) << "the test could not tell the wrong rule apart";
  const int N = 4000;
  std::vector<Job> jobs;
  for (int i = 0; i < N; ++i) {
    p.seed = uint64_t(5000 + i);
    jobs.push_back({prompt, p, 5});  // token 1 from the prefill, then a round of K = 3 (at most 4 tokens)
  }
  SchedulerStats st;
  const auto got = run_jobs(f, jobs, 4, {.mode = SpeculativeMode::Self, .draft_layers = 99, .draft_tokens = 3}, &st);
  std::map<std::vector<int>, double> seen;
  for (const auto& g : got) {
    ASSERT_GE(g.tokens.size(), 3u);
    seen[{g.tokens[0], g.tokens[1], g.tokens[2]}] += 1.0 / N;
  }
  const SpeculativeStats& sp = st.speculative;
  EXPECT_GE(sp.rounds, N);
  EXPECT_GT(sp.partly_accepted, N / 20) << "rejections after an accepted draft";
  EXPECT_GT(sp.all_accepted, N / 20) << "rounds ending with the bonus token";
  EXPECT_GT(sp.rounds - sp.all_accepted - sp.partly_accepted, N / 20) << "rejections of the first draft";
  const double tv = total_variation(seen, exact);
  double expected_tv = 0;  // E[TV] of N exact draws (normal approximation per cell)
  for (const auto& [k, q] : exact) expected_tv += 0.5 * std::sqrt(2 * q * (1 - q) / (M_PI * N));
  EXPECT_LT(tv, bound) << "total variation";
  std::printf("  K 3: TV(empirical, exact) = %.4f (expected %.4f) over %d draws, 27 cells (bound %.2f, wrong rule "
              "%.3f); %lld rounds: %lld all accepted, %lld partly, acceptance %.3f\n",
              tv, expected_tv, N, bound, tv_wrong, (long long)sp.rounds, (long long)sp.all_accepted, (long long)sp.partly_accepted,
              sp.acceptance());
}

// The CPU cost table of bench/results/speculative-cpu.md (not run by default):
//   SALA_SPEC_BENCH_PRESET=small ./sala_tests --gtest_also_run_disabled_tests \
//       --gtest_filter='Speculative.DISABLED_CpuCostTable'
TEST(Speculative, DISABLED_CpuCostTable) {
  const char* env = std::getenv("SALA_SPEC_BENCH_PRESET");
  const std::string preset = env && *env ? env : "small";
  const fs::path dir = fs::temp_directory_path() / ("sala_spec_bench_" + preset + "_" + std::to_string(::getpid()));
  write_random_checkpoint(dir, preset_config(preset), {.seed = 1, .dtype = DType::BF16});
  CpuBackend be(2);
  LoadedModel m = load_model(dir.string(), be, {.max_batch_tokens = 512, .max_logit_rows = 64});
  const int L = m.config.num_layers, N = std::max(1, L / 2), C = 512, reps = 15;
  Engine e(*m.model, {.max_sequences = 1, .max_context = 2048});
  const int s = e.open();
  const auto prompt = random_tokens(C, m.config.vocab_size, 1);
  {
    Engine::Request r{s, prompt, -1, false};
    e.step(std::span(&r, 1));
  }
  using Clock = std::chrono::steady_clock;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto timed = [&](auto&& fn) {
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = Clock::now();
      fn();
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count() * 1e3);
    }
    return median(t);
  };
  const auto toks = random_tokens(9, m.config.vocab_size, 2);
  // Plain decode step (rolled back afterwards so every measurement sees the same context).
  e.begin_speculation(s);
  const double t_snap = timed([&] { e.begin_speculation(s); });
  const double t_dec = timed([&] {
    Engine::Request r{s, std::span(toks).first(1)};
    e.step(std::span(&r, 1));
    e.rollback(s, C);
  });
  const double t_draft = timed([&] {
    Engine::Request r{s, std::span(toks).first(1)};
    e.step(std::span(&r, 1), N);
    e.rollback(s, C);
  });
  std::vector<double> t_ver(9), t_rb(9);
  for (int K = 1; K <= 8; ++K) {
    t_ver[size_t(K)] = timed([&] {
      Engine::Request r{s, std::span(toks).first(size_t(K + 1)), -1, true};
      e.step(std::span(&r, 1));
      e.rollback(s, C);
    });
    std::vector<double> rb;
    for (int i = 0; i < reps; ++i) {
      e.begin_speculation(s);
      Engine::Request r{s, std::span(toks).first(size_t(K + 1)), -1, true};
      e.step(std::span(&r, 1));
      const auto t0 = Clock::now();
      e.rollback(s, C + K);  // keep K of K+1: the largest lightning rollback
      rb.push_back(std::chrono::duration<double>(Clock::now() - t0).count() * 1e3);
      e.rollback(s, C);
    }
    t_rb[size_t(K)] = median(rb);
  }
  std::printf("preset %s: %d layers, draft %d layers, context %d, CPU backend 2 threads\n", preset.c_str(), L, N, C);
  std::printf("decode step %.3f ms, draft step (%d layers) %.3f ms = %.2f x, snapshot %.3f ms\n", t_dec, N, t_draft,
              t_draft / t_dec, t_snap);
  std::printf("| K | verify ms | verify / decode | rollback (keep K) ms |\n|---|---|---|---|\n");
  for (int K = 1; K <= 8; ++K)
    std::printf("| %d | %.3f | %.2f | %.3f |\n", K, t_ver[size_t(K)], t_ver[size_t(K)] / t_dec, t_rb[size_t(K)]);
  std::printf("\nimplied speedup over plain decode, E[tokens]=(1-a^(K+1))/(1-a):\n");
  std::printf("| drafter | K | a=0.3 | a=0.5 | a=0.7 | a=0.8 | a=0.9 |\n|---|---|---|---|---|---|---|\n");
  for (int self = 1; self >= 0; --self)
    for (int K = 1; K <= 8; ++K) {
      std::printf("| %s | %d |", self ? "self" : "lookup", K);
      for (double a : {0.3, 0.5, 0.7, 0.8, 0.9}) {
        const double tokens = (1 - std::pow(a, K + 1)) / (1 - a);
        const double cost = t_snap + (self ? K * t_draft : 0.0) + t_ver[size_t(K)] + t_rb[size_t(K)];
        std::printf(" %.2f |", tokens * t_dec / cost);
      }
      std::printf("\n");
    }
  fs::remove_all(dir);
}
