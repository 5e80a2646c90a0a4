// Tokenizer: loads an HF tokenizer.json and reproduces HF `tokenizers` (0.2x) encode/decode for
// the SentencePiece-style BPE pipeline of MiniCPM (spec §5.1):
//   added tokens matched first in the raw text (leftmost-longest, per-token flags)
//   -> each remaining non-empty segment normalized separately (Prepend "▁", Replace " " -> "▁";
//      so a segment after a special token also starts with "▁")
//   -> tokens with normalized=true matched in the normalized segment
//   -> BPE with byte fallback (<0xNN>) and fused <unk>
//   -> post-processor TemplateProcessing (BOS), only with add_special_tokens.
// Decoding: Replace "▁" -> " ", ByteFallback (a run of byte pieces that is not valid UTF-8
// becomes one U+FFFD per byte, as in HF), Fuse, Strip one leading " ". As in HF, an added token
// with normalized=true enters the decoder as its normalized content ("hello" -> "▁hello").
// Any component or option outside this pipeline is rejected with an error naming it.
//
// Input text that is not valid UTF-8 is repaired first: every maximal ill-formed subpart becomes
// one U+FFFD (HF only accepts valid strings, so this is the engine's decision).
// A loaded Tokenizer is immutable: its const methods may be called from several threads.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"

namespace sala {

class Tokenizer {
 public:
  struct Options {
    // Spec §5.1 [ENGINE]: the MiniCPM vocabulary holds reasoning / tool markers ("<think>" = 101
    // ... id 114) as ordinary pieces, and plain tokenizer.json splits the text "<think>" into
    // several pieces. With this on, the pieces of ids 101-114 become added, non-special,
    // non-normalized tokens (matched before BPE, kept by decode), which is what the checkpoint's
    // tokenizer_config.json very likely does. Only applied when id 101 is "<think>" and 102 is
    // "</think>", so other vocabularies are unaffected. Turn it off for parity with HF
    // `tokenizers` loading tokenizer.json alone.
    bool reasoning_markers_as_added = true;
    // Exact speed-up of BPE for vocabularies that allow it (see bpe.h); off only in tests.
    bool split_words = true;
  };

  static Tokenizer from_json(const nlohmann::json& j, const Options& options, const std::string& where = "tokenizer.json");
  static Tokenizer from_json(const nlohmann::json& j) { return from_json(j, Options{}); }
  // A tokenizer.json file, or a directory holding one (errors name the path).
  static Tokenizer load(const std::filesystem::path& path, const Options& options);
  static Tokenizer load(const std::filesystem::path& path) { return load(path, Options{}); }

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // Text of ids. Throws on an id outside the vocabulary (HF silently drops it).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int32_t vocab_size() const { return int32_t(pieces_.size()); }  // largest id + 1
  const std::string& id_to_piece(int32_t id) const;
  std::optional<int32_t> piece_to_id(std::string_view piece) const;
  bool is_special(int32_t id) const { return id >= 0 && id < vocab_size() && special_[size_t(id)]; }
  int32_t bos_id() const { return prefix_.empty() ? -1 : prefix_.front(); }  // from the post-processor; -1 if none
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  bool reasoning_markers_added() const { return markers_added_; }
  const std::string& source() const { return where_; }

 private:
  friend class StreamDecoder;
  struct NormStep {
    bool prepend;  // else replace
    std::string a, b;
  };
  void normalize(std::string_view in, std::string& out) const;
  void check_id(int32_t id) const;
  // Appends the decoded text of a run of byte pieces, HF style (invalid run -> U+FFFD per byte).
  static void flush_bytes(std::string& bytes, std::string& out);
  size_t strip_prefix(std::string_view text, int& budget) const;  // bytes of leading strip content to drop

  std::string where_;
  BpeModel model_;
  std::vector<AddedToken> added_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::vector<NormStep> norm_;
  std::vector<int32_t> prefix_, suffix_;  // post-processor ids around the sequence

  // Decoder, resolved per id.
  std::vector<std::string> pieces_;   // id -> piece (added tokens override the model's)
  std::vector<std::string> decoded_;  // id -> piece after the Replace steps
  std::vector<int16_t> byte_;         // id -> byte value of a <0xNN> piece (ByteFallback), -1 otherwise
  std::vector<uint8_t> special_;
  std::vector<uint8_t> known_;        // id has a piece
  std::string strip_content_;         // Strip decoder: character removed from the start
  int strip_start_ = 0;               // ... at most this many times
  bool markers_added_ = false;
};

}  // namespace sala
