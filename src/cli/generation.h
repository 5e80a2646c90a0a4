// CLI glue shared by `generate`, `chat` and `batch`: sampling flags, prompt flags, the built-in
// default model, opening model + tokenizer + scheduler, and the timing summary.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cli/common.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "engine/text_stream.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace sala::cli {

// --temperature ... --ctx-size: how tokens are chosen and how many.
struct SamplingOptions {
  SamplingParams params;  // defaults of spec §5.3: temperature 0.9, top_p 1, top_k 50
  int max_tokens = 256;
  std::vector<std::string> stop;
  int64_t ctx_size = 4096;
  bool ignore_eos = false;
  void add(CLI::App& app);
  // The parameters with the seed resolved: --seed if given, else one random seed per process
  // (drawn once, so every request of a run gets the same one unless the caller varies it).
  SamplingParams resolved() const;

 private:
  CLI::Option* seed_opt_ = nullptr;
};

// --raw, --system, --no-think: how a prompt text becomes ids.
struct PromptOptions {
  bool raw = false;  // the text as is, with BOS; no chat template
  std::string system;
  bool no_think = false;  // empty think block in the prompt + reasoning hidden in the output
  void add(CLI::App& app, bool allow_raw = true);
  ChatOptions chat() const;
  std::vector<int32_t> encode(const Tokenizer& tok, const std::string& user_text) const;
  std::vector<int32_t> encode(const Tokenizer& tok, std::span<const ChatMessage> history) const;
  TextStreamOptions text_options(const std::vector<std::string>& stop) const;
};

// --speculative self|lookup, --draft-layers N, --draft-tokens K, --adaptive-draft
// (docs/speculative.md).
struct SpeculativeCliOptions {
  std::string mode;  // "" = off
  int draft_layers = 8;
  int draft_tokens = 4;
  bool adaptive = false;  // K per sequence within [1, draft_tokens], from its acceptance
  void add(CLI::App& app);
  bool on() const { return parse_speculative_mode(mode) != SpeculativeMode::Off; }
  SpeculativeOptions options() const;
};

// "" or "default": the built-in default model (a small random checkpoint, created on first use
// under $SALA_HOME/default-small or ~/.cache/sala/default-small); anything else is returned as is.
std::string resolve_model_ref(const std::string& ref);

// Everything a generating command holds, in destruction-safe order. Requests go to the scheduler
// (with --speculative it speculates inside continuous batching).
struct GenerationSession {
  std::unique_ptr<Backend> backend;
  LoadedModel model;
  Tokenizer tokenizer;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Scheduler> scheduler;
};

// Loads tokenizer (printing the chat-template warning once when `chat` is set) and model, and
// sizes engine and scheduler for `max_sequences` live sequences of sampling.ctx_size tokens (and,
// speculating, for every sequence verifying K drafts in the same step).
std::unique_ptr<GenerationSession> open_session(const std::string& model_ref, const BackendOptions& backend,
                                                const SamplingOptions& sampling, int max_sequences, bool chat,
                                                const SpeculativeCliOptions* speculative = nullptr);

// The llama.cpp-style summary on stderr. `answers`: requests that produced at least one token
// (their first token comes from a prefill step, so it is not counted as decode). A speculating
// scheduler adds a line with acceptance rate, tokens per verify step and steps without drafts.
void print_timing(const Scheduler& scheduler, int64_t answers);

}  // namespace sala::cli
