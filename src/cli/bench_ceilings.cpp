#include "cli/bench_ceilings.h"

#include <memory>
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

}  // namespace

double measure_bandwidth(Backend& b, bool big) {
  const int64_t rows = big ? 32768 : 2048, cols = 8192;  // 512 MiB (bf16) on GPUs
  std::unique_ptr<Buffer> x, y;
  Mat mx = buffer(b, x, rows, cols, true), my = buffer(b, y, rows, cols, false);
  std::vector<double> t;
  for (int i = 0; i < 8; ++i) {  // a scale reads and writes every byte once
    b.synchronize();
    auto t0 = BenchClock::now();
    b.scale(mx, 1.0f, my);
    b.synchronize();
    if (i >= 2) t.push_back(seconds_since(t0));
  }
  return 2.0 * double(mx.nbytes()) / median(t);
}

double measure_matmul(Backend& b, bool big) {
  const int64_t n = big ? 8192 : 1024;
  std::unique_ptr<Buffer> x, y;
  Mat a = buffer(b, x, n, n, true), out = buffer(b, y, n, n, false);
  Weight w = b.random_weight(n, n, 0.0f, 0.02f, 99);
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    b.synchronize();
    auto t0 = BenchClock::now();
    b.matmul(a, w, out);
    b.synchronize();
    if (i >= 2) t.push_back(seconds_since(t0));
  }
  return 2.0 * double(n) * n * n / median(t);
}

}  // namespace sala::cli
