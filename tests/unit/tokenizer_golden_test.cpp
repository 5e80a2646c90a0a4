// Parity with the reference HF `tokenizers` library on the golden corpus (tests/data/tokenizer):
// corpus.jsonl (make_corpus.py) and golden/*.jsonl (make_goldens.py, run with tokenizers 0.23).
// The plain goldens come from tokenizer.json alone, so they are compared with
// reasoning_markers_as_added = false; ids_markers.jsonl was made with the markers (ids 101-114)
// added to HF as non-special, non-normalized tokens and is compared with the engine default.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/stream_decoder.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace sala;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(SALA_TEST_DATA) / "data" / "tokenizer";

std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

const std::vector<std::string>& corpus() {
  static const auto c = [] {
    std::vector<std::string> v;
    for (auto& j : read_jsonl(kDir / "corpus.jsonl")) v.push_back(j.get<std::string>());
    return v;
  }();
  return c;
}

std::vector<std::vector<int32_t>> read_ids(const fs::path& p) {
  std::vector<std::vector<int32_t>> v;
  for (auto& j : read_jsonl(p)) v.push_back(j.is_null() ? std::vector<int32_t>{-1} : j.get<std::vector<int32_t>>());
  return v;
}

Tokenizer load(bool markers, bool split = true) {
  Tokenizer::Options o;
  o.reasoning_markers_as_added = markers;
  o.split_words = split;
  return Tokenizer::load(kDir / "tokenizer.json", o);
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 40; ++i) s += std::to_string(v[i]) + " ";
  return s + (v.size() > 40 ? "..." : "");
}

// Encodes every corpus line and compares with the golden ids; reports the first mismatches.
void expect_ids(const Tokenizer& t, const std::vector<std::vector<int32_t>>& golden) {
  ASSERT_EQ(golden.size(), corpus().size());
  size_t bad = 0;
  for (size_t i = 0; i < golden.size(); ++i) {
    if (golden[i] == std::vector<int32_t>{-1}) continue;  // not produced for this line
    auto ids = t.encode(corpus()[i]);
    if (ids == golden[i]) continue;
    if (++bad <= 5) {
      size_t k = 0;
      while (k < ids.size() && k < golden[i].size() && ids[k] == golden[i][k]) ++k;
      ADD_FAILURE() << "line " << i + 1 << " (" << corpus()[i].size() << " bytes) differs at token " << k
                    << "\n  ours: " << show(std::vector<int32_t>(ids.begin() + long(k), ids.end()))
                    << "\n  HF:   " << show(std::vector<int32_t>(golden[i].begin() + long(k), golden[i].end()));
    }
  }
  EXPECT_EQ(bad, 0u) << "lines whose ids differ from HF";
}

}  // namespace

TEST(TokenizerGolden, CorpusIsLargeAndVaried) {
  const auto& c = corpus();
  EXPECT_GE(c.size(), 1000u);
  EXPECT_TRUE(std::any_of(c.begin(), c.end(), [](auto& s) { return s.empty(); }));
  EXPECT_GE(std::count_if(c.begin(), c.end(), [](auto& s) { return s.size() >= 20000; }), 3);
  auto meta = nlohmann::json::parse(std::ifstream(kDir / "golden" / "meta.json"));
  EXPECT_EQ(meta["corpus_lines"].get<size_t>(), c.size());
  EXPECT_TRUE(meta["tokenizers_version"].get<std::string>().starts_with("0.2"));
}

TEST(TokenizerGolden, IdsMatchHf) { expect_ids(load(false), read_ids(kDir / "golden" / "ids.jsonl")); }

// The whole-segment merge path (no word-split shortcut) must agree too.
TEST(TokenizerGolden, IdsMatchHfWithoutWordSplit) {
  expect_ids(load(false, false), read_ids(kDir / "golden" / "ids.jsonl"));
}

TEST(TokenizerGolden, IdsWithReasoningMarkersMatchHf) {
  auto meta = nlohmann::json::parse(std::ifstream(kDir / "golden" / "meta.json"));
  EXPECT_EQ(meta["marker_ids"]["<think>"], 101);
  EXPECT_EQ(meta["marker_ids"]["</param>"], 114);
  expect_ids(load(true), read_ids(kDir / "golden" / "ids_markers.jsonl"));
}

TEST(TokenizerGolden, DecodeMatchesHf) {
  auto t = load(false);
  auto ids = read_ids(kDir / "golden" / "ids.jsonl");
  auto text = read_jsonl(kDir / "golden" / "decoded.jsonl");
  auto text_skip = read_jsonl(kDir / "golden" / "decoded_skip.jsonl");
  ASSERT_EQ(ids.size(), text.size());
  size_t bad = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    bool ok = t.decode(ids[i]) == text[i].get<std::string>() && t.decode(ids[i], true) == text_skip[i].get<std::string>();
    if (!ok && ++bad <= 5) ADD_FAILURE() << "decode differs on line " << i + 1;
  }
  EXPECT_EQ(bad, 0u);
}

// decode(encode(s)) gives s back for every line without special-token strings or "▁".
TEST(TokenizerGolden, RoundTrip) {
  auto t = load(false);
  size_t checked = 0;
  for (const auto& s : corpus()) {
    bool skip = s.find("▁") != std::string::npos;
    for (const auto& a : t.added_tokens()) skip = skip || s.find(a.content) != std::string::npos;
    if (skip) continue;
    ASSERT_EQ(t.decode(t.encode(s), true), s);
    ++checked;
  }
  EXPECT_GT(checked, 700u);
}

TEST(TokenizerGolden, StreamDecoderEqualsFullDecode) {
  for (bool markers : {false, true}) {
    auto t = load(markers);
    for (const auto& s : corpus()) {
      auto ids = t.encode(s);
      for (bool skip : {false, true}) {
        StreamDecoder d(t, skip);
        std::string out;
        for (int32_t id : ids) out += d.push(id);
        out += d.finish();
        ASSERT_EQ(out, t.decode(ids, skip)) << s.substr(0, 80);
      }
    }
  }
}

// Hand-made id sequences (invalid byte runs, specials between bytes, leading spaces). The stream
// equals the full decode except on runs of byte pieces that are not valid UTF-8 (see
// stream_decoder.h), and never emits invalid UTF-8.
TEST(TokenizerGolden, DecodeCasesMatchHf) {
  auto t = load(false);
  auto cases = read_jsonl(kDir / "golden" / "decode_cases.jsonl");
  EXPECT_GE(cases.size(), 30u);
  for (const auto& c : cases) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(t.decode(ids), c["text"].get<std::string>()) << c["pieces"].dump();
    EXPECT_EQ(t.decode(ids, true), c["text_skip"].get<std::string>()) << c["pieces"].dump();
    bool runs_valid = true;
    std::string run;
    for (const auto& p : c["pieces"]) {
      auto s = p.get<std::string>();
      if (s.size() == 6 && s.starts_with("<0x")) {
        run.push_back(char(std::stoi(s.substr(3, 2), nullptr, 16)));
        continue;
      }
      runs_valid = runs_valid && utf8::is_valid(run);
      run.clear();
    }
    runs_valid = runs_valid && utf8::is_valid(run);
    StreamDecoder d(t);
    std::string out;
    for (int32_t id : ids) out += d.push(id);
    out += d.finish();
    EXPECT_TRUE(utf8::is_valid(out));
    if (runs_valid) EXPECT_EQ(out, t.decode(ids)) << c["pieces"].dump();
  }
}

// tiny_tokenizer_<N>.json are make_tiny_tokenizer_json(N) (SALA_UPDATE_GOLDENS=1 rewrites them);
// tiny_tokenizer_flags.json adds tokens with lstrip/rstrip/single_word/normalized set.
TEST(TokenizerGolden, TinyTokenizersMatchHf) {
  int files = 0;
  for (const auto& e : fs::directory_iterator(kDir)) {
    std::string name = e.path().filename().string();
    if (!name.starts_with("tiny_tokenizer_") || e.path().extension() != ".json") continue;
    std::string tag = name.substr(15, name.size() - 15 - 5);
    auto j = nlohmann::json::parse(std::ifstream(e.path()));
    if (std::all_of(tag.begin(), tag.end(), ::isdigit)) {
      auto made = make_tiny_tokenizer_json(std::stoi(tag));
      if (std::getenv("SALA_UPDATE_GOLDENS")) std::ofstream(e.path()) << made.dump(1) << "\n", j = made;
      EXPECT_EQ(made, j) << name << " is not make_tiny_tokenizer_json(" << tag << ")";
    }
    SCOPED_TRACE(name);
    auto t = Tokenizer::from_json(j, {}, name);
    expect_ids(t, read_ids(kDir / "golden" / ("tiny_" + tag + "_ids.jsonl")));
    auto ids = read_ids(kDir / "golden" / ("tiny_" + tag + "_ids.jsonl"));
    auto text = read_jsonl(kDir / "golden" / ("tiny_" + tag + "_decoded.jsonl"));
    for (size_t i = 0; i < ids.size(); ++i)
      if (!text[i].is_null()) ASSERT_EQ(t.decode(ids[i]), text[i].get<std::string>()) << "line " << i + 1;
    ++files;
  }
  EXPECT_GE(files, 3);
}
