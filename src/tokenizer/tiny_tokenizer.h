// A self-consistent tokenizer.json for tiny random checkpoints (`sala init` with a vocabulary
// other than 73448), using the same pipeline as the real one (normalizer Prepend "▁" + Replace,
// BPE with byte fallback, BOS template, Replace/ByteFallback/Fuse/Strip decoder).
//
// Layout: 0 <unk>, 1 <s>, 2 </s>, 3 <|im_start|>, 4 <|im_end|> (special added tokens); 5..260 the
// byte pieces <0x00>..<0xFF>; 261 "▁"; then single characters (printable ASCII, "\n", "\t"; most
// frequent English letters first, as many as fit); then merges learnt deterministically from a
// small built-in English text; any ids left are "<reserved_N>" pieces. Merges are written in
// the ["a", "b"] form. BOS is 1; EOS ids are 2 and 4; pad is 2.
#pragma once
#include <nlohmann/json.hpp>

namespace sala {

inline constexpr int kTinyMinVocab = 300;
inline constexpr int kTinyBosId = 1;

// Throws if vocab_size < kTinyMinVocab.
nlohmann::json make_tiny_tokenizer_json(int vocab_size);

// [2, 4]: </s> and <|im_end|>.
nlohmann::json tiny_tokenizer_eos_ids();

}  // namespace sala
