// Counter-based random numbers: value i of stream `seed` depends only on (seed, i), so a tensor is
// the same whether it is generated on the CPU, on the GPU, in one piece or in many.
#pragma once
#include <cmath>
#include <cstdint>

namespace sala {

#if defined(__CUDACC__)
#define SALA_HD __host__ __device__
#else
#define SALA_HD
#endif

SALA_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1], 24 bits of resolution.
SALA_HD inline float uniform01(uint64_t seed, uint64_t index) {
  return float((splitmix64(seed * 0x632be59bd9b4e019ull + index) >> 40) + 1) * (1.0f / 16777216.0f);
}

// Standard normal via Box-Muller on two uniforms of the same counter.
SALA_HD inline float normal01(uint64_t seed, uint64_t index) {
  const float u1 = uniform01(seed, 2 * index), u2 = uniform01(seed, 2 * index + 1);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

}  // namespace sala
