#include "engine/logit_stats.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "core/error.h"

namespace sala {

LogitStats compare_logits(std::span<const float> ref, std::span<const float> got, int vocab) {
  SALA_CHECK(vocab > 0 && ref.size() == got.size() && ref.size() % size_t(vocab) == 0,
             "compare_logits: {} and {} logits are not the same [positions, {}]", ref.size(), got.size(), vocab);
  LogitStats s;
  double e2 = 0, r2 = 0;
  const size_t rows = ref.size() / size_t(vocab);
  long agree = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* a = ref.data() + r * size_t(vocab);
    const float* b = got.data() + r * size_t(vocab);
    size_t ia = 0, ib = 0;
    for (int j = 0; j < vocab; ++j) {
      e2 += double(a[j] - b[j]) * double(a[j] - b[j]);
      r2 += double(a[j]) * double(a[j]);
      if (a[j] > a[ia]) ia = size_t(j);
      if (b[j] > b[ib]) ib = size_t(j);
    }
    agree += ia == ib;
    // log-softmax of both rows from their maxima (stable), then Σ p·(log p − log q).
    const double ma = a[ia], mb = b[ib];
    double za = 0, zb = 0;
    for (int j = 0; j < vocab; ++j) za += std::exp(a[j] - ma), zb += std::exp(b[j] - mb);
    const double lza = std::log(za), lzb = std::log(zb);
    double kl = 0;
    for (int j = 0; j < vocab; ++j) {
      const double la = a[j] - ma - lza, lb = b[j] - mb - lzb;
      kl += std::exp(la) * (la - lb);
    }
    s.kl += kl;
    s.max_kl = std::max(s.max_kl, kl);
  }
  s.rel = r2 > 0 ? std::sqrt(e2 / r2) : 0.0;
  s.positions = long(rows);
  s.top1 = rows ? double(agree) / double(rows) : 0.0;
  s.kl = rows ? s.kl / double(rows) : 0.0;
  return s;
}

}  // namespace sala
