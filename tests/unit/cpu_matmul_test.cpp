// The CPU backend's batch-invariant mode (`--deterministic`): a row's product is the same bits
// whatever else is in the batch and however many threads run — the property exact speculative
// and continuous-batching tests rely on (OpenBLAS gives neither on AVX-512 machines).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/rng.h"

using namespace sala;

namespace {

std::vector<float> randn(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = normal01(seed, i);
  return v;
}

// y = x · Wᵀ on `b` for the first `rows` rows of x ([*, in]).
std::vector<float> product(CpuBackend& b, const Weight& w, const std::vector<float>& x, int64_t rows) {
  auto xb = b.alloc(size_t(rows * w.in()) * 4), yb = b.alloc(size_t(rows * w.out()) * 4);
  Mat xm = xb->mat(DType::F32, rows, w.in()), ym = yb->mat(DType::F32, rows, w.out());
  b.upload(xm, x.data());
  b.matmul(xm, w, ym);
  std::vector<float> y(size_t(rows * w.out()));
  b.download(ym, y.data());
  return y;
}

}  // namespace

TEST(CpuMatmul, BatchInvariantRowsAreTheSameBitsForAnyBatchAndThreads) {
  CpuBackend one(1, /*batch_invariant=*/true), two(2, /*batch_invariant=*/true);
  for (int64_t in : {7, 64, 300}) {
    for (int64_t out : {5, 33}) {
      const Weight w1 = one.random_weight(out, in, 0.f, 0.1f, uint64_t(in * 100 + out));
      const Weight w2 = two.random_weight(out, in, 0.f, 0.1f, uint64_t(in * 100 + out));
      const auto x = randn(size_t(64 * in), uint64_t(in + out));
      const auto ref = product(one, w1, x, 64);
      // Against a double-precision product: the fixed order is still an accurate one.
      std::vector<float> wh(size_t(out * in));
      one.download(w1.w, wh.data());
      double num = 0, den = 0;
      for (int64_t r = 0; r < 64; ++r)
        for (int64_t o = 0; o < out; ++o) {
          double d = 0;
          for (int64_t k = 0; k < in; ++k) d += double(x[size_t(r * in + k)]) * wh[size_t(o * in + k)];
          num += (ref[size_t(r * out + o)] - d) * (ref[size_t(r * out + o)] - d), den += d * d;
        }
      EXPECT_LT(std::sqrt(num / den), 1e-6) << "in " << in << " out " << out;
      for (int64_t rows : {1, 2, 5, 17, 64}) {
        for (CpuBackend* b : {&one, &two}) {
          const auto y = product(*b, b == &one ? w1 : w2, x, rows);
          EXPECT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0)
              << "in " << in << " out " << out << " rows " << rows << " threads " << b->pool().size();
        }
      }
    }
  }
}

TEST(CpuMatmul, PackedWeightsAreBatchInvariantToo) {
  CpuBackend one(1, /*batch_invariant=*/true), two(2, /*batch_invariant=*/true);
  const int64_t out = 24, in = 128;
  const Weight w1 = one.random_quantized_weight(WeightFormat::Q4, out, in, 64, 0.1f, 5);
  const Weight w2 = two.random_quantized_weight(WeightFormat::Q4, out, in, 64, 0.1f, 5);
  const auto x = randn(size_t(70 * in), 6);
  const auto ref = product(one, w1, x, 1);
  const auto ref69 = product(one, w1, std::vector<float>(x.end() - in, x.end()), 1);  // the last row alone
  for (int64_t rows : {1, 9, 40, 70}) {  // 9, 40: above the per-row threshold of the default mode; 70: x in pieces
    for (CpuBackend* b : {&one, &two}) {
      const auto y = product(*b, b == &one ? w1 : w2, x, rows);
      EXPECT_EQ(std::memcmp(y.data(), ref.data(), size_t(out) * 4), 0) << "rows " << rows;
      if (rows == 70) EXPECT_EQ(std::memcmp(y.data() + 69 * out, ref69.data(), size_t(out) * 4), 0) << "row 69 of 70";
    }
  }
}

// --deterministic is accepted for CUDA too (batch-invariant kernels, checked on the GPU by
// sala_cuda_tests "batch-invariant ..."); without a GPU the error names the missing device/build.
TEST(CpuMatmul, CudaBatchInvarianceNeedsOnlyTheDevice) {
  const auto names = available_backends();
  if (std::find(names.begin(), names.end(), "cuda") != names.end()) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_backend("cuda", 0, /*batch_invariant=*/true);
    FAIL() << "no error without a CUDA device";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.find("no CUDA device") != std::string::npos || m.find("not compiled") != std::string::npos) << m;
    EXPECT_EQ(m.find("deterministic"), std::string::npos) << m;
  }
}
