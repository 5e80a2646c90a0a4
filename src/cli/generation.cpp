#include "cli/generation.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"

namespace sala::cli {

namespace fs = std::filesystem;

void SamplingOptions::add(CLI::App& app) {
  app.add_option("--temperature", params.temperature, "sampling temperature; 0 = greedy")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", params.top_p, "nucleus sampling: keep the smallest set of tokens with this mass (1 = off)")
      ->capture_default_str();
  app.add_option("--top-k", params.top_k, "keep the k most likely tokens (0 = off)")->capture_default_str();
  app.add_option("--min-p", params.min_p, "drop tokens below min_p * the top probability (0 = off)")
      ->capture_default_str();
  app.add_option("--repeat-penalty", params.repetition_penalty, "penalty on tokens already seen (1 = off)")
      ->capture_default_str();
  app.add_option("--frequency-penalty", params.frequency_penalty, "minus count * value for seen tokens")
      ->capture_default_str();
  app.add_option("--presence-penalty", params.presence_penalty, "minus value for seen tokens")->capture_default_str();
  seed_opt_ = app.add_option("--seed", params.seed, "random seed (default: a new one each run)");
  app.add_option("-n,--max-tokens", max_tokens, "most tokens to generate per answer")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  // One value per --stop, so a stop string never swallows the positional prompt after it.
  app.add_option("--stop", stop, "stop when the output contains this text (repeatable; the text is not printed)")
      ->allow_extra_args(false);
  app.add_option("-c,--ctx-size", ctx_size, "context length per sequence (prompt + answer), in tokens")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--ignore-eos", ignore_eos, "keep generating past end-of-sequence tokens (benchmarks, tests)");
}

SamplingParams SamplingOptions::resolved() const {
  SamplingParams p = params;
  if (!seed_opt_ || seed_opt_->count() == 0) {
    static const uint64_t process_seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    p.seed = process_seed;
  }
  return p;
}

void SpeculativeCliOptions::add(CLI::App& app) {
  app.add_option("--speculative", mode,
                 "speculative decoding: 'self' (draft with the first --draft-layers layers) or 'lookup' (prompt "
                 "lookup); exact rollback, greedy output identical to plain decoding")
      ->check(CLI::IsMember({"self", "lookup", "off"}));
  app.add_option("--draft-layers", draft_layers, "self-draft: layers of the draft model (clamped to the model)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--draft-tokens", draft_tokens, "tokens drafted per verify step (1..32)")
      ->capture_default_str()
      ->check(CLI::Range(1, 32));
  app.add_flag("--adaptive-draft", adaptive,
               "adapt the tokens drafted per sequence within [1, --draft-tokens] from its acceptance (+1 after a "
               "round that accepted every draft, -1 after one that accepted fewer than half)");
}

SpeculativeOptions SpeculativeCliOptions::options() const {
  return {.mode = parse_speculative_mode(mode),
          .draft_layers = draft_layers,
          .draft_tokens = draft_tokens,
          .adaptive = adaptive};
}

void PromptOptions::add(CLI::App& app, bool allow_raw) {
  if (allow_raw) app.add_flag("--raw", raw, "no chat template: the prompt text as is, after BOS");
  app.add_option("--system", system, "system prompt (chat template)");
  app.add_flag("--no-think", no_think, "thinking off: empty <think> block in the prompt, reasoning hidden in the output");
}

ChatOptions PromptOptions::chat() const {
  ChatOptions c;
  c.system_prompt = system;
  c.enable_thinking = !no_think;
  return c;
}

std::vector<int32_t> PromptOptions::encode(const Tokenizer& tok, const std::string& user_text) const {
  if (raw) {
    SALA_CHECK(system.empty(), "--system needs the chat template; it cannot be used with --raw");
    return tok.encode(user_text, /*add_special_tokens=*/true);
  }
  const ChatMessage msg{"user", user_text};
  return encode_chat(tok, std::span(&msg, 1), chat());
}

std::vector<int32_t> PromptOptions::encode(const Tokenizer& tok, std::span<const ChatMessage> history) const {
  return encode_chat(tok, history, chat());
}

TextStreamOptions PromptOptions::text_options(const std::vector<std::string>& stop) const {
  TextStreamOptions t;
  t.stop = stop;
  t.hide_think = no_think;
  return t;
}

namespace {

fs::path default_model_dir() {
  if (const char* h = std::getenv("SALA_HOME"); h && *h) return fs::path(h) / "default-small";
  const char* home = std::getenv("HOME");
  SALA_CHECK(home && *home, "cannot place the built-in default model: neither SALA_HOME nor HOME is set");
  return fs::path(home) / ".cache" / "sala" / "default-small";
}

bool complete_checkpoint(const fs::path& dir) {
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
    if (!fs::exists(dir / f)) return false;
  return true;
}

// Written to a private directory and renamed into place, so a crash or a concurrent run never
// leaves (or sees) a half-written default model.
void create_default_model(const fs::path& dir) {
  const fs::path tok = default_tokenizer_dir();
  SALA_CHECK(!tok.empty(),
             "the built-in default model needs the real tokenizer files (tests/data/tokenizer), which were not "
             "found; pass a MODEL directory instead (e.g. one made by `sala init DIR --preset tiny`)");
  std::fprintf(stderr, "creating the built-in default model (RANDOM weights, preset small) at %s ...\n",
               dir.string().c_str());
  fs::create_directories(dir.parent_path());
  const fs::path tmp = dir.string() + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp);
  RandomCheckpointOptions opt;
  opt.seed = 0;
  opt.dtype = DType::BF16;
  opt.tokenizer_dir = tok;
  try {
    write_random_checkpoint(tmp, preset_config("small"), opt);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  std::error_code ec;
  if (fs::exists(dir) && !complete_checkpoint(dir)) fs::remove_all(dir, ec);  // a leftover from an old layout
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);  // another run got there first
    SALA_CHECK(complete_checkpoint(dir), "cannot create the built-in default model at {}", dir.string());
  }
}

}  // namespace

std::string resolve_model_ref(const std::string& ref) {
  if (!ref.empty() && ref != "default") return ref;
  const fs::path dir = default_model_dir();
  if (!complete_checkpoint(dir)) create_default_model(dir);
  std::fprintf(stderr, "using the built-in default model: RANDOM weights (preset small) at %s\n", dir.string().c_str());
  return dir.string();
}

std::unique_ptr<GenerationSession> open_session(const std::string& model_ref, const BackendOptions& backend,
                                                const SamplingOptions& sampling, int max_sequences, bool chat,
                                                const SpeculativeCliOptions* speculative) {
  SALA_CHECK(max_sequences > 0, "the number of parallel sequences must be positive, got {}", max_sequences);
  auto s = std::make_unique<GenerationSession>();
  const fs::path dir = resolve_model_dir(model_ref);
  // The tokenizer first: a missing or broken tokenizer.json fails before the weights are read.
  SALA_CHECK(fs::exists(dir / "tokenizer.json"), "model directory '{}' has no tokenizer.json (needed to encode text)",
             dir.string());
  s->tokenizer = Tokenizer::load(dir);
  if (chat)
    if (auto w = chat_template_warning(dir)) std::fprintf(stderr, "warning: %s\n", w->c_str());

  s->backend = backend.make();
  const bool spec = speculative && speculative->on();
  const SpeculativeOptions spec_opts = spec ? speculative->options() : SpeculativeOptions{};
  if (spec) spec_opts.validate();
  ModelLimits limits;
  // One logits row per live sequence per step; speculating, every sequence may verify K + 1 rows.
  limits.max_logit_rows = spec ? int64_t(max_sequences) * (spec_opts.draft_tokens + 1) : max_sequences;
  limits.max_batch_tokens = std::max<int64_t>(kDefaultPrefillChunk, limits.max_logit_rows);
  s->model = load_model_verbose(dir.string(), *s->backend, limits);
  const ModelConfig& cfg = s->model.config;
  SALA_CHECK(s->tokenizer.vocab_size() <= cfg.vocab_size,
             "{}/tokenizer.json has {} ids but the model's vocabulary is {} (config.json vocab_size)", dir.string(),
             s->tokenizer.vocab_size(), cfg.vocab_size);

  int64_t ctx = sampling.ctx_size;
  SALA_CHECK(ctx >= 2, "--ctx-size must be at least 2, got {}", ctx);
  if (ctx > cfg.max_position_embeddings) {
    std::fprintf(stderr, "note: --ctx-size %lld exceeds the model's max_position_embeddings; using %d\n",
                 (long long)ctx, cfg.max_position_embeddings);
    ctx = cfg.max_position_embeddings;
  }
  s->engine = std::make_unique<Engine>(*s->model.model, EngineOptions{.max_sequences = max_sequences, .max_context = ctx});
  s->scheduler = std::make_unique<Scheduler>(*s->engine, SchedulerOptions{.prefill_chunk = kDefaultPrefillChunk,
                                                                           .max_batch_tokens = limits.max_batch_tokens,
                                                                           .speculative = spec_opts});
  return s;
}

void print_timing(const Scheduler& scheduler, int64_t answers) {
  const SchedulerStats& s = scheduler.stats();
  const int64_t decoded = std::max<int64_t>(0, s.generated_tokens - answers);
  auto rate = [](double n, double t) { return t > 0 ? n / t : 0.0; };
  std::fprintf(stderr,
               "timings: prompt %lld tokens, prefill %.3f s (%.1f tok/s) | generated %lld tokens, decode %.3f s "
               "(%.1f tok/s)\n",
               (long long)s.prompt_tokens, s.prefill_seconds, rate(double(s.prompt_tokens), s.prefill_seconds),
               (long long)s.generated_tokens, s.decode_seconds, rate(double(decoded), s.decode_seconds));
  if (!scheduler.speculative()) return;
  const SpeculativeStats& sp = s.speculative;
  const SpeculativeOptions& o = scheduler.options().speculative;
  std::string skipped;
  for (int r = 0; r < kDraftSkipReasons; ++r)
    skipped += fmt::format("{}{} {}", r ? ", " : "", draft_skip_name(DraftSkip(r)), sp.skipped[size_t(r)]);
  // Adaptive K: "K 8 adaptive, mean 3.52 drafts" (the largest K, and the drafts per verify step).
  const std::string k_desc =
      o.adaptive ? fmt::format("{} adaptive, mean {:.2f} drafts", o.draft_tokens,
                               sp.rounds > 0 ? double(sp.drafted) / double(sp.rounds) : 0.0)
                 : std::to_string(o.draft_tokens);
  std::fprintf(stderr,
               "speculative %s (K %s%s): %lld verify steps, acceptance %.1f%% (%lld/%lld drafts), %.2f tokens per "
               "verify step | draft %.3f s, verify %.3f s | %lld decode steps without drafts (%s)\n",
               speculative_mode_name(o.mode), k_desc.c_str(),
               o.mode == SpeculativeMode::Self ? fmt::format(", {} draft layers", o.draft_layers).c_str() : "",
               (long long)sp.rounds, 100.0 * sp.acceptance(), (long long)sp.accepted, (long long)sp.drafted,
               sp.tokens_per_round(), sp.draft_seconds, sp.verify_seconds, (long long)sp.skipped_total(),
               skipped.c_str());
}

}  // namespace sala::cli
