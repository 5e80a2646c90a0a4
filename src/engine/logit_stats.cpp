#include "engine/logit_stats.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "core/error.h"
#include "core/threads.h"

namespace sala {

LogitStats compare_logits(std::span<const float> ref, std::span<const float> got, int vocab, ThreadPool* pool) {
  SALA_CHECK(vocab > 0 && ref.size() == got.size() && ref.size() % size_t(vocab) == 0,
             "compare_logits: {} and {} logits are not the same [positions, {}]", ref.size(), got.size(), vocab);
  const size_t rows = ref.size() / size_t(vocab);
  struct Row {
    double e2 = 0, r2 = 0, kl = 0;
    bool agree = false;
  };
  std::vector<Row> per(rows);
  auto score = [&](int64_t r0, int64_t r1) {
    for (size_t r = size_t(r0); r < size_t(r1); ++r) {
      const float* a = ref.data() + r * size_t(vocab);
      const float* b = got.data() + r * size_t(vocab);
      Row& o = per[r];
      size_t ia = 0, ib = 0;
      for (int j = 0; j < vocab; ++j) {
        o.e2 += double(a[j] - b[j]) * double(a[j] - b[j]);
        o.r2 += double(a[j]) * double(a[j]);
        if (a[j] > a[ia]) ia = size_t(j);
        if (b[j] > b[ib]) ib = size_t(j);
      }
      o.agree = ia == ib;
      // log-softmax of both rows from their maxima (stable), then Σ p·(log p − log q).
      const double ma = a[ia], mb = b[ib];
      double za = 0, zb = 0;
      for (int j = 0; j < vocab; ++j) za += std::exp(a[j] - ma), zb += std::exp(b[j] - mb);
      const double lza = std::log(za), lzb = std::log(zb);
      for (int j = 0; j < vocab; ++j) {
        const double la = a[j] - ma - lza, lb = b[j] - mb - lzb;
        o.kl += std::exp(la) * (la - lb);
      }
    }
  };
  if (pool && rows > 1)
    pool->parallel_for(int64_t(rows), score);
  else
    score(0, int64_t(rows));
  LogitStats s;
  double e2 = 0, r2 = 0;
  long agree = 0;
  for (const Row& o : per) {
    e2 += o.e2, r2 += o.r2, agree += o.agree, s.kl += o.kl;
    s.max_kl = std::max(s.max_kl, o.kl);
  }
  s.rel = r2 > 0 ? std::sqrt(e2 / r2) : 0.0;
  s.positions = long(rows);
  s.top1 = rows ? double(agree) / double(rows) : 0.0;
  s.kl = rows ? s.kl / double(rows) : 0.0;
  return s;
}

}  // namespace sala
