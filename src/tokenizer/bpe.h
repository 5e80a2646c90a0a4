// The BPE model of an HF tokenizer.json ("model": {"type": "BPE", ...}): vocabulary, ranked
// merges, byte fallback and unknown-token handling, reproducing HF `tokenizers` exactly.
//
// Merging follows the library's algorithm (a priority queue of merge candidates ordered by
// (rank, position) over a linked list of symbols, stale entries skipped), which is
// O(n log n) per segment. There is no pre-tokenizer in this pipeline, so a segment can be a
// whole document. When the vocabulary allows it (no piece has "▁" after another character,
// and "▁" itself is a piece), no symbol can ever span the boundary in front of a "▁" that
// follows another character; cutting segments there changes no result, so words are merged
// independently and repeated words are looked up in a per-call cache (exact, just faster).
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sala {

class BpeModel {
 public:
  // Parses the "model" object; `where` names the file in error messages. Unsupported options
  // (dropout, continuing_subword_prefix, end_of_word_suffix, other model types) throw.
  static BpeModel from_json(const nlohmann::json& model, const std::string& where);

  // Scratch reused across the segments of one encode call.
  struct Workspace;

  // Appends the ids of one (already normalized) segment to out.
  void tokenize(std::string_view segment, std::vector<int32_t>& out, Workspace& ws) const;
  void tokenize(std::string_view segment, std::vector<int32_t>& out) const;

  int32_t size() const { return int32_t(pieces_.size()); }  // largest id + 1
  const std::string& piece(int32_t id) const { return pieces_[size_t(id)]; }
  bool has_id(int32_t id) const { return id >= 0 && id < size() && present_[size_t(id)]; }
  std::optional<int32_t> find(std::string_view piece) const;

  // Whether the exact word-splitting shortcut is valid for this vocabulary, and the switch
  // (on by default; tests turn it off to check it changes nothing).
  bool can_split_words() const { return can_split_; }
  void set_split_words(bool on) { split_ = on && can_split_; }

 private:
  struct PairHash {
    size_t operator()(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> 17); }
  };
  struct Merge {
    uint64_t key = ~0ull;  // (left id << 32) | right id; ~0 = empty slot
    uint32_t rank = 0;
    int32_t new_id = 0;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  void insert_merge(int32_t a, int32_t b, uint32_t rank, int32_t new_id);
  const Merge* find_merge(int32_t a, int32_t b) const {
    uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t i = PairHash{}(key) & merge_mask_;
    while (true) {
      const Merge& m = merges_[i];
      if (m.key == key) return &m;
      if (m.key == ~0ull) return nullptr;
      i = (i + 1) & merge_mask_;
    }
  }
  int32_t char_id(std::string_view s, size_t i) const;  // id of the one-character piece at s[i], -1 if none
  void merge_word(std::string_view word, std::vector<int32_t>& out, Workspace& ws) const;

  std::vector<std::string> pieces_;
  std::vector<uint8_t> present_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<Merge> merges_;
  size_t merge_mask_ = 0;
  std::vector<int32_t> char_ids_;  // code point < kDenseChars -> id of the one-character piece, -1 if none
  std::unordered_map<uint32_t, int32_t> far_char_ids_;
  int32_t byte_ids_[256];
  bool all_bytes_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;
  bool can_split_ = false;
  bool split_ = false;
};

struct BpeModel::Workspace {
  struct Symbol {
    int32_t id, prev, next;
    uint32_t len;  // bytes; 0 = merged into its left neighbour
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos, new_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;  // word -> (start, count) in out
};

}  // namespace sala
