// Tokenizer speed with the real MiniCPM tokenizer: encode and decode of ~1M tokens of mixed text
// (the golden corpus: English, CJK, code, emoji, whitespace runs, special tokens, random mixes,
// repeated until it holds >= 1M tokens). Counter "tokens/s" = tokens per second.
#include <benchmark/benchmark.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kDir = std::string(SALA_SOURCE_DIR) + "/tests/data/tokenizer";

const sala::Tokenizer& tokenizer(bool split_words = true) {
  static const sala::Tokenizer fast = sala::Tokenizer::load(kDir);
  static const sala::Tokenizer whole = [] {
    sala::Tokenizer::Options o;
    o.split_words = false;
    return sala::Tokenizer::load(kDir, o);
  }();
  return split_words ? fast : whole;
}

// Corpus lines, repeated until the text encodes to at least 1M tokens.
const std::vector<std::string>& lines() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> corpus, out;
    std::ifstream in(kDir + "/corpus.jsonl");
    std::string line;
    while (std::getline(in, line)) corpus.push_back(nlohmann::json::parse(line).get<std::string>());
    size_t tokens = 0;
    while (tokens < 1000000)
      for (const auto& s : corpus) {
        out.push_back(s);
        tokens += tokenizer().encode(s, false).size();
      }
    return out;
  }();
  return all;
}

const std::string& one_text() {
  static const std::string text = [] {
    std::string t;
    for (const auto& s : lines()) t += s + "\n";
    return t;
  }();
  return text;
}

void set_rate(benchmark::State& state, size_t tokens) {
  state.counters["tokens"] = double(tokens);
  state.counters["tokens/s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsIterationInvariantRate);
}

// One encode call per corpus line (many short and a few 20k-character segments).
void BM_EncodeLines(benchmark::State& state) {
  const auto& t = tokenizer();
  size_t tokens = 0;
  for (auto _ : state) {
    tokens = 0;
    for (const auto& s : lines()) tokens += t.encode(s).size();
  }
  set_rate(state, tokens);
}

// The whole text as one string (one encode call, ~4 MB).
void BM_EncodeOneString(benchmark::State& state) {
  const auto& t = tokenizer(state.range(0) != 0);
  size_t tokens = 0;
  for (auto _ : state) tokens = t.encode(one_text()).size();
  set_rate(state, tokens);
}

void BM_Decode(benchmark::State& state) {
  const auto& t = tokenizer();
  auto ids = t.encode(one_text());
  size_t bytes = 0;
  for (auto _ : state) bytes = t.decode(ids).size();
  benchmark::DoNotOptimize(bytes);
  set_rate(state, ids.size());
}

void BM_StreamDecode(benchmark::State& state) {
  const auto& t = tokenizer();
  auto ids = t.encode(one_text());
  size_t bytes = 0;
  for (auto _ : state) {
    sala::StreamDecoder d(t);
    bytes = 0;
    for (int32_t id : ids) bytes += d.push(id).size();
    bytes += d.finish().size();
  }
  benchmark::DoNotOptimize(bytes);
  set_rate(state, ids.size());
}

}  // namespace

BENCHMARK(BM_EncodeLines)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeOneString)->ArgName("split_words")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StreamDecode)->Unit(benchmark::kMillisecond);
