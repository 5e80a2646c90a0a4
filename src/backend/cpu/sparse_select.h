// InfLLM-v2 block bookkeeping shared by the CPU sparse attention and its tests (spec §4.4–4.7):
// compressed-chunk counts, the K1 chunks pooled into a block, forced blocks, and the top-k block
// selection with the engine's deterministic rule (score desc, block index asc, past blocks only).
// Header-only and backend-independent: the host can use it to plan, the CPU kernel to select.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace sala::sparse {

// Number of complete windows of `window` tokens at stride `stride` over T tokens (spec §4.4).
inline int64_t n_chunks(int64_t T, int64_t window, int64_t stride) {
  return T < window ? 0 : (T - window) / stride + 1;
}

struct BlockGeometry {
  int block_size = 64;
  int kernel_size = 32, kernel_stride = 16;  // K1; K2 is 4x both
  int init_blocks = 1, local_blocks = 32, topk = 64;

  static BlockGeometry from(const CacheSpec& s) {
    return {s.block_size, s.kernel_size, s.kernel_stride, s.init_blocks, s.local_blocks, s.topk};
  }
  int64_t n1(int64_t T) const { return n_chunks(T, kernel_size, kernel_stride); }
  int64_t n2(int64_t T) const { return n_chunks(T, 4 * int64_t(kernel_size), 4 * int64_t(kernel_stride)); }
  int64_t n_blocks(int64_t T) const { return (T + block_size - 1) / block_size; }
  // K = min(topk + local_blocks, NB).
  int64_t budget(int64_t T) const { return std::min<int64_t>(int64_t(topk) + local_blocks, n_blocks(T)); }
  // forced(k) = k < init_blocks or qb − local_blocks ≤ k ≤ qb.
  bool forced(int64_t k, int64_t qb) const { return k < init_blocks || (qb - local_blocks <= k && k <= qb); }
  // K1 chunks c pooled into block k: c·st < (k+1)·bs and c·st + ks > k·bs, as [first, last]
  // (before clipping to the existing columns; first > last never happens for k ≥ 0).
  std::pair<int64_t, int64_t> pool_range(int64_t k) const {
    const int64_t lo = k * block_size - kernel_size;  // need c·st > lo
    const int64_t first = lo < 0 ? 0 : lo / kernel_stride + 1;
    const int64_t last = ((k + 1) * block_size - 1) / kernel_stride;
    return {first, last};
  }
  // One past the last K1 column whose score can matter for a query in block qb: the columns of the
  // last non-forced past block (qb − local_blocks − 1); 0 if there is none.
  int64_t scored_columns(int64_t qb) const {
    const int64_t kmax = qb - local_blocks - 1;
    if (kmax < 0 || kmax < init_blocks) return 0;
    return pool_range(kmax).second + 1;
  }
};

// Scratch for select_blocks (reused across calls to avoid allocation per query).
struct SelectScratch {
  struct Cand {
    bool forced;
    float score;
    int32_t block;
  };
  std::vector<Cand> cand;
};

// Selects the blocks a query at position p attends to (spec §4.6–4.7) in a sequence of T tokens.
//   score[c], c < n_scored: stage-1 score of visible K1 column c. Columns in [n_scored, n1(T)) are
//   taken as 0 (invisible columns hold 0 in the reference). Only columns < scored_columns(qb) are
//   ever read, so a caller may pass n_scored = min(n1(p+1), scored_columns(qb)).
// Block score: +inf if forced, else the max over its pooled columns within [0, n1(T)), −inf if that
// range is empty. Past blocks 0..qb are sorted by (score desc, index asc) and the first K taken
// (future blocks are never selected), forced blocks ranking ahead of any scored block: that only
// differs from the plain sort when a stage-1 score is +inf (no K2 visible), and keeps the local
// window (incl. the query's own block) selected.
// Writes the selected block indices in ascending order to `out`.
inline void select_blocks(const BlockGeometry& g, const float* score, int64_t n_scored, int64_t p, int64_t T,
                          std::vector<int32_t>& out, SelectScratch& scratch) {
  const int64_t qb = p / g.block_size;
  const int64_t K = g.budget(T);
  out.clear();
  if (qb + 1 <= K) {  // every past block fits the budget: the sort would take them all
    for (int64_t k = 0; k <= qb; ++k) out.push_back(int32_t(k));
    return;
  }
  const int64_t ncols = g.n1(T);
  constexpr float inf = std::numeric_limits<float>::infinity();
  auto& cand = scratch.cand;
  cand.clear();
  for (int64_t k = 0; k <= qb; ++k) {
    const bool forced = g.forced(k, qb);
    float s = inf;
    if (!forced) {
      auto [c0, c1] = g.pool_range(k);
      c1 = std::min(c1, ncols - 1);
      s = -inf;  // also when the pooled range is empty
      for (int64_t c = c0; c <= c1; ++c) {
        float v = c < n_scored ? score[c] : 0.f;
        if (v != v) v = 0.f;  // NaN -> 0, as the reference does
        s = std::max(s, v);
      }
    }
    cand.push_back({forced, s, int32_t(k)});
  }
  // Forced blocks rank first (they are +inf; this also keeps them ahead of +inf stage-1 scores,
  // which only occur when no K2 chunk is visible), then score desc, then block index asc.
  auto better = [](const SelectScratch::Cand& a, const SelectScratch::Cand& b) {
    if (a.forced != b.forced) return a.forced;
    if (a.score != b.score) return a.score > b.score;
    return a.block < b.block;
  };
  std::nth_element(cand.begin(), cand.begin() + (K - 1), cand.end(), better);
  for (int64_t i = 0; i < K; ++i) out.push_back(cand[size_t(i)].block);
  std::sort(out.begin(), out.end());
}

}  // namespace sala::sparse
