// Helpers the model-level unit tests share: a random tiny checkpoint written once per process,
// random token ids, and the relative error the tests compare logits by.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "model/presets.h"
#include "model/random_checkpoint.h"

namespace sala::test {

// The "tiny" preset with random f32 weights of `seed`, written under the temp directory the first
// time a test of this process asks for `tag` (each test file its own tag and seed), and removed
// when the process exits (CTest runs every test in its own process: hundreds per suite run).
inline std::filesystem::path tiny_checkpoint(const std::string& tag, uint64_t seed) {
  struct Written {
    std::map<std::string, std::filesystem::path> dirs;
    ~Written() {
      std::error_code ec;  // best effort: a leftover directory is not a test failure
      for (const auto& [t, dir] : dirs) std::filesystem::remove_all(dir, ec);
    }
  };
  static Written written;
  auto [it, fresh] = written.dirs.try_emplace(tag);
  if (fresh) {
    it->second = std::filesystem::temp_directory_path() / ("sala_" + tag + "_" + std::to_string(::getpid()));
    write_random_checkpoint(it->second, preset_config("tiny"), {.seed = seed, .dtype = DType::F32});
  }
  return it->second;
}

// n token ids uniform in [5, vocab): above the special tokens.
inline std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(5, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

// ‖a − b‖ / ‖b‖ in double.
inline double rel_err(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace sala::test
