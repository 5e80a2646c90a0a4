// Added tokens of an HF tokenizer.json ("added_tokens") and the splitting of text around them,
// as HF `tokenizers` AddedVocabulary does it: leftmost-longest matching (like its Aho-Corasick
// automaton, MatchKind::LeftmostLongest), then the single_word / lstrip / rstrip adjustments.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sala {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;  // only match when not inside a word
  bool lstrip = false;       // swallow whitespace on the left
  bool rstrip = false;       // swallow whitespace on the right
  bool normalized = false;   // matched in normalized text (against the normalized content)
  bool special = false;      // skipped by decode(skip_special_tokens = true)

  // Parses one entry of "added_tokens"; `where` names the file and index in error messages.
  static AddedToken from_json(const nlohmann::json& j, const std::string& where);
};

// A piece of the input: an added token (id >= 0) or plain text (id -1), as byte offsets.
struct TextSplit {
  int32_t id;
  size_t begin, end;
};

class AddedTokenMatcher {
 public:
  // Adds a token to match; `pattern` is the text to look for (the content, or for normalized
  // tokens the normalized content).
  void add(const AddedToken& token, std::string pattern);
  bool empty() const { return tokens_.empty(); }

  // Splits text into added tokens and the plain text between them (plain pieces may be empty).
  void split(std::string_view text, std::vector<TextSplit>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t token = -1;                             // index into tokens_ if a pattern ends here
  };
  int32_t child(int32_t node, uint8_t b) const;
  std::vector<Node> nodes_{Node{}};
  std::vector<AddedToken> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace sala
