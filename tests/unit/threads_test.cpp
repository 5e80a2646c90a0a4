#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/threads.h"

using namespace sala;

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 3, 4, 17, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, RethrowsWorkerExceptions) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(30, [&](int64_t b, int64_t) {
    if (b > 0) throw std::runtime_error("boom");
  }), std::runtime_error);
  // The pool stays usable afterwards.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 100);
}
