// TextStream / StopScanner: stop strings across piece boundaries, held-back prefixes, the think
// filter in front of the stop scan, and the streamed text equal to a one-shot decode.
#include "engine/text_stream.h"

#include <gtest/gtest.h>

#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace sala {
namespace {

// Feeds pieces one by one; returns what was emitted (pushes, then finish).
std::string feed(StopScanner& s, std::initializer_list<std::string_view> pieces) {
  std::string out;
  for (auto p : pieces) out += s.push(p);
  return out + s.finish();
}

TEST(StopScanner, NoStopsPassesEverythingThrough) {
  StopScanner s({});
  EXPECT_EQ(s.push("abc"), "abc");
  EXPECT_EQ(s.push(""), "");
  EXPECT_EQ(s.finish(), "");
  EXPECT_FALSE(s.stopped());
}

TEST(StopScanner, EmptyStopStringIsIgnored) {
  StopScanner s({""});
  EXPECT_EQ(feed(s, {"hello"}), "hello");
  EXPECT_FALSE(s.stopped());
}

TEST(StopScanner, StopInsideOnePiece) {
  StopScanner s({"END"});
  EXPECT_EQ(s.push("abcENDdef"), "abc");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.matched(), "END");
  EXPECT_EQ(s.push("more"), "");
  EXPECT_EQ(s.finish(), "");
}

TEST(StopScanner, StopSpanningPiecesIsHeldBack) {
  StopScanner s({"END"});
  EXPECT_EQ(s.push("abcE"), "abc");  // "E" could start the stop string
  EXPECT_EQ(s.push("N"), "");
  EXPECT_EQ(s.push("Dxyz"), "");
  EXPECT_TRUE(s.stopped());
}

TEST(StopScanner, FalseStartIsReleased) {
  StopScanner s({"END"});
  EXPECT_EQ(s.push("aEN"), "a");
  EXPECT_EQ(s.push("x"), "ENx");  // "ENx" cannot be a stop prefix any more
  EXPECT_FALSE(s.stopped());
}

TEST(StopScanner, HeldPrefixReleasedAtFinish) {
  StopScanner s({"END"});
  EXPECT_EQ(s.push("abEN"), "ab");
  EXPECT_EQ(s.finish(), "EN");
  EXPECT_FALSE(s.stopped());
}

TEST(StopScanner, OverlappingCandidates) {
  // "aab": after "aa" the held suffix must be "aa" ("a" alone would lose the match).
  StopScanner s({"aab"});
  EXPECT_EQ(feed(s, {"xa", "a", "a", "b", "tail"}), "xa");
  EXPECT_TRUE(s.stopped());
}

TEST(StopScanner, EarliestOfSeveralStopsWins) {
  StopScanner s({"world", "lo"});
  EXPECT_EQ(feed(s, {"hel", "lo world"}), "hel");
  EXPECT_EQ(s.matched(), "lo");
}

TEST(StopScanner, OneCharacterPieces) {
  StopScanner s({"\n\nUser:"});
  std::string out;
  for (char c : std::string("answer\n\nUser: more")) out += s.push(std::string_view(&c, 1));
  out += s.finish();
  EXPECT_EQ(out, "answer");
}

TEST(StopScanner, MultibyteStopString) {
  StopScanner s({"é!"});
  EXPECT_EQ(feed(s, {"caf\xc3", "\xa9", "!x"}), "caf");
}

class TextStreamTest : public ::testing::Test {
 protected:
  static const Tokenizer& tiny() {
    static const Tokenizer t = Tokenizer::from_json(make_tiny_tokenizer_json(512));  // built once: ~0.2 s
    return t;
  }

  // Streams the ids of `text` (no BOS) and returns the concatenated output.
  std::string stream(const std::string& text, TextStreamOptions opt, bool* stopped = nullptr) {
    TextStream ts(tok, std::move(opt));
    std::string out;
    for (int32_t id : tok.encode(text, false)) out += ts.push(id);
    out += ts.finish();
    EXPECT_EQ(out, ts.text());
    if (stopped) *stopped = ts.stopped();
    return out;
  }

  const Tokenizer& tok = tiny();
};

TEST_F(TextStreamTest, EqualsOneShotDecode) {
  const std::string text = "The quick brown fox, jumps over 12 lazy dogs.\nNext line: éà ✓";
  EXPECT_EQ(stream(text, {}), tok.decode(tok.encode(text, false)));
}

TEST_F(TextStreamTest, StopStringAcrossTokens) {
  bool stopped = false;
  EXPECT_EQ(stream("alpha beta STOP gamma", {.stop = {"STOP"}}, &stopped), "alpha beta ");
  EXPECT_TRUE(stopped);
}

TEST_F(TextStreamTest, NoStopWhenAbsent) {
  bool stopped = true;
  EXPECT_EQ(stream("alpha beta ST", {.stop = {"STOP"}}, &stopped), "alpha beta ST");
  EXPECT_FALSE(stopped);
}

TEST_F(TextStreamTest, ThinkBlocksHidden) {
  EXPECT_EQ(stream("<think>\nsecret plan\n</think>\n\nHello there", {.hide_think = true}), "Hello there");
  EXPECT_EQ(stream("<think>\nsecret</think>\nHi", {}), "<think>\nsecret</think>\nHi");
}

TEST_F(TextStreamTest, StopStringInsideHiddenReasoningDoesNotStop) {
  bool stopped = true;
  EXPECT_EQ(stream("<think>STOP</think>ok", {.stop = {"STOP"}, .hide_think = true}, &stopped), "ok");
  EXPECT_FALSE(stopped);
}

TEST_F(TextStreamTest, SpecialTokensSkipped) {
  const std::vector<int32_t> ids = tok.encode("a<|im_start|>b", false);
  TextStream ts(tok, {});
  std::string out;
  for (int32_t id : ids) out += ts.push(id);
  out += ts.finish();
  EXPECT_EQ(out, tok.decode(ids, /*skip_special_tokens=*/true));
  EXPECT_EQ(out.find("im_start"), std::string::npos);
}

TEST_F(TextStreamTest, UnknownIdsDecodeToNothing) {
  TextStream ts(tok, {});
  EXPECT_EQ(ts.push(tok.vocab_size() + 10), "");
  EXPECT_EQ(ts.push(-1), "");
}

TEST_F(TextStreamTest, NothingAfterFinish) {
  TextStream ts(tok, {});
  for (int32_t id : tok.encode("hi", false)) ts.push(id);
  ts.finish();
  EXPECT_EQ(ts.push(tok.encode("x", false).at(0)), "");
  EXPECT_EQ(ts.finish(), "");
}

}  // namespace
}  // namespace sala
