#include "cli/bench_ceilings.h"

#include <memory>
#include <utility>
#include <vector>

#include "cli/bench_timing.h"
#include "core/dtype.h"

namespace sala::cli {
namespace {

// `rows` × `cols` of the activation dtype; an input (`fill`) gets every row the same small positive
// values (no denormals or NaNs from uninitialised memory to slow a CPU down), an output nothing.
Mat buffer(Backend& b, std::unique_ptr<Buffer>& buf, int64_t rows, int64_t cols, bool fill) {
  const DType act = b.act_dtype();
  buf = b.alloc(size_t(rows * cols) * dtype_size(act));
  Mat m = buf->mat(act, rows, cols);
  if (!fill) return m;
  std::vector<float> host(static_cast<size_t>(cols));
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i % 7) * 0.1f + 0.05f;
  for (int64_t r = 0; r < rows; ++r) b.upload(m.slice_rows(r, 1), host.data());
  return m;
}

// Median seconds of `timed` runs of `op` (device work included) after 2 warm-up runs.
template <typename Op>
double median_seconds(Backend& b, int timed, Op op) {
  std::vector<double> t;
  for (int i = 0; i < 2 + timed; ++i) {
    b.synchronize();
    const auto t0 = BenchClock::now();
    op();
    b.synchronize();
    if (i >= 2) t.push_back(seconds_since(t0));
  }
  return median(std::move(t));
}

}  // namespace

double measure_bandwidth(Backend& b, bool big) {
  const int64_t rows = big ? 32768 : 2048, cols = 8192;  // 512 MiB (bf16) on GPUs
  std::unique_ptr<Buffer> x, y;
  Mat mx = buffer(b, x, rows, cols, true), my = buffer(b, y, rows, cols, false);
  // A scale reads and writes every byte once.
  return 2.0 * double(mx.nbytes()) / median_seconds(b, 6, [&] { b.scale(mx, 1.0f, my); });
}

double measure_matmul(Backend& b, bool big) {
  const int64_t n = big ? 8192 : 1024;
  std::unique_ptr<Buffer> x, y;
  Mat a = buffer(b, x, n, n, true), out = buffer(b, y, n, n, false);
  Weight w = b.random_weight(n, n, 0.0f, 0.02f, 99);
  return 2.0 * double(n) * n * n / median_seconds(b, 4, [&] { b.matmul(a, w, out); });
}

}  // namespace sala::cli
