// CPU backend: memory, weights, caches and the elementwise/matrix ops. The attention ops live in
// cpu_attention.cpp. Everything is f32; weights are converted from their checkpoint dtype at load.
#include "backend/cpu/cpu_backend.h"

#ifdef SALA_HAS_OPENBLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "backend/cpu/cpu_dot.h"
#include "core/error.h"
#include "core/rng.h"

namespace sala {

namespace {

class HostBuffer final : public Buffer {
 public:
  HostBuffer(size_t bytes, std::shared_ptr<std::atomic<int64_t>> counter)
      : data_(std::make_unique<float[]>((bytes + 3) / 4)), size_(bytes), counter_(std::move(counter)) {
    *counter_ += int64_t(size_);
  }
  ~HostBuffer() override { *counter_ -= int64_t(size_); }
  void* data() override { return data_.get(); }
  size_t size() const override { return size_; }

 private:
  std::unique_ptr<float[]> data_;
  size_t size_;
  std::shared_ptr<std::atomic<int64_t>> counter_;
};

// "Key:   123 kB" line of a /proc file, in bytes; -1 when absent.
int64_t proc_kb_field(const char* path, const char* key) {
  std::ifstream f(path);
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') return std::stoll(line.substr(n + 1)) * 1024;
  return -1;
}

float* f32(const Mat& m) {
  SALA_CHECK(m.dtype == DType::F32, "cpu backend: expected an f32 matrix, got {}", dtype_name(m.dtype));
  return static_cast<float*>(m.data);
}

void check_same_shape(const Mat& a, const Mat& b, const char* op) {
  SALA_CHECK(a.rows == b.rows && a.cols == b.cols, "cpu {}: shape mismatch [{}, {}] vs [{}, {}]", op, a.rows, a.cols,
             b.rows, b.cols);
}

}  // namespace

CpuBackend::CpuBackend(int threads, bool batch_invariant) : pool_(threads), batch_invariant_(batch_invariant) {
#ifdef SALA_HAS_OPENBLAS
  // OpenBLAS brings its own threads for sgemm; keep it to the same count as our pool.
  openblas_set_num_threads(pool_.size());
#endif
}

std::unique_ptr<Buffer> CpuBackend::alloc(size_t bytes) { return std::make_unique<HostBuffer>(bytes, buffer_bytes_); }

void CpuBackend::reset_memory_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.close();
  if (!f.good())  // said, not hidden: the peak then also covers what came before
    std::fprintf(stderr, "warning: cannot reset the peak RSS (/proc/self/clear_refs); peaks include earlier use\n");
}

std::string CpuBackend::device_name() const {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return model + " (" + std::to_string(pool_.size()) + " threads)";
}

Backend::MemoryStats CpuBackend::memory_stats() {
  MemoryStats m;
  m.used = proc_kb_field("/proc/self/status", "VmRSS");
  m.peak = proc_kb_field("/proc/self/status", "VmHWM");
  m.total = proc_kb_field("/proc/meminfo", "MemTotal");
  const size_t cache_floats = k_.capacity() + v_.capacity() + k1_.capacity() + k2_.capacity() + states_.capacity();
  m.allocated = buffer_bytes_->load() + int64_t(cache_floats * sizeof(float));
  return m;
}

void CpuBackend::upload(Mat dst, const float* host) {
  convert_from_f32(host, dst.dtype, dst.data, size_t(dst.rows * dst.cols));
}

void CpuBackend::download(const Mat& src, float* host) {
  convert_to_f32(src.data, src.dtype, host, size_t(src.rows * src.cols));
}

Weight CpuBackend::load_weight(const TensorView& host) {
  SALA_CHECK(host.shape.size() == 2, "cpu: weight must be 2-D, got shape {}", shape_str(host.shape));
  SALA_CHECK(dtype_is_float(host.dtype), "cpu: weight dtype {} is not a float type", dtype_name(host.dtype));
  Weight w;
  w.storage = alloc(size_t(host.numel()) * 4);
  w.w = w.storage->mat(DType::F32, host.shape[0], host.shape[1]);
  convert_to_f32(host.data, host.dtype, f32(w.w), size_t(host.numel()));
  return w;
}

Weight CpuBackend::load_vector(const TensorView& host) {
  SALA_CHECK(host.shape.size() == 1, "cpu: norm weight must be 1-D, got shape {}", shape_str(host.shape));
  TensorView as_row = host;
  as_row.shape = {1, host.shape[0]};
  return load_weight(as_row);
}

Weight CpuBackend::random_weight(int64_t rows, int64_t cols, float mean, float std, uint64_t seed) {
  Weight w;
  w.storage = alloc(size_t(rows * cols) * 4);
  w.w = w.storage->mat(DType::F32, rows, cols);
  float* p = f32(w.w);
  pool_.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * cols; i < r1 * cols; ++i) p[i] = mean + std * normal01(seed, uint64_t(i));
  });
  return w;
}

// ---- caches ----

void CpuBackend::create_caches(const CacheSpec& spec) {
  spec_ = spec;
  const int bs = spec.block_size, st = spec.kernel_stride;
  k1_per_page_ = std::max(1, bs / st);
  k2_per_page_ = std::max(1, bs / (4 * st));
  const size_t row = size_t(spec.kv_heads) * spec.head_dim;
  const size_t pages = size_t(spec.sparse_layers) * spec.max_pages;
  // New vectors, not assign(): a smaller pool must give the old one's memory back.
  k_ = std::vector<float>(pages * bs * row, 0.f);
  v_ = std::vector<float>(pages * bs * row, 0.f);
  k1_ = std::vector<float>(pages * k1_per_page_ * row, 0.f);
  k2_ = std::vector<float>(pages * k2_per_page_ * row, 0.f);
  const size_t state = size_t(spec.lightning_heads) * spec.lightning_dim * spec.lightning_dim;
  states_ = std::vector<float>(size_t(spec.max_slots) * spec.lightning_layers * state, 0.f);
}

float* CpuBackend::state(int slot, int layer) {
  const size_t state = size_t(spec_.lightning_heads) * spec_.lightning_dim * spec_.lightning_dim;
  return states_.data() + (size_t(slot) * spec_.lightning_layers + layer) * state;
}

void CpuBackend::reset_state(int slot) {
  SALA_CHECK(slot >= 0 && slot < spec_.max_slots, "cpu: state slot {} out of range [0, {})", slot, spec_.max_slots);
  std::fill_n(state(slot, 0), size_t(spec_.lightning_layers) * spec_.lightning_heads * spec_.lightning_dim *
                                  spec_.lightning_dim, 0.f);
}

void CpuBackend::copy_state(int src_slot, int dst_slot) {
  SALA_CHECK(src_slot >= 0 && src_slot < spec_.max_slots && dst_slot >= 0 && dst_slot < spec_.max_slots,
             "cpu: state slots {} -> {} out of range", src_slot, dst_slot);
  std::copy_n(state(src_slot, 0),
              size_t(spec_.lightning_layers) * spec_.lightning_heads * spec_.lightning_dim * spec_.lightning_dim,
              state(dst_slot, 0));
}

static size_t page_index(const CacheSpec& s, int layer, int page) {
  SALA_CHECK(page >= 0 && page < s.max_pages, "cpu: page {} out of range [0, {})", page, s.max_pages);
  return size_t(layer) * s.max_pages + page;
}

float* CpuBackend::k_row(int layer, int page, int offset) {
  const size_t row = size_t(spec_.kv_heads) * spec_.head_dim;
  return k_.data() + (page_index(spec_, layer, page) * spec_.block_size + offset) * row;
}

float* CpuBackend::v_row(int layer, int page, int offset) {
  const size_t row = size_t(spec_.kv_heads) * spec_.head_dim;
  return v_.data() + (page_index(spec_, layer, page) * spec_.block_size + offset) * row;
}

// Compressed chunk c (stride s tokens) is stored in the page holding its first token.
static size_t chunk_slot(const CacheSpec& spec, int layer, int64_t chunk, int stride, int per_page,
                         const std::vector<int32_t>& pages) {
  const int64_t first = chunk * stride;
  const int64_t logical = first / spec.block_size;
  SALA_CHECK(logical < int64_t(pages.size()), "cpu: compressed chunk {} lies past the page table ({} pages)", chunk,
             pages.size());
  return page_index(spec, layer, pages[logical]) * per_page + (first % spec.block_size) / stride;
}

float* CpuBackend::k1_row(int layer, int64_t chunk, const std::vector<int32_t>& pages) {
  const size_t row = size_t(spec_.kv_heads) * spec_.head_dim;
  return k1_.data() + chunk_slot(spec_, layer, chunk, spec_.kernel_stride, k1_per_page_, pages) * row;
}

float* CpuBackend::k2_row(int layer, int64_t chunk, const std::vector<int32_t>& pages) {
  const size_t row = size_t(spec_.kv_heads) * spec_.head_dim;
  return k2_.data() + chunk_slot(spec_, layer, chunk, 4 * spec_.kernel_stride, k2_per_page_, pages) * row;
}

void CpuBackend::begin_batch(const BatchInfo& batch) {
  SALA_CHECK(batch.positions.size() == batch.tokens.size(), "batch: {} positions for {} tokens",
             batch.positions.size(), batch.tokens.size());
  for (const auto& s : batch.seqs) {
    const int64_t need = (s.cached + s.n_new + spec_.block_size - 1) / spec_.block_size;
    SALA_CHECK(spec_.sparse_layers == 0 || int64_t(s.pages.size()) >= need,
               "batch: sequence in slot {} has {} pages, needs {}", s.slot, s.pages.size(), need);
    SALA_CHECK(s.slot >= 0 && s.slot < std::max(spec_.max_slots, 1), "batch: slot {} out of range", s.slot);
  }
  batch_ = &batch;
}

// ---- ops ----

void CpuBackend::embed(const Weight& table, float scale, Mat out) {
  SALA_CHECK(batch_ && int64_t(batch_->tokens.size()) == out.rows, "cpu embed: batch has no {} tokens", out.rows);
  SALA_CHECK(!table.packed(), "cpu embed: the table is packed ({}); embeddings are loaded dense",
             weight_format_name(table.format));
  const float* t = f32(table.w);
  float* o = f32(out);
  for (int64_t r = 0; r < out.rows; ++r) {
    const int32_t id = batch_->tokens[size_t(r)];
    SALA_CHECK(id >= 0 && id < table.w.rows, "token id {} out of range [0, {})", id, table.w.rows);
    const float* src = t + size_t(id) * table.w.cols;
    for (int64_t c = 0; c < out.cols; ++c) o[r * out.cols + c] = src[c] * scale;
  }
}

void CpuBackend::matmul(const Mat& x, const Weight& w, Mat y) {
  SALA_CHECK(x.cols == w.in() && y.cols == w.out() && x.rows == y.rows,
             "cpu matmul: x [{}, {}] · Wᵀ [{}, {}] -> y [{}, {}]", x.rows, x.cols, w.out(), w.in(), y.rows, y.cols);
  if (x.rows == 0) return;
  if (w.packed()) return matmul_packed(x, w, y);
#ifdef SALA_HAS_OPENBLAS
  if (!batch_invariant_) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(x.rows), int(w.out()), int(w.in()), 1.0f, f32(x),
                int(x.cols), f32(w.w), int(w.in()), 0.0f, f32(y), int(y.cols));
    return;
  }
#endif
  // Batch-invariant (or built without OpenBLAS, which configure warned about): cpu::dot per
  // element, blocks of 16 output rows so that a block of W stays in cache across the batch rows.
  const float *a = f32(x), *b = f32(w.w);
  float* c = f32(y);
  const int64_t n = w.in();
  constexpr int64_t kBlock = 16;
  pool_.parallel_for((w.out() + kBlock - 1) / kBlock, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t o0 = blk * kBlock, o1 = std::min(w.out(), o0 + kBlock);
      for (int64_t r = 0; r < x.rows; ++r)
        for (int64_t o = o0; o < o1; ++o) c[r * y.cols + o] = cpu::dot(a + r * x.cols, b + o * n, n);
    }
  });
}

void CpuBackend::rmsnorm(const Mat& x, const Weight& w, float eps, Mat y) {
  check_same_shape(x, y, "rmsnorm");
  SALA_CHECK(w.w.cols == x.cols, "cpu rmsnorm: weight width {} != row width {}", w.w.cols, x.cols);
  const float* in = f32(x);
  const float* wt = f32(w.w);
  float* out = f32(y);
  const int64_t n = x.cols;
  pool_.parallel_for(x.rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* a = in + r * n;
      double ss = 0;
      for (int64_t c = 0; c < n; ++c) ss += double(a[c]) * a[c];
      const float inv = 1.0f / std::sqrt(float(ss / double(n)) + eps);
      float* o = out + r * n;
      for (int64_t c = 0; c < n; ++c) o[c] = a[c] * inv * wt[c];
    }
  });
}

void CpuBackend::rope(Mat x, int head_dim, double theta) {
  SALA_CHECK(batch_ && int64_t(batch_->positions.size()) == x.rows, "cpu rope: batch has no {} positions", x.rows);
  SALA_CHECK(x.cols % head_dim == 0 && head_dim % 2 == 0, "cpu rope: width {} vs head_dim {}", x.cols, head_dim);
  const int half = head_dim / 2;
  // inv_freq in fp32 exactly as the spec (§3.3): exponent (2i)/d in fp32, pow in fp32, reciprocal.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv_freq[size_t(i)] = 1.0f / std::pow(float(theta), float(2 * i) / float(head_dim));
  float* data = f32(x);
  const int64_t heads = x.cols / head_dim;
  pool_.parallel_for(x.rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int64_t r = r0; r < r1; ++r) {
      const float p = float(batch_->positions[size_t(r)]);
      for (int i = 0; i < half; ++i) {
        const float angle = p * inv_freq[size_t(i)];
        cs[size_t(i)] = std::cos(angle);
        sn[size_t(i)] = std::sin(angle);
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = data + r * x.cols + h * head_dim;
        for (int i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cs[size_t(i)] - b * sn[size_t(i)];
          v[i + half] = b * cs[size_t(i)] + a * sn[size_t(i)];
        }
      }
    }
  });
}

template <typename Fn>
static void elementwise(ThreadPool& pool, int64_t n, Fn fn) {
  pool.parallel_for((n + 4095) / 4096, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0 * 4096, e = std::min(n, b1 * 4096); i < e; ++i) fn(i);
  });
}

void CpuBackend::silu_mul(const Mat& g, const Mat& u, Mat out) {
  check_same_shape(g, u, "silu_mul");
  check_same_shape(g, out, "silu_mul");
  const float *a = f32(g), *b = f32(u);
  float* o = f32(out);
  elementwise(pool_, g.rows * g.cols, [&](int64_t i) { o[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i]; });
}

void CpuBackend::sigmoid_mul(const Mat& a, const Mat& z, Mat out) {
  check_same_shape(a, z, "sigmoid_mul");
  check_same_shape(a, out, "sigmoid_mul");
  const float *x = f32(a), *g = f32(z);
  float* o = f32(out);
  elementwise(pool_, a.rows * a.cols, [&](int64_t i) { o[i] = x[i] / (1.0f + std::exp(-g[i])); });
}

void CpuBackend::add_scaled(Mat h, const Mat& a, float alpha) {
  check_same_shape(h, a, "add_scaled");
  float* o = f32(h);
  const float* x = f32(a);
  elementwise(pool_, h.rows * h.cols, [&](int64_t i) { o[i] += alpha * x[i]; });
}

void CpuBackend::scale(const Mat& x, float s, Mat out) {
  check_same_shape(x, out, "scale");
  const float* a = f32(x);
  float* o = f32(out);
  elementwise(pool_, x.rows * x.cols, [&](int64_t i) { o[i] = a[i] * s; });
}

void CpuBackend::gather_rows(const Mat& x, std::span<const int64_t> rows, Mat out) {
  SALA_CHECK(out.rows == int64_t(rows.size()) && out.cols == x.cols, "cpu gather_rows: shape mismatch");
  const float* a = f32(x);
  float* o = f32(out);
  for (size_t r = 0; r < rows.size(); ++r) {
    SALA_CHECK(rows[r] >= 0 && rows[r] < x.rows, "cpu gather_rows: row {} out of range", rows[r]);
    std::memcpy(o + r * x.cols, a + rows[r] * x.cols, size_t(x.cols) * 4);
  }
}

}  // namespace sala
