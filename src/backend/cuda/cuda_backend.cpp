// CUDA backend: memory, weights, caches, batch metadata and the op dispatch (kernels in *.cu).
#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/sparse_select.h"
#include "backend/cuda/cuda_check.h"
#include "backend/decode_splits.h"
#include "core/error.h"

namespace sala {

namespace cuda {

[[noreturn]] void cuda_fail(const char* call, cudaError_t err, const char* file, int line) {
  fail("CUDA error: {} failed: {} ({}) at {}:{}", call, cudaGetErrorString(err), cudaGetErrorName(err), file, line);
}
[[noreturn]] void cublas_fail(const char* call, int status, const char* file, int line) {
  fail("cuBLAS error: {} failed with status {} at {}:{}", call, status, file, line);
}
[[noreturn]] void cuda_fail_msg(const char* msg, const char* file, int line) {
  fail("CUDA backend: {} ({}:{})", msg, file, line);
}

}  // namespace cuda

#define SALA_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                             \
    cublasStatus_t st_ = (call);                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS) ::sala::cuda::cublas_fail(#call, int(st_), __FILE__, __LINE__); \
  } while (0)

namespace {

using cuda::Dt;

class DeviceBuffer final : public Buffer {
 public:
  explicit DeviceBuffer(size_t bytes) : size_(bytes) {
    if (bytes) SALA_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  ~DeviceBuffer() override {
    if (ptr_) cudaFree(ptr_);
  }
  void* data() override { return ptr_; }
  size_t size() const override { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_;
};

Dt dt_of(DType t, const char* op) {
  switch (t) {
    case DType::F32: return cuda::kF32;
    case DType::BF16: return cuda::kBF16;
    case DType::F16: return cuda::kF16;
    default: fail("cuda {}: unsupported matrix dtype {}", op, dtype_name(t));
  }
}

void same_shape(const Mat& a, const Mat& b, const char* op) {
  SALA_CHECK(a.rows == b.rows && a.cols == b.cols, "cuda {}: shape mismatch [{}, {}] vs [{}, {}]", op, a.rows, a.cols,
             b.rows, b.cols);
}

constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

// ---- helpers ----

DeviceArena::~DeviceArena() { release(); }
void DeviceArena::release() {
  if (ptr_) cudaFree(ptr_);
  ptr_ = nullptr;
  cap_ = 0;
}
void* DeviceArena::reserve(size_t bytes) {
  if (bytes <= cap_ && ptr_) return ptr_;
  // Growth: the stream may still use the old buffer.
  SALA_CUDA_CHECK(cudaDeviceSynchronize());
  release();
  const size_t cap = std::max<size_t>(align256(bytes + bytes / 4), 4096);
  SALA_CUDA_CHECK(cudaMalloc(&ptr_, cap));
  cap_ = cap;
  return ptr_;
}

HostStage::~HostStage() {
  if (event_) cudaEventSynchronize(event_), cudaEventDestroy(event_);
  if (ptr_) cudaFreeHost(ptr_);
}
void* HostStage::get(size_t bytes) {
  if (!event_) SALA_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  if (pending_) SALA_CUDA_CHECK(cudaEventSynchronize(event_));
  pending_ = false;
  if (bytes > cap_) {
    if (ptr_) SALA_CUDA_CHECK(cudaFreeHost(ptr_));
    ptr_ = nullptr;
    const size_t cap = std::max<size_t>(align256(bytes + bytes / 4), 4096);
    SALA_CUDA_CHECK(cudaMallocHost(&ptr_, cap));
    cap_ = cap;
  }
  return ptr_;
}
void HostStage::copied(cudaStream_t stream) {
  SALA_CUDA_CHECK(cudaEventRecord(event_, stream));
  pending_ = true;
}

// ---- construction ----

CudaBackend::CudaBackend(int device, bool batch_invariant) : device_(device), batch_invariant_(batch_invariant) {
  SALA_CUDA_CHECK(cudaSetDevice(device));
  SALA_CUDA_CHECK(cudaGetDeviceProperties(&props_, device));
  SALA_CHECK(props_.major >= 8, "cuda backend: device {} ({}) has compute capability {}.{}; sm_80 or newer is required",
             device, props_.name, props_.major, props_.minor);
  SALA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  SALA_CUBLAS_CHECK(cublasCreate(&cublas_));
  SALA_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  SALA_CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspace));
  SALA_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_, kCublasWorkspace));
  SALA_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  // SALA_CUDA_PDL=0 turns programmatic dependent launch off (A/B measurements).
  if (const char* e = std::getenv("SALA_CUDA_PDL")) pdl_ = std::string(e) != "0";
  // SALA_CUDA_GRAPHS=0 runs decode forwards eagerly (no CUDA graphs).
  if (const char* e = std::getenv("SALA_CUDA_GRAPHS")) graphs_ = std::string(e) != "0";
  // SALA_CUDA_MIXER_FUSION=0 keeps the lightning q/k norms and the sparse output gate launches of
  // their own (A/B measurements).
  if (const char* e = std::getenv("SALA_CUDA_MIXER_FUSION")) mixer_fusion_ = std::string(e) != "0";
  SALA_CUDA_CHECK(cudaEventCreate(&ev_start_));
  SALA_CUDA_CHECK(cudaEventCreate(&ev_end_));
}

CudaBackend::~CudaBackend() {
  if (capturing_) abort_capture();
  cudaStreamSynchronize(stream_);
  clear_graphs();
  if (ev_start_) cudaEventDestroy(ev_start_);
  if (ev_end_) cudaEventDestroy(ev_end_);
  for (void* p : {k_, v_, k1_, k2_, static_cast<void*>(states_), static_cast<void*>(log_decay_)})
    if (p) cudaFree(p);
  if (cublas_) cublasDestroy(cublas_);
  if (cublas_lt_) cublasLtDestroy(cublas_lt_);
  if (cublas_ws_) cudaFree(cublas_ws_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::device_name() const { return props_.name; }

std::unique_ptr<Buffer> CudaBackend::alloc(size_t bytes) { return std::make_unique<DeviceBuffer>(bytes); }

void CudaBackend::synchronize() { SALA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaBackend::upload(Mat dst, const float* host) {
  const size_t n = size_t(dst.rows * dst.cols);
  if (n == 0) return;
  std::vector<uint8_t> tmp(n * dtype_size(dst.dtype));
  convert_from_f32(host, dst.dtype, tmp.data(), n);
  SALA_CUDA_CHECK(cudaMemcpyAsync(dst.data, tmp.data(), tmp.size(), cudaMemcpyHostToDevice, stream_));
  SALA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::download(const Mat& src, float* host) {
  const size_t n = size_t(src.rows * src.cols);
  if (n == 0) return;
  if (src.dtype == DType::F32) {
    SALA_CUDA_CHECK(cudaMemcpyAsync(host, src.data, n * 4, cudaMemcpyDeviceToHost, stream_));
    SALA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  std::vector<uint8_t> tmp(n * dtype_size(src.dtype));
  SALA_CUDA_CHECK(cudaMemcpyAsync(tmp.data(), src.data, tmp.size(), cudaMemcpyDeviceToHost, stream_));
  SALA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  convert_to_f32(tmp.data(), src.dtype, host, n);
}

Weight CudaBackend::load_weight(const TensorView& host) {
  SALA_CHECK(host.shape.size() == 2, "cuda: weight must be 2-D, got shape {}", shape_str(host.shape));
  SALA_CHECK(dtype_is_float(host.dtype), "cuda: weight dtype {} is not a float type", dtype_name(host.dtype));
  Weight w;
  const size_t n = size_t(host.numel());
  w.storage = alloc(n * 2);
  w.w = w.storage->mat(DType::BF16, host.shape[0], host.shape[1]);
  if (host.dtype == DType::BF16) {
    SALA_CUDA_CHECK(cudaMemcpyAsync(w.w.data, host.data, n * 2, cudaMemcpyHostToDevice, stream_));
  } else {
    // Convert in pieces of 1M values through f32 to bf16 (round to nearest even).
    constexpr size_t piece = size_t(1) << 20;
    std::vector<float> f(std::min(n, piece));
    std::vector<uint16_t> b(std::min(n, piece));
    const auto* src = static_cast<const uint8_t*>(host.data);
    for (size_t i = 0; i < n; i += piece) {
      const size_t m = std::min(piece, n - i);
      convert_to_f32(src + i * dtype_size(host.dtype), host.dtype, f.data(), m);
      for (size_t j = 0; j < m; ++j) b[j] = f32_to_bf16(f[j]);
      SALA_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint16_t*>(w.w.data) + i, b.data(), m * 2, cudaMemcpyHostToDevice,
                                      stream_));
      SALA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
  }
  SALA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return w;
}

Weight CudaBackend::load_vector(const TensorView& host) {
  SALA_CHECK(host.shape.size() == 1, "cuda: norm weight must be 1-D, got shape {}", shape_str(host.shape));
  TensorView as_row = host;
  as_row.shape = {1, host.shape[0]};
  return load_weight(as_row);  // norms stay bf16, as in the reference
}

Weight CudaBackend::random_weight(int64_t rows, int64_t cols, float mean, float std, uint64_t seed) {
  Weight w;
  w.storage = alloc(size_t(rows * cols) * 2);
  w.w = w.storage->mat(DType::BF16, rows, cols);
  cuda::launch_random_bf16(w.w.data, rows * cols, mean, std, seed, stream_);
  SALA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return w;
}

// ---- caches ----

void CudaBackend::create_caches(const CacheSpec& spec) {
  if (capturing_) abort_capture();
  synchronize();
  clear_graphs();
  for (void** p : {&k_, &v_, &k1_, &k2_, reinterpret_cast<void**>(&states_), reinterpret_cast<void**>(&log_decay_)})
    if (*p) {
      SALA_CUDA_CHECK(cudaFree(*p));
      *p = nullptr;
    }
  spec_ = spec;
  caches_ = true;
  const int bs = spec.block_size, st = spec.kernel_stride;
  k1pp_ = std::max(1, bs / st);
  k2pp_ = std::max(1, bs / (4 * st));
  if (spec.sparse_layers > 0) {
    SALA_CHECK(spec.head_dim == 16 || spec.head_dim == 32 || spec.head_dim == 64 || spec.head_dim == 128,
               "cuda: sparse head_dim {} unsupported (16, 32, 64, 128)", spec.head_dim);
    SALA_CHECK(spec.kv_heads > 0 && spec.q_heads % spec.kv_heads == 0, "cuda: {} q heads vs {} kv heads", spec.q_heads,
               spec.kv_heads);
    const int G = spec.q_heads / spec.kv_heads;
    SALA_CHECK(G <= 16 || G % 16 == 0, "cuda: group size {} unsupported (≤ 16 or a multiple of 16)", G);
    SALA_CHECK(spec.max_pages > 0 && bs > 0 && st > 0, "cuda: cache geometry: pages {}, block {}, stride {}",
               spec.max_pages, bs, st);
    const size_t row = size_t(spec.kv_heads) * spec.head_dim;
    const size_t pages = size_t(spec.sparse_layers) * spec.max_pages;
    SALA_CUDA_CHECK(cudaMalloc(&k_, pages * bs * row * 2));
    SALA_CUDA_CHECK(cudaMalloc(&v_, pages * bs * row * 2));
    SALA_CUDA_CHECK(cudaMalloc(&k1_, pages * k1pp_ * row * 2));
    SALA_CUDA_CHECK(cudaMalloc(&k2_, pages * k2pp_ * row * 2));
    SALA_CUDA_CHECK(cudaMemsetAsync(k_, 0, pages * bs * row * 2, stream_));
    SALA_CUDA_CHECK(cudaMemsetAsync(v_, 0, pages * bs * row * 2, stream_));
    SALA_CUDA_CHECK(cudaMemsetAsync(k1_, 0, pages * k1pp_ * row * 2, stream_));
    SALA_CUDA_CHECK(cudaMemsetAsync(k2_, 0, pages * k2pp_ * row * 2, stream_));
  }
  state_floats_ = size_t(spec.lightning_heads) * spec.lightning_dim * spec.lightning_dim;
  if (spec.lightning_layers > 0 && spec.max_slots > 0) {
    const int d = spec.lightning_dim;
    SALA_CHECK(d == 16 || d == 32 || d == 64 || d == 128, "cuda: lightning head dim {} unsupported (16, 32, 64, 128)", d);
    SALA_CHECK(int(spec.log_decay.size()) == spec.lightning_heads, "cuda: {} log-decays for {} lightning heads",
               spec.log_decay.size(), spec.lightning_heads);
    const size_t bytes = size_t(spec.max_slots) * spec.lightning_layers * state_floats_ * 4;
    SALA_CUDA_CHECK(cudaMalloc(&states_, bytes));
    SALA_CUDA_CHECK(cudaMemsetAsync(states_, 0, bytes, stream_));
    SALA_CUDA_CHECK(cudaMalloc(&log_decay_, spec.log_decay.size() * 4));
    SALA_CUDA_CHECK(cudaMemcpyAsync(log_decay_, spec.log_decay.data(), spec.log_decay.size() * 4,
                                    cudaMemcpyHostToDevice, stream_));
  }
  synchronize();
}

void CudaBackend::reset_state(int slot) {
  SALA_CHECK(slot >= 0 && slot < spec_.max_slots, "cuda: state slot {} out of range [0, {})", slot, spec_.max_slots);
  if (!states_) return;
  const size_t per_slot = size_t(spec_.lightning_layers) * state_floats_;
  SALA_CUDA_CHECK(cudaMemsetAsync(states_ + slot * per_slot, 0, per_slot * 4, stream_));
}

void CudaBackend::copy_state(int src_slot, int dst_slot) {
  SALA_CHECK(src_slot >= 0 && src_slot < spec_.max_slots && dst_slot >= 0 && dst_slot < spec_.max_slots,
             "cuda: state slots {} -> {} out of range", src_slot, dst_slot);
  if (!states_ || src_slot == dst_slot) return;
  const size_t per_slot = size_t(spec_.lightning_layers) * state_floats_;
  SALA_CUDA_CHECK(cudaMemcpyAsync(states_ + dst_slot * per_slot, states_ + src_slot * per_slot, per_slot * 4,
                                  cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::download_state(int slot, int layer, float* host) {
  SALA_CHECK(states_ && slot >= 0 && slot < spec_.max_slots && layer >= 0 && layer < spec_.lightning_layers,
             "cuda: no state slot {} layer {}", slot, layer);
  SALA_CUDA_CHECK(cudaMemcpyAsync(host, states_ + (size_t(slot) * spec_.lightning_layers + layer) * state_floats_,
                                  state_floats_ * 4, cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

std::vector<int32_t> CudaBackend::debug_selection() {
  const size_t n = size_t(n_sel_) * spec_.kv_heads * (spec_.topk + spec_.local_blocks);
  std::vector<int32_t> out(n);
  synchronize();
  if (n) SALA_CUDA_CHECK(cudaMemcpy(out.data(), sel_.data(), n * 4, cudaMemcpyDeviceToHost));
  return out;
}

std::vector<float> CudaBackend::debug_pool(int which) {
  SALA_CHECK(k_ && which >= 0 && which < 4, "cuda debug_pool: no pool {}", which);
  const size_t row = size_t(spec_.kv_heads) * spec_.head_dim;
  const size_t per_page = which < 2 ? size_t(spec_.block_size) : which == 2 ? size_t(k1pp_) : size_t(k2pp_);
  const size_t n = size_t(spec_.sparse_layers) * spec_.max_pages * per_page * row;
  std::vector<uint16_t> raw(n);
  void* src = which == 0 ? k_ : which == 1 ? v_ : which == 2 ? k1_ : k2_;
  synchronize();
  SALA_CUDA_CHECK(cudaMemcpy(raw.data(), src, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  convert_to_f32(raw.data(), DType::BF16, out.data(), n);
  return out;
}

void CudaBackend::debug_fill_pools_random(uint64_t seed) {
  SALA_CHECK(k_, "cuda debug_fill_pools_random: no sparse caches");
  const size_t row = size_t(spec_.kv_heads) * spec_.head_dim;
  const size_t pages = size_t(spec_.sparse_layers) * spec_.max_pages;
  const size_t per_page[4] = {size_t(spec_.block_size), size_t(spec_.block_size), size_t(k1pp_), size_t(k2pp_)};
  void* pools[4] = {k_, v_, k1_, k2_};
  for (int i = 0; i < 4; ++i)
    cuda::launch_random_bf16(pools[i], int64_t(pages * per_page[i] * row), 0.f, 1.f, seed + uint64_t(i), stream_);
  synchronize();
}

// ---- batch metadata ----

// The selection's scoring reads every K1/K2 row of the context once per (token, KV head): at 1M
// tokens 20 MB per head. One CTA per (token, head) is right for prefill (thousands of CTAs) but
// leaves decode on 2·B SMs, latency-bound; there the rows are split over S CTAs (a power of two,
// so that CUDA graphs re-capture only when S changes, each warp keeping ≥ 1 tile).
int CudaBackend::choose_select_splits(const std::vector<cuda::SelItem>& items) const {
  if (select_splits_knob_ >= 1) return select_splits_knob_;
  if (batch_invariant_) return 1;  // the fused kernel: each token's scores independent of its group
  const int64_t units = int64_t(items.size()) * spec_.kv_heads;
  const int sms = props_.multiProcessorCount;
  int64_t max_tiles = 0;
  for (const cuda::SelItem& it : items) max_tiles = std::max<int64_t>(max_tiles, (it.ncol + 31) / 32);
  constexpr int64_t kWarpsPerCta = 8;
  if (units == 0 || units >= sms || max_tiles <= 2 * kWarpsPerCta) return 1;
  // One CTA per SM and unit: measured per sparse layer at batch 1 (H200, 2026-11-25, random pools):
  // 1M 125.8 µs with 128 splits, 103.4 with 64; 512K 102.7 / 80.5; 128K 87.3 (128) / 59.2 (32).
  const int64_t want = std::min<int64_t>(sms / units, max_tiles / kWarpsPerCta);
  int s = 1;
  while (2 * s <= want) s *= 2;
  return s;
}

void CudaBackend::begin_batch(const BatchInfo& batch) {
  SALA_CHECK(batch.positions.size() == batch.tokens.size(), "batch: {} positions for {} tokens",
             batch.positions.size(), batch.tokens.size());
  if (capturing_) abort_capture();  // a forward threw while being captured
  collect_timing();
  batch_ready_ = false;
  cuda::set_small_kernel_pdl(pdl_ && props_.major >= 9);  // the knob, for this batch's small kernels
  const int64_t N = batch.n_tokens();
  n_tokens_ = N;
  tokens_host_ = batch.tokens;
  const bool sparse_caches = caches_ && spec_.sparse_layers > 0;
  const int bs = spec_.block_size;

  std::vector<cuda::SeqMeta> seqs;
  std::vector<int32_t> pages, rec_list, chunk_list, combine;
  std::vector<int64_t> row_dst;
  std::vector<cuda::CompressJob> jobs;
  std::vector<cuda::SelItem> sel_items;
  std::vector<cuda::AttnItem> items, dense_items;
  std::vector<int32_t> row_seen(size_t(N), 0);
  seqs.reserve(batch.seqs.size());
  if (sparse_caches) row_dst.assign(size_t(N), 0);

  const sparse::BlockGeometry geo = sparse::BlockGeometry::from(spec_);
  const int kvh = std::max(spec_.kv_heads, 1);
  const int G = sparse_caches ? spec_.q_heads / kvh : 1;
  const int nheads = G <= 16 ? G : 16, subblocks = G <= 16 ? 1 : G / 16;
  const int tpu = G <= 16 && !batch_invariant_ ? 16 / G : 1;  // tokens per 16-row attention unit
  int64_t cs_total = 0, keys_total = 0, max_blocks = 0;

  for (size_t si = 0; si < batch.seqs.size(); ++si) {
    const SeqEntry& e = batch.seqs[si];
    SALA_CHECK(e.start >= 0 && e.n_new >= 0 && e.cached >= 0 && e.start + e.n_new <= N,
               "batch: sequence {} rows [{}, {}) outside the batch of {}", si, e.start, e.start + e.n_new, N);
    SALA_CHECK(e.slot >= 0 && e.slot < std::max(spec_.max_slots, 1), "batch: slot {} out of range", e.slot);
    const int64_t T = e.cached + e.n_new;
    SALA_CHECK(T < (int64_t(1) << 31), "batch: sequence length {} too long", T);
    cuda::SeqMeta m{};
    m.slot = e.slot;
    m.start = int32_t(e.start);
    m.n_new = int32_t(e.n_new);
    m.cached = int32_t(e.cached);
    m.sparse = e.sparse ? 1 : 0;
    m.page_off = int32_t(pages.size());
    m.n_pages = int32_t(e.pages.size());
    seqs.push_back(m);
    pages.insert(pages.end(), e.pages.begin(), e.pages.end());
    for (int64_t t = 0; t < e.n_new; ++t) {
      SALA_CHECK(!row_seen[size_t(e.start + t)], "batch: row {} belongs to two sequences", e.start + t);
      row_seen[size_t(e.start + t)] = 1;
    }
    if (e.n_new > 0) (e.n_new < 64 ? rec_list : chunk_list).push_back(int32_t(si));
    if (!sparse_caches || e.n_new == 0) continue;

    const int64_t need = (T + bs - 1) / bs;
    SALA_CHECK(int64_t(e.pages.size()) >= need, "batch: sequence in slot {} has {} pages, needs {}", e.slot,
               e.pages.size(), need);
    for (int64_t i = 0; i < need; ++i)
      SALA_CHECK(e.pages[size_t(i)] >= 0 && e.pages[size_t(i)] < spec_.max_pages, "batch: page {} out of range [0, {})",
                 e.pages[size_t(i)], spec_.max_pages);
    SALA_CHECK(geo.n_blocks(T) <= 65536, "batch: {} blocks exceed the selection key range", geo.n_blocks(T));
    for (int64_t t = 0; t < e.n_new; ++t) {
      const int64_t p = e.cached + t;
      row_dst[size_t(e.start + t)] = int64_t(e.pages[size_t(p / bs)]) * bs + p % bs;
    }
    // Compressed chunks completed by this call.
    const int ks = spec_.kernel_size, st = spec_.kernel_stride;
    for (int level = 1; level <= 2; ++level) {
      const int win = level == 1 ? ks : 4 * ks, str = level == 1 ? st : 4 * st, pp = level == 1 ? k1pp_ : k2pp_;
      for (int64_t c = sparse::n_chunks(e.cached, win, str); c < sparse::n_chunks(T, win, str); ++c) {
        const int64_t first = c * str;
        jobs.push_back({int32_t(si), int32_t(first), win, level,
                        int64_t(e.pages[size_t(first / bs)]) * pp + (first % bs) / str});
      }
    }
    // Attention items: dense-like rows (all past blocks) first, grouped by tpu tokens; then one
    // item per row that needs selection.
    const int64_t K = geo.budget(T);
    int64_t t_sel = e.n_new;
    if (e.sparse)
      for (int64_t t = 0; t < e.n_new; ++t)
        if ((e.cached + t) / bs + 1 > K) {
          t_sel = t;
          break;
        }
    if (t_sel >= 16) {
      // Prefill-like: CTAs of 4 warps × tpu tokens sharing each K/V tile.
      for (int64_t t0 = 0; t0 < t_sel; t0 += 4 * tpu) {
        const int64_t nt = std::min<int64_t>(4 * tpu, t_sel - t0);
        const int64_t pend = e.cached + t0 + nt;
        for (int h = 0; h < kvh; ++h)
          for (int sb = 0; sb < subblocks; ++sb)
            dense_items.push_back({int32_t(si), int32_t(e.start + t0), int32_t(nt), h, h * G + sb * 16, nheads,
                                   int32_t((pend + 31) / 32), 0, 0, 1, -1, -1, tpu});
      }
    } else {
      // Decode-like: one 16-row unit per warp-group item, split along the keys below.
      for (int64_t t0 = 0; t0 < t_sel; t0 += tpu) {
        const int64_t nt = std::min<int64_t>(tpu, t_sel - t0);
        const int64_t pend = e.cached + t0 + nt;
        for (int h = 0; h < kvh; ++h)
          for (int sb = 0; sb < subblocks; ++sb)
            items.push_back({int32_t(si), int32_t(e.start + t0), int32_t(nt), h, h * G + sb * 16, nheads,
                             int32_t((pend + 31) / 32), 0, 0, 1, -1, -1, tpu});
      }
    }
    const int32_t first_sel = int32_t(sel_items.size());
    for (int64_t t = t_sel; t < e.n_new; ++t) {
      const int64_t p = e.cached + t, qb = p / bs;
      cuda::SelItem s{};
      s.seq = int32_t(si);
      s.row = int32_t(e.start + t);
      s.p = int32_t(p);
      s.T = int32_t(T);
      s.ncol = int32_t(std::min(geo.n1(p + 1), geo.scored_columns(qb)));
      s.vis2 = int32_t(geo.n2(p + 1));
      s.nsel = int32_t(K);
      s.cs_off = cs_total;
      s.key_off = keys_total;
      cs_total += int64_t(kvh) * s.ncol;
      keys_total += int64_t(kvh) * (qb + 1);
      sel_items.push_back(s);
    }
    const int64_t n_sparse = e.n_new - t_sel;
    // Shared tiles pay off while the 4 tokens' union of blocks stays small; with uncorrelated
    // selections (random data) the union grows with the context and per-warp items win beyond
    // ~2·K blocks (measured, docs/cuda-backend.md). Knob: set_sparse_shared_max_blocks.
    const int64_t shared_max = sparse_shared_max_blocks_ >= 0 ? sparse_shared_max_blocks_ : 2 * K;
    if (!batch_invariant_ && n_sparse >= 4 && geo.n_blocks(T) <= std::min<int64_t>(shared_max, 40000)) {
      // Prefill-like: 4 consecutive tokens per CTA (one per warp) over the union of their blocks.
      max_blocks = std::max(max_blocks, geo.n_blocks(T));
      for (int64_t t0 = t_sel; t0 < e.n_new; t0 += 4) {
        const int64_t nt = std::min<int64_t>(4, e.n_new - t0);
        for (int h = 0; h < kvh; ++h)
          for (int sb = 0; sb < subblocks; ++sb)
            dense_items.push_back({int32_t(si), int32_t(e.start + t0), int32_t(nt), h, h * G + sb * 16, nheads,
                                   int32_t(K), 1, 0, 1, -1, first_sel + int32_t(t0 - t_sel), 1});
      }
    } else {
      for (int64_t t = t_sel; t < e.n_new; ++t)
        for (int h = 0; h < kvh; ++h)
          for (int sb = 0; sb < subblocks; ++sb)
            items.push_back({int32_t(si), int32_t(e.start + t), 1, h, h * G + sb * 16, nheads, int32_t(K), 1, 0, 1,
                             -1, first_sel + int32_t(t - t_sel), 1});
    }
  }
  rows_covered_ = std::all_of(row_seen.begin(), row_seen.end(), [](int32_t x) { return x != 0; });

  // Split small item counts (decode) along their key chunks so the grid fills the GPU.
  int64_t partial_slots = 0;
  if (!items.empty()) {
    // Ask for two CTAs per SM (decode_splits.h: at least 4 chunks per split, at most 64, none
    // empty). 4K batch 1: 32 CTAs reading 128 KB each waited ~6 µs for their tiles; 64 CTAs, int4
    // g128 + lm_head −0.03 ms per step together with attention.cu's late trigger; batch 8: an empty
    // 17th split per unit had cost int4 +0.05 ms of device time per step, a third wave of one-per-SM
    // CTAs (bench/results/2026-11-27-h100-attention-split.md); without it, within 0.00–0.06 ms of
    // the rule before (2026-11-27-h100-decode-bound.md).
    // Batch-invariant: the split count from the unit's own keys alone.
    const int64_t target = int64_t(props_.multiProcessorCount) * 2;
    const int64_t units = int64_t(items.size());
    if (units < target || batch_invariant_) {
      std::vector<cuda::AttnItem> split;
      for (const auto& u : items) {
        const int64_t fill = batch_invariant_ ? kMaxDecodeSplits : (target + units - 1) / units;
        const int ns = decode_attention_splits(u.nchunks, fill);
        if (ns == 1) {
          split.push_back(u);
          continue;
        }
        combine.push_back(int32_t(split.size()));
        for (int s = 0; s < ns; ++s) {
          cuda::AttnItem x = u;
          x.split = s;
          x.nsplit = ns;
          x.part = int32_t(partial_slots);
          split.push_back(x);
        }
        partial_slots += ns;
      }
      items.swap(split);
    }
  }

  // Token groups of the fused selection: up to kSelectGroupTokens consecutive items of one sequence
  // share a CTA, so that its K1/K2 tiles are read once for all of them (select.cu).
  std::vector<int32_t> sel_groups;
  for (size_t i = 0; i < sel_items.size(); ++i)
    if (sel_groups.empty() || int64_t(i) - sel_groups.back() == cuda::kSelectGroupTokens ||
        sel_items[i].seq != sel_items[size_t(sel_groups.back())].seq)
      sel_groups.push_back(int32_t(i));
  sel_groups.push_back(int32_t(sel_items.size()));

  // One upload of everything.
  size_t off = 0;
  auto place = [&](size_t bytes) {
    const size_t o = off;
    off += align256(bytes);
    return o;
  };
  const size_t o_tok = place(size_t(N) * 4), o_pos = place(size_t(N) * 4);
  const size_t o_seq = place(seqs.size() * sizeof(cuda::SeqMeta)), o_pages = place(pages.size() * 4);
  const size_t o_rd = place(row_dst.size() * 8), o_rec = place(rec_list.size() * 4);
  const size_t o_chk = place(chunk_list.size() * 4), o_jobs = place(jobs.size() * sizeof(cuda::CompressJob));
  const size_t o_sel = place(sel_items.size() * sizeof(cuda::SelItem)), o_grp = place(sel_groups.size() * 4);
  const size_t o_items = place(items.size() * sizeof(cuda::AttnItem)), o_comb = place(combine.size() * 4);
  const size_t o_dense = place(dense_items.size() * sizeof(cuda::AttnItem));
  const size_t total = std::max<size_t>(off, 256);
  HostStage& stage = stage_[stage_i_];
  stage_i_ ^= 1;
  auto* h = static_cast<uint8_t*>(stage.get(total));
  auto put = [&](size_t o, const void* src, size_t bytes) {
    if (bytes) std::memcpy(h + o, src, bytes);
  };
  put(o_tok, batch.tokens.data(), size_t(N) * 4);
  put(o_pos, batch.positions.data(), size_t(N) * 4);
  put(o_seq, seqs.data(), seqs.size() * sizeof(cuda::SeqMeta));
  put(o_pages, pages.data(), pages.size() * 4);
  put(o_rd, row_dst.data(), row_dst.size() * 8);
  put(o_rec, rec_list.data(), rec_list.size() * 4);
  put(o_chk, chunk_list.data(), chunk_list.size() * 4);
  put(o_jobs, jobs.data(), jobs.size() * sizeof(cuda::CompressJob));
  put(o_sel, sel_items.data(), sel_items.size() * sizeof(cuda::SelItem));
  put(o_grp, sel_groups.data(), sel_groups.size() * 4);
  put(o_items, items.data(), items.size() * sizeof(cuda::AttnItem));
  put(o_comb, combine.data(), combine.size() * 4);
  put(o_dense, dense_items.data(), dense_items.size() * sizeof(cuda::AttnItem));
  auto* d = static_cast<uint8_t*>(meta_.reserve(total));
  SALA_CUDA_CHECK(cudaMemcpyAsync(d, h, off, cudaMemcpyHostToDevice, stream_));
  stage.copied(stream_);
  d_tokens_ = reinterpret_cast<int32_t*>(d + o_tok);
  d_positions_ = reinterpret_cast<int32_t*>(d + o_pos);
  d_seqs_ = reinterpret_cast<cuda::SeqMeta*>(d + o_seq);
  d_pages_ = reinterpret_cast<int32_t*>(d + o_pages);
  d_row_dst_ = reinterpret_cast<int64_t*>(d + o_rd);
  d_rec_list_ = reinterpret_cast<int32_t*>(d + o_rec);
  d_chunk_list_ = reinterpret_cast<int32_t*>(d + o_chk);
  d_jobs_ = reinterpret_cast<cuda::CompressJob*>(d + o_jobs);
  d_sel_items_ = reinterpret_cast<cuda::SelItem*>(d + o_sel);
  d_sel_groups_ = reinterpret_cast<int32_t*>(d + o_grp);
  n_sel_groups_ = int(sel_groups.size()) - 1;
  d_items_ = reinterpret_cast<cuda::AttnItem*>(d + o_items);
  d_combine_ = reinterpret_cast<int32_t*>(d + o_comb);
  d_dense_items_ = reinterpret_cast<cuda::AttnItem*>(d + o_dense);
  n_dense_items_ = int(dense_items.size());
  max_blocks_ = int32_t(max_blocks);
  n_seqs_ = int(seqs.size());
  n_rec_ = int(rec_list.size());
  n_chunked_ = int(chunk_list.size());
  n_jobs_ = int(jobs.size());
  n_sel_ = int(sel_items.size());
  sel_splits_ = choose_select_splits(sel_items);
  // Token groups of ≥ 2 tokens on average (prefill chunks): the warp-per-token scoring kernel. Not
  // in the batch-invariant mode (a token's scores must not depend on whether it shares a CTA), nor
  // with the selection shape forced (set_select_splits: tests of the fused and split kernels).
  sel_prefill_ = select_splits_knob_ < 1 && !batch_invariant_ && sel_splits_ == 1 &&
                 int64_t(sel_items.size()) >= 2 * int64_t(sel_groups.size() - 1);
  n_items_ = int(items.size());
  n_combine_ = int(combine.size());
  sel_items_host_ = std::move(sel_items);

  // Scratch for the sparse layers (grow only).
  if (sparse_caches) {
    const int kmax = spec_.topk + spec_.local_blocks;
    sel_.reserve(std::max<size_t>(size_t(n_sel_) * kvh * std::max(kmax, 1) * 4, 256));
    scores_.reserve(std::max<size_t>(size_t(cs_total) * 4, 256));
    keys_.reserve(std::max<size_t>(size_t(keys_total) * 4, 256));
    if (sel_splits_ > 1)
      cand_.reserve(std::max<size_t>(size_t(n_sel_) * kvh * cuda::kSelectPoolCtas * std::max(kmax, 1) * 4, 256));
    sel_ml_.reserve(std::max<size_t>(size_t(n_sel_) * kvh * sel_splits_ * (spec_.q_heads / kvh) * 2 * 4, 256));
    partial_.reserve(std::max<size_t>(size_t(partial_slots) * 16 * spec_.head_dim * 4, 256));
    partial_ml_.reserve(std::max<size_t>(size_t(partial_slots) * 16 * 2 * 4, 256));
  }
  batch_ready_ = true;
  graph_sig_ = launch_signature();
}

// ---- CUDA graphs ----
//
// Everything the ops bake into a launch from begin_batch (grid sizes from the item counts, the
// addresses of the metadata sections and of the scratch arenas) or from knobs goes into the
// signature; device-side metadata (lengths, pages, selection items) is read by the kernels at run
// time and may change freely between replays. The model's key adds its shapes and buffers.

namespace {
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void operator()(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  void operator()(const void* p) { (*this)(uint64_t(reinterpret_cast<uintptr_t>(p))); }
};
constexpr size_t kMaxGraphs = 48;       // instantiated graphs held (least recently used evicted)
constexpr size_t kMaxGraphKeys = 1024;  // keys remembered (seen once / failed) before a reset
}  // namespace

uint64_t CudaBackend::launch_signature() const {
  Fnv f;
  for (int64_t v : {n_tokens_, int64_t(n_seqs_), int64_t(n_rec_), int64_t(n_chunked_), int64_t(n_jobs_),
                    int64_t(n_sel_), int64_t(n_sel_groups_), int64_t(sel_splits_), int64_t(sel_prefill_), int64_t(n_items_), int64_t(n_combine_), int64_t(n_dense_items_),
                    int64_t(max_blocks_), int64_t(rows_covered_), int64_t(use_gemv_), int64_t(gemv_mode_),
                    int64_t(pdl_), int64_t(gla_fma_), sparse_shared_max_blocks_})
    f(uint64_t(v));
  for (const void* p : std::initializer_list<const void*>{d_tokens_, static_cast<const void*>(d_positions_),
                        static_cast<const void*>(d_seqs_), static_cast<const void*>(d_pages_),
                        static_cast<const void*>(d_row_dst_), static_cast<const void*>(d_rec_list_),
                        static_cast<const void*>(d_chunk_list_), static_cast<const void*>(d_jobs_),
                        static_cast<const void*>(d_sel_items_), static_cast<const void*>(d_sel_groups_),
                        static_cast<const void*>(d_items_),
                        static_cast<const void*>(d_combine_), static_cast<const void*>(d_dense_items_),
                        sel_.data(), scores_.data(), keys_.data(), cand_.data(), sel_ml_.data(), partial_.data(), partial_ml_.data(),
                        x_bf16_.data(), qsplit_.data(), qgemm_split_.data(), fp8x_.data(), int8acc_.data(), k_, v_, k1_, k2_, static_cast<const void*>(states_),
                        static_cast<const void*>(log_decay_)})
    f(p);
  return f.h;
}

void CudaBackend::set_graphs(bool on) {
  if (!on) clear_graphs();
  graphs_ = on;
}

size_t CudaBackend::graph_count() const {
  size_t n = 0;
  for (const auto& [k, e] : graph_map_) n += e.exec != nullptr;
  return n;
}

void CudaBackend::clear_graphs() {
  for (auto& [k, e] : graph_map_)
    if (e.exec) cudaGraphExecDestroy(e.exec);
  graph_map_.clear();
}

void CudaBackend::abort_capture() {
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(stream_, &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
  graph_map_[capturing_].failed = true;
  capturing_ = 0;
  timing_ = false;
}

void CudaBackend::collect_timing() {
  if (!timing_) return;
  timing_ = false;
  float ms = 0;
  SALA_CUDA_CHECK(cudaEventSynchronize(ev_end_));
  SALA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev_start_, ev_end_));
  gstats_.gpu_ms += double(ms);
}

Backend::GraphStats CudaBackend::graph_stats() {
  collect_timing();
  GraphStats s = gstats_;
  s.enabled = graphs_;
  return s;
}

static uint64_t full_graph_key(uint64_t key, uint64_t sig) {
  Fnv f;
  f(key);
  f(sig);
  return f.h;
}

bool CudaBackend::graph_replay(uint64_t key) {
  if (!graphs_ || !batch_ready_ || capturing_) return false;
  auto it = graph_map_.find(full_graph_key(key, graph_sig_));
  if (it == graph_map_.end() || !it->second.exec) return false;
  collect_timing();
  it->second.last_use = ++graph_clock_;
  SALA_CUDA_CHECK(cudaEventRecord(ev_start_, stream_));
  SALA_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
  SALA_CUDA_CHECK(cudaEventRecord(ev_end_, stream_));
  timing_ = true;
  ++gstats_.replays;
  return true;
}

void CudaBackend::graph_capture_begin(uint64_t key) {
  collect_timing();
  SALA_CUDA_CHECK(cudaEventRecord(ev_start_, stream_));
  if (!graphs_ || !batch_ready_ || capturing_) return;
  const uint64_t full = full_graph_key(key, graph_sig_);
  if (graph_map_.size() >= kMaxGraphKeys && !graph_map_.count(full)) clear_graphs();
  auto [it, first_sight] = graph_map_.try_emplace(full);
  // First sight runs eagerly: lazy one-time work (kernel attributes, RoPE tables) must not happen
  // inside a capture, and a key seen once may never come back.
  if (first_sight || it->second.failed || it->second.exec) return;
  if (graph_count() >= kMaxGraphs) {
    auto lru = graph_map_.end();
    for (auto j = graph_map_.begin(); j != graph_map_.end(); ++j)
      if (j->second.exec && (lru == graph_map_.end() || j->second.last_use < lru->second.last_use)) lru = j;
    if (lru != graph_map_.end()) {
      cudaGraphExecDestroy(lru->second.exec);
      lru->second.exec = nullptr;
    }
  }
  SALA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = full;
}

void CudaBackend::graph_capture_end(uint64_t key) {
  if (!capturing_) {
    SALA_CUDA_CHECK(cudaEventRecord(ev_end_, stream_));
    timing_ = true;
    ++gstats_.eager;
    return;
  }
  const uint64_t full = capturing_;
  capturing_ = 0;
  cudaGraph_t g = nullptr;
  cudaError_t err = cudaStreamEndCapture(stream_, &g);
  cudaGraphExec_t exec = nullptr;
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, g, 0);
  if (g) cudaGraphDestroy(g);
  GraphEntry& e = graph_map_[full];
  if (err != cudaSuccess) {
    cudaGetLastError();
    e.failed = true;
    // The captured ops did not run: this forward's results are lost.
    fail("CUDA graph capture of a decode forward failed: {} (run with SALA_CUDA_GRAPHS=0)",
         cudaGetErrorString(err));
  }
  e.exec = exec;
  e.last_use = ++graph_clock_;
  SALA_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  SALA_CUDA_CHECK(cudaEventRecord(ev_end_, stream_));
  timing_ = true;
  ++gstats_.captures;
}

// ---- ops ----

void CudaBackend::embed(const Weight& table, float scale, Mat out) {
  SALA_CHECK(batch_ready_ && n_tokens_ == out.rows, "cuda embed: batch has no {} tokens", out.rows);
  SALA_CHECK(table.w.cols == out.cols, "cuda embed: table width {} vs output {}", table.w.cols, out.cols);
  SALA_CHECK(!table.packed(), "cuda embed: the table is packed ({}); embeddings are loaded dense",
             weight_format_name(table.format));
  for (int32_t id : tokens_host_)
    SALA_CHECK(id >= 0 && id < table.w.rows, "token id {} out of range [0, {})", id, table.w.rows);
  cuda::launch_embed(table.w.data, dt_of(table.w.dtype, "embed"), out.cols, d_tokens_, out.rows, scale, out.data,
                     dt_of(out.dtype, "embed"), stream_);
}

void CudaBackend::matmul(const Mat& x, const Weight& w, Mat y) {
  SALA_CHECK(x.cols == w.in() && y.cols == w.out() && x.rows == y.rows,
             "cuda matmul: x [{}, {}] · Wᵀ [{}, {}] -> y [{}, {}]", x.rows, x.cols, w.out(), w.in(), y.rows, y.cols);
  if (x.rows == 0) return;
  if (w.packed()) return matmul_packed(x, w, y);  // cuda_quant.cpp
  SALA_CHECK(w.w.dtype == DType::BF16, "cuda matmul: weight must be bf16, got {}", dtype_name(w.w.dtype));
  if (use_gemv_ && x.rows <= 8 && !batch_invariant_) {
    cuda::launch_gemv(x.data, dt_of(x.dtype, "matmul"), x.cols, w.w.data, w.out(), w.in(), y.data,
                      dt_of(y.dtype, "matmul"), y.cols, int(x.rows), gemv_mode_, pdl_ && props_.major >= 9, stream_);
    return;
  }
  if (use_gemv_ && x.rows <= 64 && batch_invariant_) {  // one kernel (tensor cores, 4 warps), ≤ 8 rows a launch
    const size_t xs = dtype_size(x.dtype), ys = dtype_size(y.dtype);
    for (int64_t n0 = 0; n0 < x.rows; n0 += 8)
      cuda::launch_gemv(static_cast<const uint8_t*>(x.data) + size_t(n0 * x.cols) * xs, dt_of(x.dtype, "matmul"),
                        x.cols, w.w.data, w.out(), w.in(), static_cast<uint8_t*>(y.data) + size_t(n0 * y.cols) * ys,
                        dt_of(y.dtype, "matmul"), y.cols, int(std::min<int64_t>(8, x.rows - n0)), 2,
                        pdl_ && props_.major >= 9, stream_);
    return;
  }
  gemm_cublas(x, w, y);
}

// Decode: one grouped GEMV launch for all parts (see kernels.h). Anything the grouped kernels do
// not cover (more rows, mixed weight formats, mixed output dtypes) runs part by part.
void CudaBackend::matmul_group(const Mat& x, std::span<const MatmulPart> parts) {
  bool fits = use_gemv_ && x.rows >= 1 && !parts.empty() && parts.size() <= size_t(cuda::kGemvMaxParts);
  bool dense = true, packed = true;
  for (const MatmulPart& p : parts) {
    SALA_CHECK(x.cols == p.w->in() && p.y.cols == p.w->out() && x.rows == p.y.rows,
               "cuda matmul_group: x [{}, {}] · Wᵀ [{}, {}] -> y [{}, {}]", x.rows, x.cols, p.w->out(), p.w->in(),
               p.y.rows, p.y.cols);
    fits = fits && p.y.dtype == parts[0].y.dtype;
    dense = dense && !p.w->packed() && p.w->w.dtype == DType::BF16;
    packed = packed && p.w->packed() && p.w->format == parts[0].w->format && p.w->group == parts[0].w->group;
  }
  if (fits && dense && x.rows <= 8) {
    cuda::GemvSet set{};
    set.count = int(parts.size());
    for (size_t i = 0; i < parts.size(); ++i)
      set.part[i] = {parts[i].w->w.data, parts[i].y.data, parts[i].w->out(), parts[i].y.cols};
    const int mode = batch_invariant_ ? 2 : gemv_mode_;  // the kernel matmul uses for these rows
    cuda::launch_gemv_set(x.data, dt_of(x.dtype, "matmul_group"), x.cols, set, x.cols,
                          dt_of(parts[0].y.dtype, "matmul_group"), int(x.rows), mode, pdl_ && props_.major >= 9,
                          stream_);
    return;
  }
  // Packed: the rows matmul_packed multiplies in one GEMV launch (y bf16 or f32). Batch-invariant
  // backends keep their per-part launches of ≤ 8 rows.
  if (fits && packed && x.rows <= 32 && !batch_invariant_ &&
      (parts[0].y.dtype == DType::BF16 || parts[0].y.dtype == DType::F32))
    return matmul_group_packed(x, parts);  // cuda_quant.cpp
  // W8A8 prefill (q/k/v/gate, MLP gate/up): x quantized once for all the parts. H100, 4K prompt:
  // half of the activation quantization's ~9 ms (bench/results/2026-11-27-w8a8-prefill-passes.md).
  if (packed) {
    const W8A8Path path = w8a8_path(*parts[0].w, x.rows, parts[0].y);
    bool shared = path != W8A8Path::None;
    for (const MatmulPart& p : parts.subspan(1)) shared = shared && w8a8_path(*p.w, x.rows, p.y) == path;
    if (shared) {
      const QuantizedRows xq = quantize_rows(packed_input(x), x.rows, x.cols, path);
      for (const MatmulPart& p : parts) matmul_w8a8(xq, *p.w, p.y);
      return;
    }
  }
  for (const MatmulPart& p : parts) matmul(x, *p.w, p.y);
}

void CudaBackend::gemm_cublas(const Mat& x, const Weight& w, Mat y) {
  const void* xb = x.data;
  if (x.dtype != DType::BF16) {
    void* tmp = x_bf16_.reserve(size_t(x.rows * x.cols) * 2);
    cuda::launch_convert(x.data, dt_of(x.dtype, "matmul"), tmp, cuda::kBF16, x.rows * x.cols, stream_);
    xb = tmp;
  }
  SALA_CHECK(y.dtype == DType::BF16 || y.dtype == DType::F32, "cuda matmul: output dtype {} unsupported",
             dtype_name(y.dtype));
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: yᵀ[out, N] = W[out, in] · xᵀ[in, N].
  SALA_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(w.out()), int(x.rows), int(w.in()), &alpha,
                                 w.w.data, CUDA_R_16BF, int(w.in()), xb, CUDA_R_16BF, int(x.cols), &beta, y.data,
                                 y.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F, int(y.cols), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::rmsnorm(const Mat& x, const Weight& w, float eps, Mat y) {
  same_shape(x, y, "rmsnorm");
  SALA_CHECK(w.w.cols == x.cols && w.w.rows == 1, "cuda rmsnorm: weight [{}, {}] for row width {}", w.w.rows,
             w.w.cols, x.cols);
  cuda::launch_rmsnorm(x.data, dt_of(x.dtype, "rmsnorm"), w.w.data, dt_of(w.w.dtype, "rmsnorm"), y.data,
                       dt_of(y.dtype, "rmsnorm"), x.rows, x.cols, eps, stream_);
}

const float* CudaBackend::inv_freq(double theta, int head_dim) {
  auto key = std::make_pair(theta, head_dim);
  auto it = inv_freq_.find(key);
  if (it != inv_freq_.end()) return static_cast<const float*>(it->second->data());
  const int half = head_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) f[size_t(i)] = 1.0f / std::pow(float(theta), float(2 * i) / float(head_dim));
  auto buf = alloc(f.size() * 4);
  SALA_CUDA_CHECK(cudaMemcpyAsync(buf->data(), f.data(), f.size() * 4, cudaMemcpyHostToDevice, stream_));
  synchronize();
  const float* p = static_cast<const float*>(buf->data());
  inv_freq_.emplace(key, std::move(buf));
  return p;
}

void CudaBackend::rope(Mat x, int head_dim, double theta) {
  SALA_CHECK(batch_ready_ && n_tokens_ == x.rows, "cuda rope: batch has no {} positions", x.rows);
  SALA_CHECK(head_dim > 0 && x.cols % head_dim == 0 && head_dim % 2 == 0, "cuda rope: width {} vs head_dim {}", x.cols,
             head_dim);
  cuda::launch_rope(x.data, dt_of(x.dtype, "rope"), x.rows, x.cols, head_dim, d_positions_, inv_freq(theta, head_dim),
                    stream_);
}

void CudaBackend::silu_mul(const Mat& g, const Mat& u, Mat out) {
  same_shape(g, u, "silu_mul");
  same_shape(g, out, "silu_mul");
  cuda::launch_elementwise(cuda::kSiluMul, g.rows * g.cols, g.data, dt_of(g.dtype, "silu_mul"), u.data,
                           dt_of(u.dtype, "silu_mul"), out.data, dt_of(out.dtype, "silu_mul"), 0.f, stream_);
}

void CudaBackend::sigmoid_mul(const Mat& a, const Mat& z, Mat out) {
  same_shape(a, z, "sigmoid_mul");
  same_shape(a, out, "sigmoid_mul");
  cuda::launch_elementwise(cuda::kSigmoidMul, a.rows * a.cols, a.data, dt_of(a.dtype, "sigmoid_mul"), z.data,
                           dt_of(z.dtype, "sigmoid_mul"), out.data, dt_of(out.dtype, "sigmoid_mul"), 0.f, stream_);
}

void CudaBackend::add_scaled(Mat h, const Mat& a, float alpha) {
  same_shape(h, a, "add_scaled");
  cuda::launch_elementwise(cuda::kAddScaled, h.rows * h.cols, h.data, dt_of(h.dtype, "add_scaled"), a.data,
                           dt_of(a.dtype, "add_scaled"), h.data, dt_of(h.dtype, "add_scaled"), alpha, stream_);
}

void CudaBackend::add_rmsnorm(Mat h, const Mat& a, float alpha, const Weight& w, float eps, Mat y) {
  same_shape(h, a, "add_rmsnorm");
  same_shape(h, y, "add_rmsnorm");
  SALA_CHECK(w.w.cols == h.cols && w.w.rows == 1, "cuda add_rmsnorm: weight [{}, {}] for row width {}", w.w.rows,
             w.w.cols, h.cols);
  const bool same_dt = h.dtype == a.dtype && h.dtype == y.dtype && h.dtype == w.w.dtype;
  if (same_dt && cuda::launch_add_rmsnorm(h.data, a.data, alpha, w.w.data, y.data, dt_of(h.dtype, "add_rmsnorm"), h.rows,
                                          h.cols, eps, stream_))
    return;
  add_scaled(h, a, alpha);  // shapes the fused kernel does not cover: the two ops it replaces
  rmsnorm(h, w, eps, y);
}

void CudaBackend::qk_norm_rope(Mat q, Mat k, const Weight& q_norm, const Weight& k_norm, float eps, int head_dim,
                               bool rope, double theta) {
  SALA_CHECK(head_dim > 0 && q.cols % head_dim == 0 && k.cols % head_dim == 0 && q.rows == k.rows,
             "cuda qk_norm_rope: q [{}, {}], k [{}, {}] with head_dim {}", q.rows, q.cols, k.rows, k.cols, head_dim);
  SALA_CHECK(q_norm.w.cols == head_dim && k_norm.w.cols == head_dim, "cuda qk_norm_rope: norm widths {}/{} vs head_dim {}",
             q_norm.w.cols, k_norm.w.cols, head_dim);
  if (rope) SALA_CHECK(batch_ready_ && n_tokens_ == q.rows, "cuda qk_norm_rope: batch has no {} positions", q.rows);
  const bool bf16_all = q.dtype == DType::BF16 && k.dtype == DType::BF16 && q_norm.w.dtype == DType::BF16 &&
                        k_norm.w.dtype == DType::BF16;
  if (bf16_all && cuda::launch_qk_norm_rope(q.data, q.rows * (q.cols / head_dim), q_norm.w.data, k.data,
                                            k.rows * (k.cols / head_dim), k_norm.w.data, int(q.cols / head_dim),
                                            int(k.cols / head_dim), head_dim, eps, rope ? d_positions_ : nullptr,
                                            rope ? inv_freq(theta, head_dim) : nullptr, stream_))
    return;
  Backend::qk_norm_rope(q, k, q_norm, k_norm, eps, head_dim, rope, theta);  // shapes the fused kernel does not cover
}

void CudaBackend::rmsnorm_gate(const Mat& x, const Weight& w, float eps, const Mat& z, Mat y) {
  same_shape(x, z, "rmsnorm_gate");
  same_shape(x, y, "rmsnorm_gate");
  SALA_CHECK(w.w.cols == x.cols && w.w.rows == 1, "cuda rmsnorm_gate: weight [{}, {}] for row width {}", w.w.rows,
             w.w.cols, x.cols);
  const bool bf16_all = x.dtype == DType::BF16 && z.dtype == DType::BF16 && y.dtype == DType::BF16 &&
                        w.w.dtype == DType::BF16;
  if (bf16_all && cuda::launch_rmsnorm_gate(x.data, w.w.data, z.data, y.data, x.rows, x.cols, eps, stream_)) return;
  Backend::rmsnorm_gate(x, w, eps, z, y);
}

void CudaBackend::scale(const Mat& x, float s, Mat out) {
  same_shape(x, out, "scale");
  cuda::launch_elementwise(cuda::kScale, x.rows * x.cols, x.data, dt_of(x.dtype, "scale"), nullptr, cuda::kF32,
                           out.data, dt_of(out.dtype, "scale"), s, stream_);
}

void CudaBackend::gather_rows(const Mat& x, std::span<const int64_t> rows, Mat out) {
  SALA_CHECK(out.rows == int64_t(rows.size()) && out.cols == x.cols, "cuda gather_rows: shape mismatch");
  if (rows.empty()) return;
  for (int64_t r : rows) SALA_CHECK(r >= 0 && r < x.rows, "cuda gather_rows: row {} out of range", r);
  if (rows.size() <= size_t(cuda::kGatherInline) && x.rows < (int64_t(1) << 31)) {
    cuda::GatherRows g;
    for (size_t i = 0; i < rows.size(); ++i) g.idx[i] = int32_t(rows[i]);
    cuda::launch_gather_rows_inline(x.data, dt_of(x.dtype, "gather_rows"), g, out.rows, out.cols, out.data,
                                    dt_of(out.dtype, "gather_rows"), stream_);
    return;
  }
  const size_t bytes = rows.size() * 8;
  void* h = gather_stage_.get(bytes);
  std::memcpy(h, rows.data(), bytes);
  void* d = gather_idx_.reserve(bytes);
  SALA_CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_));
  gather_stage_.copied(stream_);
  cuda::launch_gather_rows(x.data, dt_of(x.dtype, "gather_rows"), static_cast<const int64_t*>(d), out.rows, out.cols,
                           out.data, dt_of(out.dtype, "gather_rows"), stream_);
}

// The GLA launch arguments for these rows, after checking the shapes against the caches.
cuda::GlaArgs CudaBackend::gla_args(int layer, const Mat& q, const Mat& k, const Mat& v, const Mat& out) const {
  SALA_CHECK(batch_ready_, "cuda lightning_attention: begin_batch was not called");
  SALA_CHECK(rows_covered_, "cuda lightning_attention: some batch row belongs to no sequence");
  SALA_CHECK(states_ && layer >= 0 && layer < spec_.lightning_layers,
             "cuda lightning_attention: layer {} out of range [0, {})", layer, spec_.lightning_layers);
  const int d = spec_.lightning_dim, H = spec_.lightning_heads;
  SALA_CHECK(q.cols == int64_t(H) * d && out.cols == q.cols, "cuda lightning_attention: q/out width {}/{} != {} x {}",
             q.cols, out.cols, H, d);
  SALA_CHECK(k.cols == v.cols && k.cols % d == 0 && k.cols > 0, "cuda lightning_attention: k/v width {}/{}", k.cols,
             v.cols);
  const int Hkv = int(k.cols / d);
  SALA_CHECK(H % Hkv == 0, "cuda lightning_attention: {} q heads not a multiple of {} kv heads", H, Hkv);
  SALA_CHECK(q.rows == k.rows && q.rows == v.rows && q.rows == out.rows && q.rows == n_tokens_,
             "cuda lightning_attention: {} rows for a batch of {} tokens", q.rows, n_tokens_);
  SALA_CHECK(q.dtype == k.dtype && q.dtype == v.dtype && q.dtype == out.dtype,
             "cuda lightning_attention: q, k, v, out must share one dtype");
  cuda::GlaArgs a{};
  a.q = q.data, a.k = k.data, a.v = v.data, a.out = out.data;
  a.dt = dt_of(q.dtype, "lightning_attention");
  a.ldq = q.cols, a.ldk = k.cols, a.ldv = v.cols, a.ldo = out.cols;
  a.states = states_;
  a.layer = layer, a.layers = spec_.lightning_layers, a.heads = H, a.kv_heads = Hkv, a.d = d;
  a.log_decay = log_decay_;
  a.scale = spec_.lightning_scale;
  a.seqs = d_seqs_;
  return a;
}

void CudaBackend::lightning_attention(int layer, const Mat& q, const Mat& k, const Mat& v, Mat out) {
  cuda::GlaArgs a = gla_args(layer, q, k, v, out);
  a.seq_list = d_rec_list_, a.n_list = n_rec_;
  cuda::launch_gla_recurrent(a, stream_);
  a.seq_list = d_chunk_list_, a.n_list = n_chunked_;
  a.force_fma = gla_fma_;
  cuda::launch_gla_chunked(a, stream_);
}

// Calls whose sequences all take the recurrent kernel (decode, verify): the q/k norms + RoPE inside
// its launch (launch_gla_recurrent_normed; the same values as the separate ops), then the output
// norm and gate. Prompt chunks (the chunked kernel reads normalised q, k) and other dtypes or head
// sizes: the separate ops.
void CudaBackend::lightning_block(int layer, Mat q, Mat k, const Mat& v, const LightningNorms& n, Mat out) {
  const auto bf16 = [](const Weight* w) { return w && w->w.dtype == DType::BF16; };
  if (mixer_fusion_ && batch_ready_ && n_chunked_ == 0 && bf16(n.q_norm) && bf16(n.k_norm) &&
      q.dtype == DType::BF16) {
    cuda::GlaArgs a = gla_args(layer, q, k, v, out);
    SALA_CHECK(n.head_dim == a.d && n.q_norm->w.cols == a.d && n.k_norm->w.cols == a.d,
               "cuda lightning_block: q/k norm widths {}/{} vs head_dim {} (lightning dim {})", n.q_norm->w.cols,
               n.k_norm->w.cols, n.head_dim, a.d);
    a.seq_list = d_rec_list_, a.n_list = n_rec_;
    cuda::GlaQkNorms qk{};
    qk.q_norm = n.q_norm->w.data;
    qk.k_norm = n.k_norm->w.data;
    qk.positions = n.rope ? d_positions_ : nullptr;
    qk.inv_freq = n.rope ? inv_freq(n.theta, n.head_dim) : nullptr;
    qk.eps = n.eps;
    if (cuda::bench_skips(cuda::kSkipGla, q.rows)) return lightning_output(n, out);  // timing experiment
    if (cuda::launch_gla_recurrent_normed(a, qk, stream_)) {
      ++fused_gla_launches_;
      return lightning_output(n, out);
    }
  }
  Backend::lightning_block(layer, q, k, v, n, out);
}

// Exact rollback (spec §6.2, rollback.cu): runs outside any forward (never inside a graph capture),
// on the stream, so it orders with the verify forward before it and the next forward after it.
void CudaBackend::lightning_rollback(int layer, int slot, int snapshot_slot, const Mat& k, const Mat& v,
                                     int64_t keep) {
  SALA_CHECK(states_ && layer >= 0 && layer < spec_.lightning_layers,
             "cuda lightning_rollback: layer {} out of range [0, {})", layer, spec_.lightning_layers);
  SALA_CHECK(slot >= 0 && slot < spec_.max_slots && snapshot_slot >= 0 && snapshot_slot < spec_.max_slots,
             "cuda lightning_rollback: slots {} <- {} out of range [0, {})", slot, snapshot_slot, spec_.max_slots);
  SALA_CHECK(keep >= 0 && keep < (int64_t(1) << 31), "cuda lightning_rollback: keep {} out of range", keep);
  SALA_CHECK(!capturing_, "cuda lightning_rollback: called during a CUDA graph capture");
  const int d = spec_.lightning_dim, H = spec_.lightning_heads;
  float* S = states_ + (size_t(slot) * spec_.lightning_layers + layer) * state_floats_;
  const float* S0 = states_ + (size_t(snapshot_slot) * spec_.lightning_layers + layer) * state_floats_;
  if (keep == 0) {
    if (S != S0) SALA_CUDA_CHECK(cudaMemcpyAsync(S, S0, state_floats_ * 4, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  SALA_CHECK(k.rows >= keep && v.rows >= keep && k.cols == v.cols && k.cols % d == 0 && k.cols > 0,
             "cuda lightning_rollback: k/v [{}, {}] / [{}, {}] for keep {} and head dim {}", k.rows, k.cols, v.rows,
             v.cols, keep, d);
  SALA_CHECK(k.dtype == v.dtype, "cuda lightning_rollback: k is {} but v is {}", dtype_name(k.dtype),
             dtype_name(v.dtype));
  const int Hkv = int(k.cols / d);
  SALA_CHECK(H % Hkv == 0, "cuda lightning_rollback: {} heads not a multiple of {} kv heads", H, Hkv);
  cuda::RollbackArgs a{};
  a.k = k.data, a.v = v.data;
  a.dt = dt_of(k.dtype, "lightning_rollback");
  a.ldk = k.cols, a.ldv = v.cols;
  a.states = states_;
  a.log_decay = log_decay_;
  a.slot = slot, a.snapshot_slot = snapshot_slot, a.layer = layer, a.layers = spec_.lightning_layers;
  a.heads = H, a.kv_heads = Hkv, a.d = d, a.keep = int32_t(keep);
  cuda::launch_lightning_rollback(a, stream_);
}

void CudaBackend::sparse_attention(int layer, const Mat& q, const Mat& k, const Mat& v, Mat out) {
  sparse_block(layer, q, k, v, nullptr, out);
}

// The output gate in the attention kernels' stores (SparseArgs::gate) unless mixer fusion is off
// (SALA_CUDA_MIXER_FUSION=0: the sigmoid_mul launch, for A/B runs).
void CudaBackend::sparse_block(int layer, const Mat& q, const Mat& k, const Mat& v, const Mat* gate, Mat out) {
  if (gate && !mixer_fusion_) return Backend::sparse_block(layer, q, k, v, gate, out);
  SALA_CHECK(batch_ready_, "cuda sparse_attention: begin_batch was not called");
  SALA_CHECK(rows_covered_, "cuda sparse_attention: some batch row belongs to no sequence");
  SALA_CHECK(k_ && layer >= 0 && layer < spec_.sparse_layers, "cuda sparse_attention: layer {} out of range [0, {})",
             layer, spec_.sparse_layers);
  const int d = spec_.head_dim, Hq = spec_.q_heads, Hkv = spec_.kv_heads;
  SALA_CHECK(q.cols == int64_t(Hq) * d && out.cols == q.cols && k.cols == int64_t(Hkv) * d && v.cols == k.cols,
             "cuda sparse_attention: widths q {} k {} v {} out {} for {}/{} heads of {}", q.cols, k.cols, v.cols,
             out.cols, Hq, Hkv, d);
  SALA_CHECK(q.rows == k.rows && q.rows == v.rows && q.rows == out.rows && q.rows == n_tokens_,
             "cuda sparse_attention: {} rows for a batch of {} tokens", q.rows, n_tokens_);
  if (cuda::bench_skips(cuda::kSkipAttention, q.rows)) return;  // timing experiment: no append, no attention
  SALA_CHECK(k.dtype == v.dtype, "cuda sparse_attention: k and v must share one dtype");
  cuda::PoolGeom g{};
  g.k = k_, g.v = v_, g.k1 = k1_, g.k2 = k2_;
  g.bs = spec_.block_size, g.kvh = Hkv, g.d = d, g.max_pages = spec_.max_pages;
  g.k1pp = k1pp_, g.k2pp = k2pp_, g.ks = spec_.kernel_size, g.st = spec_.kernel_stride;
  g.init_blocks = spec_.init_blocks, g.local_blocks = spec_.local_blocks, g.topk = spec_.topk;

  cuda::launch_append_kv(g, layer, k.data, v.data, dt_of(k.dtype, "sparse_attention"), k.cols, v.cols, d_row_dst_,
                         q.rows, stream_);
  cuda::launch_compress(g, layer, d_jobs_, n_jobs_, d_seqs_, d_pages_, stream_);

  cuda::SparseArgs a{};
  a.pool = g;
  a.layer = layer;
  a.q_heads = Hq;
  a.scale = spec_.attn_scale;
  a.q = q.data, a.dtq = dt_of(q.dtype, "sparse_attention"), a.ldq = q.cols;
  a.out = out.data, a.dto = dt_of(out.dtype, "sparse_attention"), a.ldo = out.cols;
  if (gate) {
    same_shape(*gate, out, "sparse_block gate");
    a.gate = gate->data, a.dtg = dt_of(gate->dtype, "sparse_block");
  }
  a.seqs = d_seqs_;
  a.pages = d_pages_;
  a.sel_items = d_sel_items_, a.n_sel_items = n_sel_;
  a.kmax = spec_.topk + spec_.local_blocks;
  a.sel_groups = d_sel_groups_, a.n_sel_groups = n_sel_groups_;
  a.sel_splits = sel_splits_;
  a.sel_prefill = sel_prefill_;
  a.sel_ml = static_cast<float*>(sel_ml_.data());
  a.chunk_scores = static_cast<float*>(scores_.data());
  a.block_keys = static_cast<uint32_t*>(keys_.data());
  a.sel_cand = static_cast<uint32_t*>(cand_.data());
  a.sel = static_cast<int32_t*>(sel_.data());
  a.items = d_items_, a.n_items = n_items_;
  a.partial = static_cast<float*>(partial_.data());
  a.partial_ml = static_cast<float*>(partial_ml_.data());
  a.combine_items = d_combine_, a.n_combine = n_combine_;
  a.dense_items = d_dense_items_, a.n_dense_items = n_dense_items_;
  a.max_blocks = max_blocks_;
  cuda::launch_select(a, stream_);
  cuda::launch_attention(a, stream_);
}

// ---- memory ----

Backend::MemoryStats CudaBackend::memory_stats() {
  size_t free = 0, total = 0;
  SALA_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  MemoryStats m;
  m.used = int64_t(total - free);
  m.total = int64_t(total);
  mem_peak_ = std::max(mem_peak_, m.used);
  m.peak = mem_peak_;
  return m;
}

// ---- factory ----

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::unique_ptr<Backend> make_cuda_backend(int device, bool batch_invariant) {
  return std::make_unique<CudaBackend>(device, batch_invariant);
}

}  // namespace sala
