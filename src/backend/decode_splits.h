// How the CUDA backend splits one decode attention unit (16 query rows of one KV head against a
// sequence's keys, in 32-key chunks) over CTAs, whose partial softmaxes a combine kernel merges.
// Plain C++ (no CUDA headers), so that the unit tests check the rule on the host.
#pragma once
#include <algorithm>
#include <cstdint>

namespace sala {

constexpr int kMaxDecodeSplits = 64;  // the combine kernel's bound (attention.cu)

// Splits for a unit of `nchunks` chunks when the grid asks for `fill` CTAs per unit: at most
// `fill`, at least 4 chunks each (one 32-key tile per warp: an SM draws a few tens of GB/s, so a
// short context's K/V arrive sooner over more SMs), at most kMaxDecodeSplits, and never an empty
// one — the kernel gives split s the chunks [s·c, (s + 1)·c), c = ⌈nchunks / splits⌉; an empty
// split is a CTA that only costs a wave (batch 8 at 4K: 17 asked, 16 used).
inline int decode_attention_splits(int64_t nchunks, int64_t fill) {
  const int64_t asked = std::max<int64_t>(1, std::min<int64_t>({fill, nchunks / 4, kMaxDecodeSplits}));
  const int64_t per_split = std::max<int64_t>(1, (nchunks + asked - 1) / asked);
  return int(std::max<int64_t>(1, (nchunks + per_split - 1) / per_split));
}

}  // namespace sala
