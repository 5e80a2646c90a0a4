// UTF-8 helpers for the tokenizer: validation, U+FFFD repair, code point iteration and the
// two character classes that HF `tokenizers` uses for added tokens (\s and \w).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sala::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// State of a byte sequence that should hold exactly one character.
enum class Prefix { Complete, Incomplete, Invalid };

// Classifies bytes[0..n): one whole well-formed character, a proper prefix of one, or neither.
// n must be >= 1; bytes past the first complete character make it Invalid.
Prefix classify(const uint8_t* bytes, size_t n);

// Length of the well-formed character starting at s[i], or 0 if none starts there.
size_t char_length(std::string_view s, size_t i);

// Length of the maximal ill-formed subpart at s[i] (Unicode §3.9; >= 1), when char_length is 0.
size_t bad_length(std::string_view s, size_t i);

bool is_valid(std::string_view s);

// Copy of s where every maximal ill-formed subpart is replaced by one U+FFFD (the Unicode
// recommendation, same as Python's errors="replace" and Rust's from_utf8_lossy).
std::string repair(std::string_view s);

// Decodes the well-formed character at s[i] and advances i. Precondition: s is valid UTF-8.
uint32_t next(std::string_view s, size_t& i);

void append(std::string& out, uint32_t cp);

// The regex class \s: Unicode White_Space (same set as Rust's char::is_whitespace).
bool is_whitespace(uint32_t cp);

// The regex class \w that HF `tokenizers` uses for added tokens' single_word (Rust regex,
// Unicode: Alphabetic, marks, decimal digits, connector punctuation, ZWNJ/ZWJ). Table in
// word_table.cpp, generated from Unicode 14 (code points assigned later may differ).
bool is_word_char(uint32_t cp);

}  // namespace sala::utf8
