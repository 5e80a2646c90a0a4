#include "engine/needle.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>

#include "core/error.h"

namespace sala {

const std::string& default_filler_text() {
  static const std::string text =
      "The river town woke slowly in the early spring. Boats drifted past the old stone bridge while the baker "
      "opened his shutters and set out loaves of bread on a long wooden table. Children walked to school along the "
      "canal, counting the ducks and arguing about the names of the hills that rose beyond the fields. In the "
      "library, a clerk sorted letters by date and wrote short notes in the margins of a heavy ledger. The weather "
      "was mild, and the wind carried the smell of wet grass and wood smoke across the square. Farmers brought "
      "carts of turnips, apples and cabbages to the market, where prices were written in chalk on small slate "
      "boards. A teacher explained to her class how water moves from the sea to the clouds and back to the land as "
      "rain, and how the river had carved its valley over many thousands of years. In the afternoon the light "
      "turned golden, the shops grew quiet, and the town council met to discuss the repair of the north road, the "
      "cost of new lamps for the harbour, and the schedule of the summer fair. Nobody was in a hurry, and the days "
      "followed one another like the slow turning of a mill wheel.\n";
  return text;
}

MatchMode parse_match_mode(const std::string& name) {
  if (name == "contains") return MatchMode::Contains;
  if (name == "exact") return MatchMode::Exact;
  if (name == "regex") return MatchMode::Regex;
  fail("unknown match mode '{}' (known: contains, exact, regex)", name);
}

const char* match_mode_name(MatchMode mode) {
  switch (mode) {
    case MatchMode::Contains: return "contains";
    case MatchMode::Exact: return "exact";
    case MatchMode::Regex: return "regex";
  }
  return "?";
}

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

bool answer_matches(const std::string& output, const std::string& answer, MatchMode mode) {
  switch (mode) {
    case MatchMode::Contains:
      return lower(output).find(lower(answer)) != std::string::npos;
    case MatchMode::Exact:
      return trim(output) == trim(answer);
    case MatchMode::Regex: {
      std::regex re;
      try {
        re = std::regex(answer, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        fail("--answer is not a valid regular expression ('{}'): {}", answer, e.what());
      }
      return std::regex_search(output, re);
    }
  }
  return false;
}

int64_t token_at_text_offset(const Tokenizer& tok, std::span<const int32_t> ids, size_t offset) {
  // Largest i with |decode(ids[0:i])| <= offset: tokens 0..i-1 end at or before the offset.
  int64_t lo = 0, hi = int64_t(ids.size());
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (tok.decode(ids.first(size_t(mid))).size() <= offset) lo = mid;
    else hi = mid - 1;
  }
  return lo < int64_t(ids.size()) ? lo : -1;
}

Haystack build_haystack(const Tokenizer& tok, const std::string& filler, const NeedleSpec& spec, int64_t target,
                        double depth_pct, const ChatOptions& chat) {
  SALA_CHECK(depth_pct >= 0 && depth_pct <= 100, "needle depth must be within 0..100 %, got {}", depth_pct);
  SALA_CHECK(!spec.needle.empty(), "the needle text is empty");
  const std::vector<int32_t> F = tok.encode(filler, /*add_special_tokens=*/false);
  SALA_CHECK(!F.empty(), "the filler text is empty");
  static const std::string kWordMark = "\xE2\x96\x81";  // "▁"
  auto word_start = [&](int32_t id) { return tok.id_to_piece(id).rfind(kWordMark, 0) == 0; };

  struct Built {
    std::string user_text;
    std::vector<int32_t> prompt;
  };
  std::map<int64_t, Built> cache;
  auto compose = [&](int64_t n) -> const Built& {
    if (auto it = cache.find(n); it != cache.end()) return it->second;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = F[size_t(i) % F.size()];
    int64_t p = std::llround(double(n) * depth_pct / 100.0);
    p = std::clamp<int64_t>(p, 0, n);
    while (p > 0 && p < n && !word_start(ids[size_t(p)])) --p;
    const std::string before = tok.decode(std::span(ids).first(size_t(p)));
    const std::string after = tok.decode(std::span(ids).subspan(size_t(p)));
    std::string content = before;
    if (!before.empty()) content += " ";
    content += spec.needle;
    if (!after.empty()) content += " " + after;
    Built b;
    b.user_text = content + "\n\n" + spec.question;
    const ChatMessage msg{"user", b.user_text};
    b.prompt = encode_chat(tok, std::span(&msg, 1), chat);
    return cache.emplace(n, std::move(b)).first->second;
  };

  const int64_t base = int64_t(compose(0).prompt.size());
  SALA_CHECK(target > base, "context {} is too small: the chat template, needle and question alone take {} tokens",
             target, base);
  int64_t n = target - base, found = -1;
  for (int iter = 0; iter < 40 && found < 0; ++iter) {
    const int64_t len = int64_t(compose(n).prompt.size());
    if (len == target) {
      found = n;
      break;
    }
    const int64_t next = std::max<int64_t>(0, n + (target - len));
    if (cache.count(next)) break;  // a cycle: search around instead
    n = next;
  }
  for (int64_t d = 1; d <= 64 && found < 0; ++d)
    for (int64_t c : {n + d, n - d})
      if (found < 0 && c >= 0 && int64_t(compose(c).prompt.size()) == target) found = c;
  SALA_CHECK(found >= 0, "cannot build a haystack of exactly {} tokens from this filler", target);

  const Built& b = compose(found);
  Haystack h;
  h.prompt = b.prompt;
  h.user_text = b.user_text;
  h.filler_tokens = found;
  // Verification by tokenizing back: the user text encodes to this prompt, and the needle is found
  // in the decoded prompt.
  const ChatMessage msg{"user", h.user_text};
  SALA_CHECK(encode_chat(tok, std::span(&msg, 1), chat) == h.prompt, "haystack prompt does not re-tokenize to itself");
  const std::string full = tok.decode(h.prompt);
  const std::string content = h.user_text.substr(0, h.user_text.size() - spec.question.size() - 2);
  const size_t content_off = full.find(content);
  SALA_CHECK(content_off != std::string::npos, "haystack text does not survive decoding (tokenizer round trip)");
  const size_t needle_off = full.find(spec.needle, content_off);
  SALA_CHECK(needle_off != std::string::npos, "needle not found in the decoded haystack");
  h.content_begin = token_at_text_offset(tok, h.prompt, content_off);
  h.needle_token = token_at_text_offset(tok, h.prompt, needle_off);
  h.content_end = token_at_text_offset(tok, h.prompt, content_off + content.size());
  if (h.content_end < 0) h.content_end = int64_t(h.prompt.size());
  const double span = double(std::max<int64_t>(1, h.content_end - h.content_begin));
  h.actual_depth = 100.0 * double(h.needle_token - h.content_begin) / span;
  return h;
}

namespace {

int32_t argmax_row(std::span<const float> logits, int vocab) {
  const float* row = logits.data() + logits.size() - size_t(vocab);
  return int32_t(std::max_element(row, row + vocab) - row);
}

}  // namespace

GreedyRunResult greedy_run(Engine& engine, std::span<const int32_t> prompt, const GreedyRunOptions& options) {
  using Clock = std::chrono::steady_clock;
  SALA_CHECK(!prompt.empty(), "greedy_run: empty prompt");
  const int vocab = engine.model().config().vocab_size;
  const int64_t n = int64_t(prompt.size());
  const int64_t chunk = options.chunk > 0 ? options.chunk : n;
  GreedyRunResult r;
  const ScopedSequence sequence(engine);
  const int seq = sequence.id();

  // The callbacks (progress bars, memory sampling) are not part of the timed work.
  double hooks = 0;
  auto hook = [&](auto&& fn) {
    const auto h0 = Clock::now();
    fn();
    hooks += std::chrono::duration<double>(Clock::now() - h0).count();
  };
  auto t0 = Clock::now();
  std::vector<float> last;
  for (int64_t done = 0; done < n;) {
    const int64_t take = std::min(chunk, n - done);
    const bool final_chunk = done + take == n;
    Engine::Request req{seq, prompt.subspan(size_t(done), size_t(take)), n, false, final_chunk};
    auto out = engine.step(std::span(&req, 1));
    done += take;
    if (final_chunk) last.assign(out[0].begin(), out[0].end());
    hook([&] {
      if (options.on_forward) options.on_forward();
      if (options.on_prefill) options.on_prefill(done, n);
    });
  }
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count() - hooks;

  auto is_stop = [&](int32_t t) {
    return std::find(options.stop_ids.begin(), options.stop_ids.end(), t) != options.stop_ids.end();
  };
  int32_t next = argmax_row(last, vocab);
  hooks = 0;
  t0 = Clock::now();
  while (int(r.output.size()) < options.max_new_tokens && !is_stop(next)) {
    r.output.push_back(next);
    if (int(r.output.size()) == options.max_new_tokens) break;
    Engine::Request req{seq, std::span(&r.output.back(), 1)};
    auto out = engine.step(std::span(&req, 1));
    ++r.decode_steps;
    if (options.on_forward) hook(options.on_forward);
    next = argmax_row(out[0], vocab);
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count() - hooks;
  return r;
}

int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

}  // namespace sala
