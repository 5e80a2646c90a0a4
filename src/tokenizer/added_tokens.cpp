#include "tokenizer/added_tokens.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace sala {
namespace {

bool flag(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return false;
  if (!j[key].is_boolean()) fail("{}: field \"{}\" must be a boolean, got {}", where, key, j[key].dump());
  return j[key].get<bool>();
}

// Start of the previous character before byte offset i.
size_t prev_char(std::string_view s, size_t i) {
  do --i;
  while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80);
  return i;
}

uint32_t char_at(std::string_view s, size_t i) { return utf8::next(s, i); }

}  // namespace

AddedToken AddedToken::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail("{} must be an object", where);
  if (!j.contains("id") || !j["id"].is_number_integer() || j["id"].get<int64_t>() < 0 ||
      j["id"].get<int64_t>() >= (int64_t(1) << 31))
    fail("{}: \"id\" must be a non-negative integer", where);
  if (!j.contains("content") || !j["content"].is_string() || j["content"].get_ref<const std::string&>().empty())
    fail("{}: \"content\" must be a non-empty string", where);
  AddedToken t;
  t.id = j["id"].get<int32_t>();
  t.content = j["content"].get<std::string>();
  if (!utf8::is_valid(t.content)) fail("{}: \"content\" is not valid UTF-8", where);
  t.single_word = flag(j, "single_word", where);
  t.lstrip = flag(j, "lstrip", where);
  t.rstrip = flag(j, "rstrip", where);
  t.normalized = flag(j, "normalized", where);
  t.special = flag(j, "special", where);
  return t;
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  const auto& next = nodes_[size_t(node)].next;
  auto it = std::lower_bound(next.begin(), next.end(), b, [](const auto& e, uint8_t v) { return e.first < v; });
  return it != next.end() && it->first == b ? it->second : -1;
}

void AddedTokenMatcher::add(const AddedToken& token, std::string pattern) {
  if (pattern.empty()) return;  // HF never matches an empty pattern
  int32_t node = 0;
  for (char c : pattern) {
    uint8_t b = uint8_t(c);
    int32_t n = child(node, b);
    if (n < 0) {
      n = int32_t(nodes_.size());
      nodes_.push_back(Node{});
      auto& next = nodes_[size_t(node)].next;
      auto it = std::lower_bound(next.begin(), next.end(), b, [](const auto& e, uint8_t v) { return e.first < v; });
      next.insert(it, {b, n});
    }
    node = n;
  }
  if (nodes_[size_t(node)].token >= 0) return;  // same pattern twice: the first one wins
  nodes_[size_t(node)].token = int32_t(tokens_.size());
  tokens_.push_back(token);
  first_byte_[uint8_t(pattern[0])] = true;
}

void AddedTokenMatcher::split(std::string_view s, std::vector<TextSplit>& out) const {
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    if (!first_byte_[uint8_t(s[pos])]) {
      ++pos;
      continue;
    }
    // Longest pattern starting at pos.
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      node = child(node, uint8_t(s[i]));
      if (node < 0) break;
      if (nodes_[size_t(node)].token >= 0) best = nodes_[size_t(node)].token, best_end = i + 1;
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[size_t(best)];
    size_t start = pos, stop = best_end;
    pos = best_end;  // the automaton resumes after the raw match, whatever happens below
    if (tok.single_word) {
      bool start_space = start == 0 || !utf8::is_word_char(char_at(s, prev_char(s, start)));
      bool stop_space = stop == s.size() || !utf8::is_word_char(char_at(s, stop));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t i = start;
      while (i > start_offset) {
        size_t p = prev_char(s, i);
        if (!utf8::is_whitespace(char_at(s, p))) break;
        i = p;
      }
      start = std::max(i, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        size_t i = stop;
        if (!utf8::is_whitespace(utf8::next(s, i))) break;
        stop = i;
      }
    }
    if (start_offset < start) out.push_back({-1, start_offset, start});
    out.push_back({tok.id, start, stop});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({-1, start_offset, s.size()});
}

}  // namespace sala
