// Needle-in-a-haystack: builds chat prompts of an exact token length with a "needle" sentence
// hidden at a given depth of filler text, runs them greedily and checks the answer. The testable
// parts (haystack construction, matching, the greedy run) live here; `sala needle` is the CLI.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace sala {

struct NeedleSpec {
  std::string needle = "The special magic number mentioned in this document is 7481.";
  std::string question = "What is the special magic number mentioned in the document? Answer with the number only.";
  std::string answer = "7481";
};

// The built-in filler: plain, neutral English prose (written for this project), repeated as needed.
const std::string& default_filler_text();

enum class MatchMode { Contains, Exact, Regex };
MatchMode parse_match_mode(const std::string& name);  // "contains", "exact", "regex"; throws otherwise
const char* match_mode_name(MatchMode mode);

// contains: `answer` occurs in `output`, ignoring case; exact: both equal after trimming
// surrounding whitespace (case-sensitive); regex: ECMAScript std::regex_search of `answer` as the
// pattern (throws sala::Error on a bad pattern).
bool answer_matches(const std::string& output, const std::string& answer, MatchMode mode);

struct Haystack {
  std::vector<int32_t> prompt;  // the full chat prompt (BOS ... assistant generation prompt)
  std::string user_text;        // the user message that encodes (through the chat template) to `prompt`
  int64_t filler_tokens = 0;    // filler token count before re-tokenization
  int64_t needle_token = -1;    // index in `prompt` of the token holding the needle's first character
  int64_t content_begin = -1;   // index in `prompt` of the first token of the haystack text
  int64_t content_end = -1;     // index in `prompt` one past the haystack text (needle + filler)
  double actual_depth = 0;      // 100 * (needle_token - content_begin) / (content_end - content_begin)
};

// Builds the prompt for a haystack of exactly `target_tokens` prompt tokens: filler ids (from
// `filler`, repeated cyclically and cut at token level) with the needle inserted at `depth_pct`
// percent of the filler (moved to the nearest word start at or before it), followed by the question,
// all through the chat template. The length is verified by tokenizing the user text back; throws
// sala::Error when the target is too small for the template, needle and question, or cannot be met.
Haystack build_haystack(const Tokenizer& tok, const std::string& filler, const NeedleSpec& spec, int64_t target_tokens,
                        double depth_pct, const ChatOptions& chat);

// Index of the token of `ids` holding byte `offset` of tok.decode(ids) (binary search over decoded
// prefixes); -1 when offset is past the end.
int64_t token_at_text_offset(const Tokenizer& tok, std::span<const int32_t> ids, size_t offset);

struct GreedyRunOptions {
  int64_t chunk = 2048;      // prompt tokens per forward
  int max_new_tokens = 32;
  std::vector<int32_t> stop_ids;  // end-of-sequence ids (not included in the output)
  // Called after each prefill chunk with (tokens done, prompt length).
  std::function<void(int64_t, int64_t)> on_prefill;
  // Called after every forward (each prefill chunk, then each decode step), when its device work is
  // finished: where a backend samples its memory use (the CUDA peak is the highest sampled value).
  std::function<void()> on_forward;
};

struct GreedyRunResult {
  std::vector<int32_t> output;
  double prefill_seconds = 0, decode_seconds = 0;  // the callbacks' own time excluded
  int64_t decode_steps = 0;  // forwards of one generated token (the first output token comes from prefill)
};

// Prefills `prompt` in chunks (dense/sparse regime by the whole prompt, spec §4.2) on a fresh
// sequence, then decodes greedily (argmax) until a stop id or max_new_tokens. The engine needs one
// free sequence, max_context >= prompt + max_new_tokens, and max_batch_tokens >= chunk.
GreedyRunResult greedy_run(Engine& engine, std::span<const int32_t> prompt, const GreedyRunOptions& options);

// Peak resident set size (host memory) of this process since it started, in bytes (VmHWM; 0 when
// unknown).
int64_t peak_rss_bytes();

}  // namespace sala
