#include "tokenizer/bpe.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace sala {
namespace {

constexpr uint32_t kDenseChars = 0x20000;  // BMP + SMP: dense lookup table for one-character pieces
constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // "▁"

std::string byte_piece(uint8_t b) { return fmt::format("<0x{:02X}>", b); }

bool is_null_or_missing(const nlohmann::json& j, const char* key) { return !j.contains(key) || j[key].is_null(); }

bool get_bool(const nlohmann::json& j, const char* key, const std::string& where) {
  if (is_null_or_missing(j, key)) return false;
  if (!j[key].is_boolean()) fail("{}: model.{} must be a boolean, got {}", where, key, j[key].dump());
  return j[key].get<bool>();
}

// True if "▁" occurs in p after a character that is not "▁".
bool has_inner_space_mark(std::string_view p) {
  for (size_t pos = p.find(kSpaceMark); pos != std::string_view::npos; pos = p.find(kSpaceMark, pos + 3))
    if (pos > 0 && (pos < 3 || p.substr(pos - 3, 3) != kSpaceMark)) return true;
  return false;
}

}  // namespace

BpeModel BpeModel::from_json(const nlohmann::json& m, const std::string& where) {
  if (!m.is_object()) fail("{}: \"model\" must be an object", where);
  std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") fail("{}: model.type \"{}\" is not supported (only BPE)", where, type);
  if (!is_null_or_missing(m, "dropout")) fail("{}: model.dropout {} is not supported (only null)", where, m["dropout"].dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!is_null_or_missing(m, key)) fail("{}: model.{} {} is not supported (only null)", where, key, m[key].dump());
  for (auto& [key, value] : m.items()) {
    static const char* known[] = {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                                  "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"};
    if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return key == k; }) == std::end(known))
      fail("{}: model.{} is not supported", where, key);
  }

  BpeModel b;
  b.byte_fallback_ = get_bool(m, "byte_fallback", where);
  b.fuse_unk_ = get_bool(m, "fuse_unk", where);
  b.ignore_merges_ = get_bool(m, "ignore_merges", where);

  if (!m.contains("vocab") || !m["vocab"].is_object()) fail("{}: model.vocab must be an object of piece -> id", where);
  const auto& vocab = m["vocab"];
  int64_t max_id = -1;
  for (auto& [piece, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 31))
      fail("{}: model.vocab[\"{}\"] has invalid id {}", where, piece, id.dump());
    max_id = std::max(max_id, id.get<int64_t>());
  }
  b.pieces_.assign(size_t(max_id + 1), std::string());
  b.present_.assign(size_t(max_id + 1), 0);
  b.vocab_.reserve(vocab.size());
  for (auto& [piece, id_json] : vocab.items()) {
    auto id = id_json.get<int32_t>();
    if (b.present_[size_t(id)]) fail("{}: model.vocab id {} is used by both \"{}\" and \"{}\"", where, id, b.pieces_[size_t(id)], piece);
    if (!utf8::is_valid(piece)) fail("{}: model.vocab piece with id {} is not valid UTF-8", where, id);
    b.present_[size_t(id)] = 1;
    b.pieces_[size_t(id)] = piece;
    b.vocab_.emplace(piece, id);
  }

  // One-character pieces, for the per-character lookup of the merge loop.
  b.char_ids_.assign(kDenseChars, -1);
  bool inner_mark = false;
  for (auto& [piece, id] : b.vocab_) {
    if (!piece.empty() && utf8::char_length(piece, 0) == piece.size()) {
      size_t i = 0;
      uint32_t cp = utf8::next(piece, i);
      if (cp < kDenseChars) b.char_ids_[cp] = id;
      else b.far_char_ids_[cp] = id;
    }
    inner_mark = inner_mark || has_inner_space_mark(piece);
  }
  b.all_bytes_ = true;
  for (int v = 0; v < 256; ++v) {
    auto id = b.find(byte_piece(uint8_t(v)));
    b.byte_ids_[v] = id ? *id : -1;
    b.all_bytes_ = b.all_bytes_ && id.has_value();
  }

  if (!is_null_or_missing(m, "unk_token")) {
    if (!m["unk_token"].is_string()) fail("{}: model.unk_token must be a string or null", where);
    auto unk = m["unk_token"].get<std::string>();
    auto id = b.find(unk);
    if (!id) fail("{}: model.unk_token \"{}\" is not in model.vocab", where, unk);
    b.unk_id_ = *id;
  }

  // Merges: "a b" strings (lines starting with "#version" are skipped, as in HF) or ["a", "b"] pairs.
  if (!m.contains("merges") || !m["merges"].is_array()) fail("{}: model.merges must be an array", where);
  const auto& merges = m["merges"];
  size_t cap = std::bit_ceil(std::max<size_t>(16, merges.size() * 2));
  b.merges_.assign(cap, Merge{});
  b.merge_mask_ = cap - 1;
  uint32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& e = merges[i];
    std::string left, right;
    if (e.is_string()) {
      const auto& line = e.get_ref<const std::string&>();
      if (line.starts_with("#version")) continue;
      size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        fail("{}: model.merges[{}] \"{}\" must be two pieces separated by one space", where, i, line);
      left = line.substr(0, sp);
      right = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      fail("{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"], got {}", where, i, e.dump());
    }
    auto a = b.find(left), c = b.find(right), n = b.find(left + right);
    if (!a) fail("{}: model.merges[{}]: piece \"{}\" is not in the vocabulary", where, i, left);
    if (!c) fail("{}: model.merges[{}]: piece \"{}\" is not in the vocabulary", where, i, right);
    if (!n) fail("{}: model.merges[{}]: merged piece \"{}\" is not in the vocabulary", where, i, left + right);
    b.insert_merge(*a, *c, rank++, *n);  // a later duplicate wins, as in HF's HashMap collect
  }

  b.can_split_ = !inner_mark && b.find(kSpaceMark).has_value();
  b.split_ = b.can_split_;
  return b;
}

void BpeModel::insert_merge(int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
  uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  size_t i = PairHash{}(key) & merge_mask_;
  while (merges_[i].key != ~0ull && merges_[i].key != key) i = (i + 1) & merge_mask_;
  merges_[i] = Merge{key, rank, new_id};
}

std::optional<int32_t> BpeModel::find(std::string_view piece) const {
  auto it = vocab_.find(piece);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

int32_t BpeModel::char_id(std::string_view s, size_t i) const {
  size_t j = i;
  uint32_t cp = utf8::next(s, j);
  if (cp < kDenseChars) return char_ids_[cp];
  auto it = far_char_ids_.find(cp);
  return it == far_char_ids_.end() ? -1 : it->second;
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out, Workspace& ws) const {
  using Symbol = Workspace::Symbol;
  using Candidate = Workspace::Candidate;
  auto& sym = ws.symbols;
  sym.clear();
  auto add = [&](int32_t id, size_t len) {
    int32_t n = int32_t(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back(Symbol{id, n - 1, -1, uint32_t(len)});
  };

  // Characters -> initial symbols (HF BPE::merge_word).
  bool have_unk = false;
  size_t unk_len = 0;
  for (size_t i = 0; i < w.size();) {
    size_t n = std::max<size_t>(1, utf8::char_length(w, i));  // input is valid UTF-8; never stall
    int32_t id = char_id(w, i);
    if (id >= 0) {
      if (have_unk) add(unk_id_, unk_len), have_unk = false;
      add(id, n);
    } else {
      bool bytes_ok = byte_fallback_;
      for (size_t k = 0; bytes_ok && k < n; ++k) bytes_ok = byte_ids_[uint8_t(w[i + k])] >= 0;
      if (bytes_ok) {
        // HF leaves a pending unk in place here, so it lands after these bytes.
        for (size_t k = 0; k < n; ++k) add(byte_ids_[uint8_t(w[i + k])], 1);
      } else if (unk_id_ >= 0) {
        if (have_unk && fuse_unk_) {
          unk_len += n;
        } else {
          if (have_unk) add(unk_id_, unk_len);
          have_unk = true;
          unk_len = n;
        }
      }
    }
    i += n;
  }
  if (have_unk) add(unk_id_, unk_len);

  // Merge loop (HF Word::merge_all): lowest rank first, then leftmost position.
  auto worse = [](const Candidate& x, const Candidate& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  auto& heap = ws.heap;
  heap.clear();
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (const Merge* m = find_merge(sym[k].id, sym[k + 1].id)) heap.push_back({m->rank, int32_t(k), m->new_id});
  std::make_heap(heap.begin(), heap.end(), worse);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[size_t(top.pos)];
    if (cur.len == 0 || cur.next == -1) continue;
    Symbol right = sym[size_t(cur.next)];
    const Merge* m = find_merge(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;  // stale entry
    sym[size_t(cur.next)].len = 0;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) sym[size_t(right.next)].prev = top.pos;
    if (cur.prev >= 0)
      if (const Merge* p = find_merge(sym[size_t(cur.prev)].id, cur.id)) {
        heap.push_back({p->rank, cur.prev, p->new_id});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    if (cur.next >= 0)
      if (const Merge* q = find_merge(cur.id, sym[size_t(cur.next)].id)) {
        heap.push_back({q->rank, top.pos, q->new_id});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
  }
  for (const Symbol& s : sym)
    if (s.len != 0) out.push_back(s.id);
}

void BpeModel::tokenize(std::string_view segment, std::vector<int32_t>& out) const {
  Workspace ws;
  tokenize(segment, out, ws);
}

void BpeModel::tokenize(std::string_view segment, std::vector<int32_t>& out, Workspace& ws) const {
  if (segment.empty()) return;
  if (ignore_merges_)
    if (auto id = find(segment)) {
      out.push_back(*id);
      return;
    }
  if (!split_) {
    merge_word(segment, out, ws);
    return;
  }
  // Words end in front of a "▁" that follows another character (see the header).
  constexpr size_t kMaxCached = 64;
  ws.cache.clear();
  size_t start = 0;
  auto emit = [&](std::string_view word) {
    if (word.size() > kMaxCached) return merge_word(word, out, ws);
    auto it = ws.cache.find(word);
    if (it != ws.cache.end()) {
      auto [first, count] = it->second;
      for (uint32_t k = 0; k < count; ++k) {
        int32_t id = out[first + k];
        out.push_back(id);
      }
      return;
    }
    size_t before = out.size();
    merge_word(word, out, ws);
    ws.cache.emplace(word, std::pair<uint32_t, uint32_t>(uint32_t(before), uint32_t(out.size() - before)));
  };
  for (size_t pos = segment.find(kSpaceMark, 1); pos != std::string_view::npos; pos = segment.find(kSpaceMark, pos + 3)) {
    if (pos >= 3 && segment.substr(pos - 3, 3) == kSpaceMark) continue;
    emit(segment.substr(start, pos - start));
    start = pos;
  }
  emit(segment.substr(start));
}

}  // namespace sala
