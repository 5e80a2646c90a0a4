#include "tokenizer/utf8.h"

namespace sala::utf8 {
namespace {

// Total length announced by a lead byte and the allowed range of the second byte (Unicode
// Table 3-7); total 0 marks a byte that cannot start a character.
struct Lead {
  uint8_t total, lo, hi;
};

Lead lead(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of leading bytes of s[i..] that are a valid (possibly complete) prefix of one character.
size_t valid_prefix(const uint8_t* p, size_t n, size_t* total) {
  Lead l = lead(p[0]);
  *total = l.total;
  if (l.total == 0) return 0;
  size_t k = 1;
  for (; k < l.total && k < n; ++k) {
    uint8_t lo = k == 1 ? l.lo : 0x80, hi = k == 1 ? l.hi : 0xBF;
    if (p[k] < lo || p[k] > hi) break;
  }
  return k;
}

}  // namespace

Prefix classify(const uint8_t* bytes, size_t n) {
  size_t total = 0;
  size_t k = valid_prefix(bytes, n, &total);
  if (total == 0 || (k < n && k < total)) return Prefix::Invalid;
  if (n > total) return Prefix::Invalid;
  return n == total ? Prefix::Complete : Prefix::Incomplete;
}

size_t char_length(std::string_view s, size_t i) {
  auto p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  size_t total = 0, k = valid_prefix(p, s.size() - i, &total);
  return total != 0 && k == total ? total : 0;
}

size_t bad_length(std::string_view s, size_t i) {
  auto p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  size_t total = 0, k = valid_prefix(p, s.size() - i, &total);
  return k == 0 ? 1 : k;
}

bool is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = char_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string repair(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    size_t n = char_length(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacement);
      i += bad_length(s, i);
    }
  }
  return out;
}

uint32_t next(std::string_view s, size_t& i) {
  auto p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  if (p[0] < 0x80) {
    i += 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    i += 2;
    return (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    i += 3;
    return (uint32_t(p[0] & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  i += 4;
  return (uint32_t(p[0] & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) | (uint32_t(p[2] & 0x3F) << 6) |
         (p[3] & 0x3F);
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

extern const uint32_t kWordRanges[][2];
extern const size_t kWordRangeCount;

bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z') || cp == '_';
  size_t lo = 0, hi = kWordRangeCount;  // first range whose end >= cp
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (kWordRanges[mid][1] < cp) lo = mid + 1;
    else hi = mid;
  }
  return lo < kWordRangeCount && kWordRanges[lo][0] <= cp;
}

}  // namespace sala::utf8
