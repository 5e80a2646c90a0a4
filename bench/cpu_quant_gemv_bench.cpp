// CPU decode GEMV (one row of x) of packed weights against the same matrix dense in f32 and a
// plain read of memory, on the 9B model's 4096×4096 shape. Each iteration multiplies the next of
// enough copies of the matrix to span 256 MiB, so that the weights come from DRAM as in a
// model's decode step, not from the last-level cache. Counters: "packed B/s" = the weight's
// bytes per second (what a bandwidth-bound GEMV moves), "weights/s". The read benchmark sums a
// 256 MiB buffer as 64-bit words on the backend's threads: the memory ceiling the products are
// measured against (docs/quantization.md, CPU kernels). Run: build/sala_microbench
// --benchmark_filter='Gemv|Read'.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/quant.h"

namespace {

using namespace sala;

constexpr int64_t kOut = 4096, kIn = 4096;
constexpr size_t kSpan = size_t(256) << 20;  // bytes of weights an iteration cycles through

CpuBackend& backend() {
  static CpuBackend b(0);
  return b;
}

std::vector<float> random_weights() {
  std::vector<float> w(size_t(kOut * kIn));
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (auto& v : w) {  // uniform in ±1/sqrt(in): the scale of the model's projections
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    v = (float(s >> 40) / float(1 << 24) - 0.5f) * 2.f / std::sqrt(float(kIn));
  }
  return w;
}

struct Case {
  QuantFormat format;
  int group;
  bool zero_points;
};

// copies: the same weight loaded that many times (separate buffers); rows: of x (1: decode; more
// than 8: a prompt chunk, decoded tiles through sgemm).
void run_gemv(benchmark::State& st, const std::vector<Weight>& copies, int64_t rows = 1) {
  CpuBackend& b = backend();
  auto xb = b.alloc(size_t(rows * kIn) * 4), yb = b.alloc(size_t(rows * kOut) * 4);
  Mat x = xb->mat(DType::F32, rows, kIn), y = yb->mat(DType::F32, rows, kOut);
  std::vector<float> xh(size_t(rows * kIn), 0.01f);
  b.upload(x, xh.data());
  size_t i = 0;
  for (auto _ : st) {
    b.matmul(x, copies[i], y);
    i = (i + 1) % copies.size();
    benchmark::DoNotOptimize(y.data);
  }
  const double bytes = double(copies[0].nbytes());
  st.counters["packed B/s"] = benchmark::Counter(bytes * double(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["weights/s"] = benchmark::Counter(double(kOut * kIn) * double(st.iterations()), benchmark::Counter::kIsRate);
}

std::vector<Weight> packed_copies(Case c) {
  static const std::vector<float> w = random_weights();
  const PackedMatrix pm = pack_matrix(quantize_matrix(w.data(), kOut, kIn, c.format, c.group, c.zero_points));
  std::vector<Weight> copies(1, backend().load_quantized_weight(pm.view(), "bench"));
  while (copies.size() * copies[0].nbytes() < kSpan) copies.push_back(backend().load_quantized_weight(pm.view(), "bench"));
  return copies;
}

void BM_PackedGemv(benchmark::State& st, Case c) { run_gemv(st, packed_copies(c)); }

// A 32-row prompt chunk: decoded tiles through sgemm.
void BM_PackedPrefill32(benchmark::State& st, Case c) { run_gemv(st, packed_copies(c), 32); }

void BM_DenseF32Gemv(benchmark::State& st) {
  static const std::vector<float> w = random_weights();
  std::vector<Weight> copies;
  while (copies.size() * size_t(kOut * kIn * 4) < kSpan) copies.push_back(backend().load_weight(TensorView{w.data(), DType::F32, {kOut, kIn}}));
  run_gemv(st, copies);
}

// 256 MiB read as 64-bit words by the backend's threads: what memory gives these threads.
void BM_ReadMemory(benchmark::State& st) {
  const size_t bytes = kSpan;
  std::vector<uint64_t> buf(bytes / 8, 1);
  ThreadPool& pool = backend().pool();
  for (auto _ : st) {
    std::atomic<uint64_t> total{0};
    pool.parallel_for(int64_t(buf.size()), [&](int64_t i0, int64_t i1) {
      uint64_t s = 0;
      for (int64_t i = i0; i < i1; ++i) s += buf[size_t(i)];
      total += s;
    });
    benchmark::DoNotOptimize(total.load());
  }
  st.counters["packed B/s"] = benchmark::Counter(double(bytes) * double(st.iterations()), benchmark::Counter::kIsRate);
}

BENCHMARK(BM_ReadMemory)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_DenseF32Gemv)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_PackedGemv, fp8, Case{QuantFormat::FP8, 0, false})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_PackedGemv, int8, Case{QuantFormat::INT8, 0, false})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_PackedGemv, int4_g64, Case{QuantFormat::INT4, 64, true})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_PackedGemv, int4_g128, Case{QuantFormat::INT4, 128, true})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_PackedPrefill32, int8, Case{QuantFormat::INT8, 0, false})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_PackedPrefill32, int4_g128, Case{QuantFormat::INT4, 128, true})->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
