// The CPU backend's one dot product. Its summation order depends on n alone (eight interleaved
// partial sums, a fixed pairwise tree, then the tail), so a product computed with it is the same
// bits whatever the batch size or thread count around it.
#pragma once
#include <cstdint>

namespace sala::cpu {

// Eight independent partial sums so the loop vectorises without reassociation flags.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int i = 0; i < 8; ++i) acc[i] += a[j + i] * b[j + i];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; j < n; ++j) s += a[j] * b[j];
  return s;
}

}  // namespace sala::cpu
