#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <set>

#include "core/error.h"
#include "io/json_file.h"
#include "tokenizer/utf8.h"

namespace sala {
namespace {

std::string type_of(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) fail("{}: component without a \"type\": {}", where, j.dump());
  return j["type"].get<std::string>();
}

// The "String" form of a Replace pattern; the Regex form is not supported.
std::string replace_pattern(const nlohmann::json& j, const std::string& where) {
  if (!j.contains("pattern") || !j["pattern"].is_object()) fail("{}: Replace needs a \"pattern\" object", where);
  const auto& p = j["pattern"];
  if (p.contains("Regex")) fail("{}: Replace with a Regex pattern is not supported (only String)", where);
  if (!p.contains("String") || !p["String"].is_string() || p["String"].get_ref<const std::string&>().empty())
    fail("{}: Replace pattern must be {{\"String\": non-empty string}}, got {}", where, p.dump());
  if (!j.contains("content") || !j["content"].is_string()) fail("{}: Replace needs a string \"content\"", where);
  return p["String"].get<std::string>();
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (s.find(from) == std::string::npos) return;
  std::string r;
  r.reserve(s.size());
  size_t i = 0;
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, i)) {
    r.append(s, i, p - i);
    r.append(to);
    i = p + from.size();
  }
  r.append(s, i);
  s = std::move(r);
}

// HF ByteFallback: a 6-byte token "<0xHH>" whose HH parses as a u8 in base 16 (Rust from_str_radix,
// which also takes a leading '+').
int byte_of(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return -1;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  int hi = hex(t[3]), lo = hex(t[4]);
  if (t[3] == '+' && lo >= 0) return lo;
  return hi >= 0 && lo >= 0 ? hi * 16 + lo : -1;
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& path, const Options& options) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path) || path.extension() != ".json") file = path / "tokenizer.json";
  if (!std::filesystem::is_regular_file(file))
    fail("tokenizer: {} not found (expected a model directory holding tokenizer.json, or the file itself)", file.string());
  return from_json(read_json_file(file), options, file.string());
}

Tokenizer Tokenizer::from_json(const nlohmann::json& j, const Options& options, const std::string& where) {
  if (!j.is_object()) fail("{}: top level must be an object", where);
  Tokenizer t;
  t.where_ = where;
  for (const char* key : {"truncation", "padding"})
    if (j.contains(key) && !j[key].is_null()) fail("{}: \"{}\" is not supported (only null)", where, key);
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
    fail("{}: pre_tokenizer \"{}\" is not supported (only null)", where, type_of(j["pre_tokenizer"], where + ": pre_tokenizer"));
  if (!j.contains("model")) fail("{}: missing \"model\"", where);
  t.model_ = BpeModel::from_json(j["model"], where);
  t.model_.set_split_words(options.split_words);

  // Normalizer: Sequence / Prepend / Replace(String).
  auto parse_norm = [&](auto& self, const nlohmann::json& n) -> void {
    if (n.is_null()) return;
    std::string type = type_of(n, where + ": normalizer");
    if (type == "Sequence") {
      if (!n.contains("normalizers") || !n["normalizers"].is_array()) fail("{}: normalizer Sequence needs \"normalizers\"", where);
      for (const auto& c : n["normalizers"]) self(self, c);
    } else if (type == "Prepend") {
      if (!n.contains("prepend") || !n["prepend"].is_string()) fail("{}: normalizer Prepend needs a string \"prepend\"", where);
      t.norm_.push_back({true, n["prepend"].get<std::string>(), {}});
    } else if (type == "Replace") {
      std::string from = replace_pattern(n, where + ": normalizer");
      t.norm_.push_back({false, from, n["content"].get<std::string>()});
    } else {
      fail("{}: normalizer \"{}\" is not supported (only Sequence, Prepend, Replace)", where, type);
    }
  };
  if (j.contains("normalizer")) parse_norm(parse_norm, j["normalizer"]);

  // Added tokens, then the optional reasoning markers (spec §5.1).
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) fail("{}: \"added_tokens\" must be an array", where);
    for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
      auto w = fmt::format("{}: added_tokens[{}]", where, i);
      t.added_.push_back(AddedToken::from_json(j["added_tokens"][i], w));
      // HF gives an added token that is also a vocabulary piece the vocabulary's id.
      const auto& a = t.added_.back();
      if (auto id = t.model_.find(a.content); id && *id != a.id)
        fail("{}: \"{}\" has id {} but the vocabulary gives it id {}", w, a.content, a.id, *id);
    }
  }
  auto model_piece = [&](int32_t id) -> std::string { return t.model_.has_id(id) ? t.model_.piece(id) : std::string(); };
  if (options.reasoning_markers_as_added && model_piece(101) == "<think>" && model_piece(102) == "</think>") {
    for (int32_t id = 101; id <= 114; ++id) {
      std::string p = model_piece(id);
      bool taken = p.size() < 2 || p[0] != '<';
      for (const auto& a : t.added_) taken = taken || a.content == p || a.id == id;
      if (taken) continue;
      AddedToken a;
      a.id = id;
      a.content = p;
      t.added_.push_back(a);
      t.markers_added_ = true;
    }
  }
  for (const auto& a : t.added_) {
    if (a.normalized) {
      std::string pattern;
      t.normalize(a.content, pattern);
      t.normalized_matcher_.add(a, pattern);
    } else {
      t.raw_matcher_.add(a, a.content);
    }
  }

  // Per-id tables.
  int32_t size = t.model_.size();
  for (const auto& a : t.added_) size = std::max(size, a.id + 1);
  t.pieces_.assign(size_t(size), std::string());
  t.known_.assign(size_t(size), 0);
  for (int32_t id = 0; id < t.model_.size(); ++id)
    if (t.model_.has_id(id)) t.pieces_[size_t(id)] = t.model_.piece(id), t.known_[size_t(id)] = 1;
  std::set<std::string> special_contents;
  for (const auto& a : t.added_) {
    t.pieces_[size_t(a.id)] = a.content;
    t.known_[size_t(a.id)] = 1;
    if (a.special) special_contents.insert(a.content);
  }
  t.special_.assign(size_t(size), 0);
  for (int32_t id = 0; id < size; ++id) t.special_[size_t(id)] = t.known_[size_t(id)] && special_contents.count(t.pieces_[size_t(id)]);

  // Post-processor: TemplateProcessing, "single" template only.
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    const auto& p = j["post_processor"];
    std::string type = type_of(p, where + ": post_processor");
    if (type != "TemplateProcessing") fail("{}: post_processor \"{}\" is not supported (only TemplateProcessing)", where, type);
    if (!p.contains("single") || !p["single"].is_array()) fail("{}: post_processor.single must be an array", where);
    bool seen_a = false;
    for (const auto& item : p["single"]) {
      if (item.contains("Sequence")) {
        if (item["Sequence"].value("id", std::string()) != "A" || seen_a)
          fail("{}: post_processor.single must hold the sequence A exactly once, got {}", where, p["single"].dump());
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        std::string name = item["SpecialToken"].value("id", std::string());
        const auto& specials = p.value("special_tokens", nlohmann::json::object());
        if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
          fail("{}: post_processor special token \"{}\" has no ids in special_tokens", where, name);
        for (const auto& id : specials[name]["ids"]) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= size)
            fail("{}: post_processor special token \"{}\" has invalid id {}", where, name, id.dump());
          (seen_a ? t.suffix_ : t.prefix_).push_back(id.get<int32_t>());
        }
      } else {
        fail("{}: post_processor.single item {} is not supported", where, item.dump());
      }
    }
    if (!seen_a) fail("{}: post_processor.single has no sequence A", where);
  }

  // Decoder: Replace* -> ByteFallback? -> Fuse? -> Strip? (the shape the streaming decoder needs).
  if (!j.contains("decoder") || j["decoder"].is_null()) fail("{}: a decoder is required (none given)", where);
  std::vector<nlohmann::json> steps;
  if (type_of(j["decoder"], where + ": decoder") == "Sequence") {
    if (!j["decoder"].contains("decoders") || !j["decoder"]["decoders"].is_array()) fail("{}: decoder Sequence needs \"decoders\"", where);
    for (const auto& d : j["decoder"]["decoders"]) steps.push_back(d);
  } else {
    steps.push_back(j["decoder"]);
  }
  std::vector<std::pair<std::string, std::string>> replaces;
  bool byte_fallback = false, fuse = false, strip = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    std::string w = fmt::format("{}: decoder step {}", where, i);
    std::string type = type_of(steps[i], w);
    if (type == "Replace" && !byte_fallback && !fuse && !strip) {
      std::string from = replace_pattern(steps[i], w);
      replaces.emplace_back(from, steps[i]["content"].get<std::string>());
    } else if (type == "ByteFallback" && !byte_fallback && !fuse && !strip) {
      byte_fallback = true;
    } else if (type == "Fuse" && !fuse && !strip) {
      fuse = true;
    } else if (type == "Strip" && fuse && !strip) {
      const auto& s = steps[i];
      if (!s.contains("content") || !s["content"].is_string() || utf8::char_length(s["content"].get<std::string>(), 0) != s["content"].get<std::string>().size())
        fail("{}: Strip content must be one character", w);
      if (s.value("stop", 0) != 0) fail("{}: Strip with stop {} is not supported (only 0)", w, s["stop"].dump());
      t.strip_content_ = s["content"].get<std::string>();
      t.strip_start_ = s.value("start", 0);
      strip = true;
    } else if (type == "Replace" || type == "ByteFallback" || type == "Fuse" || type == "Strip") {
      fail("{}: decoder {} in this position is not supported (order must be Replace*, ByteFallback, Fuse, Strip)", w, type);
    } else {
      fail("{}: decoder \"{}\" is not supported (only Sequence, Replace, ByteFallback, Fuse, Strip)", w, type);
    }
  }
  t.decoded_.assign(size_t(size), std::string());
  t.byte_.assign(size_t(size), -1);
  std::vector<std::string> source = t.pieces_;
  for (const auto& a : t.added_)  // HF decodes a normalized added token as its normalized content
    if (a.normalized) t.normalize(a.content, source[size_t(a.id)]);
  for (int32_t id = 0; id < size; ++id) {
    std::string d = std::move(source[size_t(id)]);
    for (const auto& [from, to] : replaces) replace_all(d, from, to);
    if (byte_fallback) t.byte_[size_t(id)] = int16_t(byte_of(d));
    t.decoded_[size_t(id)] = std::move(d);
  }
  return t;
}

void Tokenizer::normalize(std::string_view in, std::string& out) const {
  out.assign(in);
  for (const auto& step : norm_) {
    if (step.prepend) {
      if (!out.empty()) out.insert(0, step.a);
    } else {
      replace_all(out, step.a, step.b);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::repair(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special_tokens) out.insert(out.end(), prefix_.begin(), prefix_.end());
  BpeModel::Workspace ws;
  std::vector<TextSplit> raw, inner;
  std::string normalized;
  raw_matcher_.split(text, raw);
  for (const TextSplit& s : raw) {
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    if (s.end <= s.begin) continue;  // HF drops empty segments before normalizing
    normalize(text.substr(s.begin, s.end - s.begin), normalized);
    if (normalized_matcher_.empty()) {
      model_.tokenize(normalized, out, ws);
      continue;
    }
    inner.clear();
    normalized_matcher_.split(normalized, inner);
    for (const TextSplit& p : inner) {
      if (p.id >= 0) out.push_back(p.id);
      else if (p.end > p.begin) model_.tokenize(std::string_view(normalized).substr(p.begin, p.end - p.begin), out, ws);
    }
  }
  if (add_special_tokens) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !known_[size_t(id)])
    fail("token id {} is not in the vocabulary of {} (size {})", id, where_, vocab_size());
}

const std::string& Tokenizer::id_to_piece(int32_t id) const {
  check_id(id);
  return pieces_[size_t(id)];
}

std::optional<int32_t> Tokenizer::piece_to_id(std::string_view piece) const {
  for (const auto& a : added_)
    if (a.content == piece) return a.id;
  return model_.find(piece);
}

void Tokenizer::flush_bytes(std::string& bytes, std::string& out) {
  if (bytes.empty()) return;
  if (utf8::is_valid(bytes)) {
    out.append(bytes);
  } else {
    for (size_t i = 0; i < bytes.size(); ++i) out.append(utf8::kReplacement);
  }
  bytes.clear();
}

size_t Tokenizer::strip_prefix(std::string_view text, int& budget) const {
  size_t cut = 0;
  while (budget > 0 && !strip_content_.empty() && text.substr(cut).starts_with(strip_content_)) {
    cut += strip_content_.size();
    --budget;
  }
  return cut;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out, bytes;
  out.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    check_id(id);
    if (skip_special_tokens && special_[size_t(id)]) continue;
    int b = byte_[size_t(id)];
    if (b >= 0) {
      bytes.push_back(char(b));
      continue;
    }
    flush_bytes(bytes, out);
    out.append(decoded_[size_t(id)]);
  }
  flush_bytes(bytes, out);
  int budget = strip_start_;
  size_t cut = strip_prefix(out, budget);
  if (cut > 0) out.erase(0, cut);
  return out;
}

}  // namespace sala
