// Unit tests of the tokenizer, streaming detokenizer, chat layout, think filter and tiny tokenizer.
// The real tokenizer is the copy in tests/data/tokenizer/. Tests that compare with HF behaviour
// load it with reasoning_markers_as_added = false (HF with tokenizer.json alone does not have
// the markers); the engine default (markers on) is tested separately.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace sala;

namespace {

const std::string kDir = std::string(SALA_TEST_DATA) + "/data/tokenizer";

const Tokenizer& real(bool markers = false) {
  static const Tokenizer plain = [] {
    Tokenizer::Options o;
    o.reasoning_markers_as_added = false;
    return Tokenizer::load(kDir + "/tokenizer.json", o);
  }();
  static const Tokenizer with_markers = Tokenizer::load(kDir);
  return markers ? with_markers : plain;
}

int32_t id_of(const Tokenizer& t, std::string_view piece) {
  auto id = t.piece_to_id(piece);
  if (!id) throw std::runtime_error("no piece " + std::string(piece));
  return *id;
}

std::vector<std::string> pieces(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::vector<std::string> p;
  for (int32_t id : ids) p.push_back(t.id_to_piece(id));
  return p;
}

std::string stream_all(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip = false) {
  StreamDecoder d(t, skip);
  std::string s;
  for (int32_t id : ids) {
    std::string piece = d.push(id);
    EXPECT_TRUE(utf8::is_valid(piece));
    s += piece;
  }
  return s + d.finish();
}

// Expects `f` to throw sala::Error whose message contains `needle`.
template <typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Tokenizer, SpecExampleHasBosPlusFive) {
  auto ids = real().encode("Hello, my name is");
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 21045, 59342, 1863, 2258, 1410}));
  EXPECT_EQ(real().encode("Hello, my name is", false).size(), 5u);
  EXPECT_EQ(real().bos_id(), 1);
  EXPECT_EQ(real().vocab_size(), 73448);
}

TEST(Tokenizer, EmptyTextIsOnlyBos) {
  EXPECT_EQ(real().encode(""), std::vector<int32_t>{1});
  EXPECT_TRUE(real().encode("", false).empty());
}

TEST(Tokenizer, SpecialTokensInsideText) {
  const auto& t = real();
  // Each segment between special tokens is normalized separately, so "b" also gets "▁".
  EXPECT_EQ(pieces(t, t.encode("a<s>b</s>c")), (std::vector<std::string>{"<s>", "▁a", "<s>", "▁b", "</s>", "▁c"}));
  auto ids = t.encode("<|im_start|>user\nHi<|im_end|>");
  EXPECT_EQ(ids[1], 73441);
  EXPECT_EQ(ids.back(), 73440);
  EXPECT_EQ(pieces(t, t.encode("<tool_call><|fim_prefix|>", false)), (std::vector<std::string>{"<tool_call>", "<|fim_prefix|>"}));
}

TEST(Tokenizer, LookalikesAreNotSpecial) {
  const auto& t = real();
  for (std::string s : {"<|im_start", "<s >", "< s>", "<S>", "<|im_end|", "</s", "<|IM_START|>", "<tool_call"}) {
    auto ids = t.encode(s, false);
    for (int32_t id : ids) EXPECT_FALSE(t.is_special(id)) << s;
    EXPECT_EQ(t.decode(ids), s);
  }
  // Leftmost-longest: the inner real token is still found.
  auto ids = t.encode("<|im_s<|im_start|>tart|>", false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 73441), 1);
}

TEST(Tokenizer, ByteFallbackForRareCharacters) {
  const auto& t = real();
  auto p = pieces(t, t.encode("\xF0\xA0\x80\x80", false));  // U+20000, not in the vocabulary
  EXPECT_EQ(p, (std::vector<std::string>{"▁", "<0xF0>", "<0xA0>", "<0x80>", "<0x80>"}));
  EXPECT_EQ(t.decode(t.encode("\xF0\xA0\x80\x80")), "<s> \xF0\xA0\x80\x80");
  EXPECT_EQ(t.decode(t.encode("\xF0\xA0\x80\x80"), true), "\xF0\xA0\x80\x80");
}

TEST(Tokenizer, DecodeReplacesSpaceMarkAndStripsOneLeadingSpace) {
  const auto& t = real();
  EXPECT_EQ(t.decode(std::vector<int32_t>{id_of(t, "▁Hello")}), "Hello");
  EXPECT_EQ(t.decode(std::vector<int32_t>{id_of(t, "▁▁"), id_of(t, "▁Hello")}), "  Hello");
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, id_of(t, "▁Hello")}), "<s> Hello");
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, id_of(t, "▁Hello")}, true), "Hello");
  for (std::string s : {" hi", "  two", "trailing  ", "\ttab", "a  b   c"}) EXPECT_EQ(t.decode(t.encode(s), true), s);
}

TEST(Tokenizer, InvalidByteRunsBecomeOneReplacementPerByte) {
  const auto& t = real();
  auto b = [&](int v) { return id_of(t, fmt::format("<0x{:02X}>", v)); };
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(t.decode(std::vector<int32_t>{b(0xE4), b(0xB8), b(0xAD)}), "中");
  EXPECT_EQ(t.decode(std::vector<int32_t>{b(0xE4), b(0xB8), id_of(t, "▁a")}), r + r + " a");
  // HF invalidates the whole run, including the complete "A".
  EXPECT_EQ(t.decode(std::vector<int32_t>{b(0x41), b(0xFF)}), r + r);
  // Skipped special tokens do not break a run.
  EXPECT_EQ(t.decode(std::vector<int32_t>{b(0xE4), 1, b(0xB8), b(0xAD)}, true), "中");
}

TEST(Tokenizer, InvalidUtf8InputIsRepairedFirst) {
  const auto& t = real();
  EXPECT_EQ(t.encode("a\xFF" "b"), t.encode("a\xEF\xBF\xBD" "b"));
  EXPECT_EQ(t.encode("\xE4\xB8"), t.encode("\xEF\xBF\xBD"));            // truncated character: one U+FFFD
  EXPECT_EQ(t.encode("x\xC0\x80y"), t.encode("x\xEF\xBF\xBD\xEF\xBF\xBDy"));  // overlong: two
  EXPECT_EQ(utf8::repair("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

TEST(Tokenizer, UnknownIdsThrow) {
  expect_error([] { real().decode(std::vector<int32_t>{73448}); }, "73448");
  expect_error([] { real().decode(std::vector<int32_t>{-1}); }, "-1");
  expect_error([] { StreamDecoder d(real()); d.push(100000); }, "100000");
}

TEST(Tokenizer, ReasoningMarkersAsAddedTokens) {
  const auto& m = real(true);
  EXPECT_TRUE(m.reasoning_markers_added());
  EXPECT_FALSE(real(false).reasoning_markers_added());
  auto ids = m.encode("<think>\nhmm\n</think>\n\nok", false);
  EXPECT_EQ(ids.front(), 101);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 102), 1);
  EXPECT_FALSE(m.is_special(101));
  // As in HF, the text after an added token is a new segment and gets the "▁" prefix.
  EXPECT_EQ(m.decode(ids, true), "<think> \nhmm\n</think> \n\nok");
  // Without the option the text is split into ordinary pieces.
  auto plain = real(false).encode("<think>", false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 101), 0);
  // Tiny vocabularies are unaffected.
  auto tiny = Tokenizer::from_json(make_tiny_tokenizer_json(1000));
  EXPECT_FALSE(tiny.reasoning_markers_added());
}

TEST(Tokenizer, WordSplitShortcutChangesNothing) {
  Tokenizer::Options o;
  o.reasoning_markers_as_added = false;
  o.split_words = false;
  auto whole = Tokenizer::load(kDir, o);
  for (std::string s : std::vector<std::string>{"Hello world, this is  a test.", "   many   spaces   ",
                                                "中文 mixed with English 和 emoji 😀", "x" + std::string(300, ' ') + "y",
                                                "def f():\n    return 1\n"})
    EXPECT_EQ(whole.encode(s), real().encode(s)) << s;
}

TEST(StreamDecoder, EqualsFullDecodeOneIdAtATime) {
  const auto& t = real();
  for (std::string s : {"Hello, world!", " leading space", "中文字符和😀👨‍👩‍👧 emoji", "\xF0\xA0\x80\x80 rare",
                        "<s> special </s>", "  ", ""}) {
    auto ids = t.encode(s);
    EXPECT_EQ(stream_all(t, ids), t.decode(ids)) << s;
    EXPECT_EQ(stream_all(t, ids, true), t.decode(ids, true)) << s;
  }
}

TEST(StreamDecoder, EmitsCharacterOnlyWhenComplete) {
  const auto& t = real();
  auto b = [&](int v) { return id_of(t, fmt::format("<0x{:02X}>", v)); };
  StreamDecoder d(t);
  EXPECT_EQ(d.push(id_of(t, "▁x")), "x");  // leading space stripped at the start of the stream only
  EXPECT_EQ(d.push(b(0xF0)), "");
  EXPECT_EQ(d.push(b(0xA0)), "");
  EXPECT_EQ(d.push(b(0x80)), "");
  EXPECT_EQ(d.push(b(0x80)), "\xF0\xA0\x80\x80");
  EXPECT_EQ(d.push(id_of(t, "▁y")), " y");
  EXPECT_EQ(d.finish(), "");
}

TEST(StreamDecoder, InvalidBytesBecomeReplacementCharacters) {
  const auto& t = real();
  auto b = [&](int v) { return id_of(t, fmt::format("<0x{:02X}>", v)); };
  const std::string r = "\xEF\xBF\xBD";
  // Incomplete character at a run end or the stream end: one U+FFFD per byte, like decode.
  std::vector<int32_t> ids = {b(0xE4), b(0xB8), id_of(t, "▁a"), b(0xE4)};
  EXPECT_EQ(stream_all(t, ids), t.decode(ids));
  EXPECT_EQ(stream_all(t, ids), r + r + " a" + r);
  // A bad byte after a complete character: the character was already emitted (documented
  // difference from the full decode, which replaces the whole run).
  std::vector<int32_t> late = {b(0x41), b(0xFF), b(0x42)};
  EXPECT_EQ(stream_all(t, late), "A" + r + r);
  EXPECT_EQ(t.decode(late), r + r + r);
}

TEST(ThinkFilter, HidesBlocksWithMarkersSplitAnywhere) {
  const std::string text = "Hello <think>\nreason a < b </ think\n</think>\n\nAnswer <thi not a marker. <think>x</think>y<";
  const std::string visible = "Hello Answer <thi not a marker. y<";
  const std::string reasoning = "\nreason a < b </ think\nx";
  {
    ThinkFilter f;
    std::string out = f.push(text);
    EXPECT_EQ(out + f.finish(), visible);
    EXPECT_EQ(f.take_reasoning(), reasoning);
  }
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); j += 3) {
      ThinkFilter f;
      std::string out = f.push(text.substr(0, i));
      out += f.push(text.substr(i, j - i));
      out += f.push(text.substr(j));
      out += f.finish();
      ASSERT_EQ(out, visible) << i << " " << j;
      ASSERT_EQ(f.take_reasoning(), reasoning);
    }
  ThinkFilter f;
  std::string out;
  for (char c : text) out += f.push(std::string(1, c));
  EXPECT_EQ(out + f.finish(), visible);
}

TEST(ThinkFilter, StartInsideAndUnterminated) {
  auto run = [](ThinkFilter& f, std::string_view text) {
    std::string out = f.push(text);
    return out + f.finish();
  };
  ThinkFilter a(true);
  EXPECT_EQ(run(a, "plan</think>\n\nanswer"), "answer");
  ThinkFilter b;
  EXPECT_EQ(run(b, "<think>never closed"), "");
  EXPECT_EQ(b.take_reasoning(), "never closed");
  ThinkFilter c;
  EXPECT_EQ(run(c, "no markers at all <th"), "no markers at all <th");
}

TEST(Chat, ExactLayout) {
  std::vector<ChatMessage> msgs = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "How are you?"}};
  ChatOptions o;
  o.system_prompt = "You are helpful.";
  EXPECT_EQ(format_chat(msgs, o),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nHow are you?<|im_end|>\n"
            "<|im_start|>assistant\n");
  o.enable_thinking = false;
  EXPECT_TRUE(format_chat(msgs, o).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  o.add_generation_prompt = false;
  EXPECT_TRUE(format_chat(msgs, o).ends_with("How are you?<|im_end|>\n"));
  expect_error([&] { format_chat(std::vector<ChatMessage>{{"", "x"}}); }, "empty role");
  ChatOptions both;
  both.system_prompt = "a";
  expect_error([&] { format_chat(std::vector<ChatMessage>{{"system", "b"}}, both); }, "system prompt");
}

TEST(Chat, ExactlyOneBosAtTheStart) {
  for (bool markers : {false, true}) {
    const auto& t = real(markers);
    std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "你好"}};
    ChatOptions o;
    o.enable_thinking = false;
    auto ids = encode_chat(t, msgs, o);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 1);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 73441), 3);
    EXPECT_EQ(ids, t.encode(format_chat(msgs, o)));
    if (markers) EXPECT_EQ(std::count(ids.begin(), ids.end(), 101), 1);
  }
}

TEST(Chat, TemplateWarning) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / fmt::format("sala_chat_{}", ::getpid());
  fs::create_directories(dir);
  EXPECT_FALSE(chat_template_warning(dir).has_value());
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"})";
  EXPECT_FALSE(chat_template_warning(dir).has_value());  // the known MiniCPM4 ChatML template
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "{{ bos_token }}{% for m in messages %}...{% endfor %}"})";
  auto w = chat_template_warning(dir);
  ASSERT_TRUE(w.has_value());
  EXPECT_NE(w->find("tokenizer_config.json is not interpreted; using built-in ChatML"), std::string::npos) << *w;
  fs::remove(dir / "tokenizer_config.json");
  std::ofstream(dir / "chat_template.jinja") << "{% if enable_thinking %}...{% endif %}";
  w = chat_template_warning(dir);
  ASSERT_TRUE(w.has_value());
  EXPECT_NE(w->find("chat_template.jinja"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TinyTokenizer, LayoutAndMinimumSize) {
  auto j = make_tiny_tokenizer_json(300);
  auto t = Tokenizer::from_json(j);
  EXPECT_EQ(t.vocab_size(), 300);
  EXPECT_EQ(t.id_to_piece(0), "<unk>");
  EXPECT_EQ(t.id_to_piece(1), "<s>");
  EXPECT_EQ(t.id_to_piece(2), "</s>");
  EXPECT_EQ(t.id_to_piece(3), "<|im_start|>");
  EXPECT_EQ(t.id_to_piece(4), "<|im_end|>");
  EXPECT_EQ(t.id_to_piece(5), "<0x00>");
  EXPECT_EQ(t.id_to_piece(260), "<0xFF>");
  EXPECT_EQ(t.id_to_piece(261), "▁");
  EXPECT_EQ(t.bos_id(), kTinyBosId);
  EXPECT_EQ(tiny_tokenizer_eos_ids(), nlohmann::json::array({2, 4}));
  for (int id = 0; id < 5; ++id) EXPECT_TRUE(t.is_special(id));
  expect_error([] { make_tiny_tokenizer_json(299); }, "299");
  auto big = Tokenizer::from_json(make_tiny_tokenizer_json(1000));
  EXPECT_EQ(big.vocab_size(), 1000);
  EXPECT_LT(big.encode("the people were there", false).size(), 10u);  // merges learnt from English
  EXPECT_EQ(Tokenizer::from_json(make_tiny_tokenizer_json(5000)).vocab_size(), 5000);
  EXPECT_EQ(make_tiny_tokenizer_json(777), make_tiny_tokenizer_json(777));  // deterministic
}

TEST(TinyTokenizer, RoundTripRandomStrings) {
  std::mt19937 rng(7);
  const std::vector<std::string> extra = {"é", "中", "文", "😀", "👨‍👩‍👧", "\u0301", "\n", "\t", "  ", "ß", "𠀀", "\xE2\x80\x8D"};
  for (int vocab : {300, 400, 1000, 5000}) {
    for (bool split : {true, false}) {
      Tokenizer::Options o;
      o.split_words = split;
      auto t = Tokenizer::from_json(make_tiny_tokenizer_json(vocab), o);
      for (int n = 0; n < 300; ++n) {
        std::string s;
        int len = int(rng() % 40);
        for (int k = 0; k < len; ++k) {
          if (rng() % 4 == 0) s += extra[rng() % extra.size()];
          else s += char(0x20 + rng() % 95);
        }
        bool has_special = false;
        for (int id = 0; id < 5; ++id) has_special |= s.find(t.id_to_piece(id)) != std::string::npos;
        if (has_special || s.find("▁") != std::string::npos) continue;
        auto ids = t.encode(s);
        ASSERT_EQ(t.decode(ids, true), s) << vocab;
        ASSERT_EQ(stream_all(t, ids, true), s);
      }
    }
  }
}

TEST(TinyTokenizer, BothMergeFormatsGiveTheSameResult) {
  auto j = make_tiny_tokenizer_json(1000);
  auto strings = j;
  auto& m = strings["model"]["merges"];
  for (auto& e : m) e = e[0].get<std::string>() + " " + e[1].get<std::string>();
  auto a = Tokenizer::from_json(j), b = Tokenizer::from_json(strings);
  for (std::string s : {"the quick brown fox", "there were many people", "x y z 123"}) EXPECT_EQ(a.encode(s), b.encode(s));
}

TEST(TinyTokenizer, AddedTokenFlags) {
  auto j = make_tiny_tokenizer_json(400);
  auto add = [&](int id, const char* content, nlohmann::json flags) {
    nlohmann::json t = {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                        {"rstrip", false}, {"normalized", false}, {"special", false}};
    t.update(flags);
    j["added_tokens"].push_back(t);
  };
  add(400, "<L>", {{"lstrip", true}});
  add(401, "<R>", {{"rstrip", true}});
  add(402, "cat", {{"single_word", true}});
  add(403, "dog", {{"normalized", true}});  // matched as "▁dog" in normalized text
  auto t = Tokenizer::from_json(j);
  auto has = [&](const std::string& s, int id) {
    auto ids = t.encode(s, false);
    return std::count(ids.begin(), ids.end(), id) > 0;
  };
  EXPECT_EQ(t.encode("a  <L>", false), t.encode("a<L>", false));   // spaces on the left swallowed
  EXPECT_EQ(t.encode("<R>  b", false), t.encode("<R>b", false));   // and on the right
  EXPECT_TRUE(has("a cat b", 402));
  EXPECT_TRUE(has("cat", 402));
  EXPECT_FALSE(has("concatenate", 402));
  EXPECT_FALSE(has("cats", 402));
  EXPECT_TRUE(has("hot dog", 403));
  EXPECT_TRUE(has("dog", 403));                                     // segment start gets "▁" too
  EXPECT_FALSE(has("hotdog", 403));
}

TEST(Tokenizer, UnknownCharactersWithoutByteFallback) {
  auto j = make_tiny_tokenizer_json(300);
  j["model"]["byte_fallback"] = false;
  auto fused = Tokenizer::from_json(j);
  EXPECT_EQ(pieces(fused, fused.encode("中文e", false)), (std::vector<std::string>{"▁", "<unk>", "e"}));
  j["model"]["fuse_unk"] = false;
  auto separate = Tokenizer::from_json(j);
  EXPECT_EQ(pieces(separate, separate.encode("中文e", false)), (std::vector<std::string>{"▁", "<unk>", "<unk>", "e"}));
  j["model"]["unk_token"] = nullptr;  // no unk token: HF drops the character
  auto dropped = Tokenizer::from_json(j);
  EXPECT_EQ(pieces(dropped, dropped.encode("中e", false)), (std::vector<std::string>{"▁", "e"}));
  j["model"]["unk_token"] = "<nope>";
  expect_error([&] { Tokenizer::from_json(j); }, "<nope>");
}

TEST(Tokenizer, IgnoreMergesTakesWholePieces) {
  auto j = make_tiny_tokenizer_json(1000);
  auto plain = Tokenizer::from_json(j);
  j["model"]["ignore_merges"] = true;
  j["model"]["vocab"]["▁xyzzy"] = 1000;  // a piece no merge sequence reaches
  auto t = Tokenizer::from_json(j);
  EXPECT_EQ(t.encode("xyzzy", false), std::vector<int32_t>{1000});
  EXPECT_GT(plain.encode("xyzzy", false).size(), 1u);
}

TEST(Tokenizer, UnsupportedComponentsAreRejected) {
  auto base = make_tiny_tokenizer_json(300);
  auto with = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    auto j = base;
    edit(j);
    expect_error([&] { Tokenizer::from_json(j); }, needle);
  };
  with([](auto& j) { j["pre_tokenizer"] = {{"type", "ByteLevel"}}; }, "ByteLevel");
  with([](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "NFKC");
  with([](auto& j) { j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", "\\s+"}}; }, "Regex");
  with([](auto& j) { j["model"]["type"] = "WordPiece"; }, "WordPiece");
  with([](auto& j) { j["model"]["dropout"] = 0.1; }, "dropout");
  with([](auto& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "continuing_subword_prefix");
  with([](auto& j) { j["truncation"] = {{"max_length", 8}}; }, "truncation");
  with([](auto& j) { j["decoder"] = {{"type", "Metaspace"}}; }, "Metaspace");
  with([](auto& j) { j["decoder"]["decoders"][3]["stop"] = 1; }, "stop");
  with([](auto& j) { std::swap(j["decoder"]["decoders"][2], j["decoder"]["decoders"][3]); }, "order");
  with([](auto& j) { j["post_processor"] = {{"type", "ByteLevel"}}; }, "post_processor");
  with([](auto& j) { j["model"]["merges"].push_back({"zz", "qq"}); }, "zz");
  with([](auto& j) { j["model"]["merges"].push_back("a b c"); }, "a b c");
  with([](auto& j) { j["added_tokens"][0]["content"] = ""; }, "content");
  expect_error([] { Tokenizer::load("/nonexistent/model"); }, "/nonexistent/model/tokenizer.json");
}
