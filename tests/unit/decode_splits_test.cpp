// The CUDA backend's decode attention split rule (backend/decode_splits.h), checked on the host:
// the kernel gives split s the chunks [s·c, (s + 1)·c) with c = ⌈nchunks / splits⌉, so every split
// must own at least one chunk, and the counts must stay within what the grid and the combine
// kernel take.
#include <gtest/gtest.h>

#include "backend/decode_splits.h"

namespace sala {
namespace {

TEST(DecodeSplits, NeverEmptyAndWithinBounds) {
  for (int64_t nchunks = 1; nchunks <= 4096; nchunks += (nchunks < 300 ? 1 : 37))
    for (int64_t fill : {1, 2, 3, 7, 16, 17, 33, 64, 66, 132, 264}) {
      const int ns = decode_attention_splits(nchunks, fill);
      ASSERT_GE(ns, 1) << nchunks << " chunks, fill " << fill;
      ASSERT_LE(ns, kMaxDecodeSplits) << nchunks << " chunks, fill " << fill;
      ASSERT_LE(ns, std::max<int64_t>(1, fill)) << nchunks << " chunks, fill " << fill;
      ASSERT_LE(ns, std::max<int64_t>(1, nchunks / 4)) << nchunks << " chunks, fill " << fill;
      const int64_t per_split = (nchunks + ns - 1) / ns;  // as attention.cu computes it
      ASSERT_LT((ns - 1) * per_split, nchunks) << "split " << ns - 1 << " empty: " << nchunks << " chunks, fill "
                                               << fill;
    }
}

TEST(DecodeSplits, MeasuredShapes) {
  // 9B geometry, 4K context (128 chunks per KV head), an H100 (the grid asks for 264 CTAs):
  EXPECT_EQ(decode_attention_splits(128, 132), 32);  // batch 1: 2 units → 64 CTAs
  EXPECT_EQ(decode_attention_splits(128, 17), 16);   // batch 8: 16 units; 17 would leave one empty
  EXPECT_EQ(decode_attention_splits(1024, 132), 64);  // 32K: the combine's bound
  EXPECT_EQ(decode_attention_splits(3, 132), 1);      // too few chunks to split
}

}  // namespace
}  // namespace sala
