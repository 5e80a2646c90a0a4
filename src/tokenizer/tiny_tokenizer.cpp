#include "tokenizer/tiny_tokenizer.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace sala {
namespace {

constexpr const char* kMark = "\xE2\x96\x81";  // "▁"

// Training text for the merges (written for this purpose).
constexpr const char* kEnglish =
    "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore, and the "
    "shells she sells are surely sea shells. In the morning the weather was cold and clear, so we "
    "walked to the station and took the first train into the city. There are many things that "
    "we can learn from reading, writing and talking with other people about their ideas. What is "
    "the time? It is ten past nine, and the meeting starts at half past ten. Please tell me how "
    "you would like to proceed with the project, and which parts should be finished first. The "
    "model reads the input text, then it writes an answer one token at a time until it reaches "
    "the end. When the number is larger than one hundred, the program prints a warning and "
    "returns an error. Thank you for your help; the results were better than we expected, and "
    "the team is working on the next version. He said that the children were playing in the "
    "garden while their parents were cooking dinner in the kitchen. This is a simple example of "
    "a sentence that contains the most common English words, such as the, of, and, to, in, is, "
    "that, for, it, with, as, was, on, be, at, by, this, have, from, or, one, had, not, but, "
    "what, all, were, when, we, there, can, an, your, which, their, said, if, do, will, each, "
    "about, how, up, out, them, then, she, many, some, so, these, would, other, into, has, more, "
    "her, two, like, him, see, time, could, no, make, than, first, been, its, who, now, people, "
    "my, made, over, did, down, only, way, find, use, may, water, long, little, very, after, "
    "words, called, just, where, most, know, get, through, back, much, before, go, good, new, "
    "write, our, used, me, man, too, any, day, same, right, look, think, also, around, another, "
    "came, come, work, three, word, must, because, does, part, even, place, well, such, here, "
    "take, why, things, help, put, years, different, away, again, off, went, old, number.";

// Training words: normalized text ("▁" + spaces as "▁"), cut in front of each "▁", as symbols.
std::map<std::vector<std::string>, int> training_words() {
  std::string text = kEnglish;
  std::map<std::vector<std::string>, int> words;
  std::vector<std::string> word;
  for (char c : text) {
    if (c == ' ') {
      if (!word.empty()) words[word]++;
      word = {kMark};
    } else {
      if (word.empty()) word = {kMark};
      word.push_back(std::string(1, c));
    }
  }
  if (!word.empty()) words[word]++;
  return words;
}

}  // namespace

nlohmann::json tiny_tokenizer_eos_ids() { return nlohmann::json::array({2, 4}); }

nlohmann::json make_tiny_tokenizer_json(int vocab_size) {
  if (vocab_size < kTinyMinVocab)
    fail("tiny tokenizer: vocab_size {} is too small (minimum {}: 5 special + 256 byte pieces + characters)",
         vocab_size, kTinyMinVocab);
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
  for (int b = 0; b < 256; ++b) pieces.push_back(fmt::format("<0x{:02X}>", b));
  pieces.push_back(kMark);

  // Single characters, most frequent in the training text first.
  std::map<char, int> freq;
  for (const char* p = kEnglish; *p; ++p) freq[*p]++;
  std::vector<char> chars;
  for (int c = 0x21; c < 0x7F; ++c) chars.push_back(char(c));
  chars.push_back('\n');
  chars.push_back('\t');
  std::stable_sort(chars.begin(), chars.end(), [&](char a, char b) { return freq[a] > freq[b]; });
  for (char c : chars) {
    if (int(pieces.size()) >= vocab_size) break;
    pieces.push_back(std::string(1, c));
  }
  std::set<std::string> known(pieces.begin(), pieces.end());

  // Merges: repeatedly join the most frequent adjacent pair (ties: smallest pair), as long as it
  // occurs and both halves are pieces (until every training word is one piece).
  nlohmann::json merges = nlohmann::json::array();
  auto words = training_words();
  while (int(pieces.size()) < vocab_size) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& [w, n] : words)
      for (size_t i = 0; i + 1 < w.size(); ++i)
        if (known.count(w[i]) && known.count(w[i + 1])) counts[{w[i], w[i + 1]}] += n;
    const std::pair<std::string, std::string>* best = nullptr;
    int best_n = 0;
    for (const auto& [pair, n] : counts)
      if (n > best_n) best = &pair, best_n = n;
    if (!best) break;
    auto [a, b] = *best;
    merges.push_back({a, b});
    if (known.insert(a + b).second) pieces.push_back(a + b);
    std::map<std::vector<std::string>, int> next;
    for (const auto& [w, n] : words) {
      std::vector<std::string> m;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) m.push_back(a + b), ++i;
        else m.push_back(w[i]);
      }
      next[m] += n;
    }
    words = std::move(next);
  }
  for (int k = 0; int(pieces.size()) < vocab_size; ++k) pieces.push_back(fmt::format("<reserved_{}>", k));

  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = int(i);
  nlohmann::json added = nlohmann::json::array();
  for (int id = 0; id < 5; ++id)
    added.push_back({{"id", id}, {"content", pieces[size_t(id)]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  auto replace = [](const char* from, const char* to) {
    return nlohmann::json{{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
  };
  nlohmann::json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "Prepend"}, {"prepend", kMark}}, replace(" ", kMark)}}};
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "<s>"}, {"type_id", 1}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {replace(kMark, " "), {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},        {"unk_token", "<unk>"},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                {"fuse_unk", true},       {"byte_fallback", true},     {"ignore_merges", false},
                {"vocab", vocab},         {"merges", merges}};
  return j;
}

}  // namespace sala
