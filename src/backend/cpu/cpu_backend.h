// The CPU backend: f32 everywhere, OpenBLAS for the large products, a thread pool for the rest.
// It is the readable reference implementation of every op in backend.h.
#pragma once
#include <atomic>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/threads.h"

namespace sala {

class CpuBackend final : public Backend {
 public:
  // batch_invariant: every matmul row through cpu::dot (fixed summation order) instead of
  // OpenBLAS, whose kernels round differently with the number of rows and threads — so a
  // sequence's logits do not depend on what else is in its batch (`--deterministic`). Slower
  // prefill; decode-sized products are memory-bound either way.
  explicit CpuBackend(int threads = 0, bool batch_invariant = false);
  bool batch_invariant() const { return batch_invariant_; }
  std::string name() const override { return "cpu"; }
  std::string device_name() const override;  // CPU model (/proc/cpuinfo) and threads
  DType act_dtype() const override { return DType::F32; }

  std::unique_ptr<Buffer> alloc(size_t bytes) override;
  void upload(Mat dst, const float* host) override;
  void download(const Mat& src, float* host) override;
  Weight load_weight(const TensorView& host) override;
  Weight load_vector(const TensorView& host) override;
  Weight random_weight(int64_t rows, int64_t cols, float mean, float std, uint64_t seed) override;
  Weight load_quantized_weight(const QuantMatrixView& q, const std::string& name) override;  // cpu_quant_matmul.cpp

  MemoryStats memory_stats() override;  // RSS from /proc; allocated: buffers + cache pools
  void reset_memory_peak() override;     // /proc/self/clear_refs "5" resets the process's VmHWM

  void create_caches(const CacheSpec& spec) override;
  void reset_state(int slot) override;
  void copy_state(int src_slot, int dst_slot) override;
  void begin_batch(const BatchInfo& batch) override;

  void embed(const Weight& table, float scale, Mat out) override;
  void matmul(const Mat& x, const Weight& w, Mat y) override;
  void rmsnorm(const Mat& x, const Weight& w, float eps, Mat y) override;
  void rope(Mat x, int head_dim, double theta) override;
  void silu_mul(const Mat& g, const Mat& u, Mat out) override;
  void sigmoid_mul(const Mat& a, const Mat& z, Mat out) override;
  void add_scaled(Mat h, const Mat& a, float alpha) override;
  void scale(const Mat& x, float s, Mat out) override;
  void gather_rows(const Mat& x, std::span<const int64_t> rows, Mat out) override;
  void lightning_attention(int layer, const Mat& q, const Mat& k, const Mat& v, Mat out) override;
  void sparse_attention(int layer, const Mat& q, const Mat& k, const Mat& v, Mat out) override;
  void lightning_rollback(int layer, int slot, int snapshot_slot, const Mat& k, const Mat& v,
                          int64_t keep) override;  // cpu_rollback.cpp

  // Cache layout (f32), exposed for tests:
  //   K, V pages:  [sparse_layer][page][block_size][kv_heads][head_dim]
  //   K1 pages:    [sparse_layer][page][k1_per_page][kv_heads][head_dim]  chunk c -> page c*st/bs
  //   K2 pages:    [sparse_layer][page][k2_per_page][kv_heads][head_dim]  chunk c -> page c*4st/bs
  //   states:      [slot][lightning_layer][head][dim(key)][dim(value)]
  const CacheSpec& spec() const { return spec_; }
  float* state(int slot, int layer);
  float* k_row(int layer, int page, int offset);  // kv_heads*head_dim values of one token
  float* v_row(int layer, int page, int offset);
  float* k1_row(int layer, int64_t chunk, const std::vector<int32_t>& pages);
  float* k2_row(int layer, int64_t chunk, const std::vector<int32_t>& pages);
  ThreadPool& pool() { return pool_; }

 private:
  // y = x · Wᵀ for a packed W, decoding rows on the fly (cpu_quant_matmul.cpp).
  void matmul_packed(const Mat& x, const Weight& w, Mat y);
  void matmul_fp8_activations(const Mat& x, const Weight& w, Mat y);  // --fp8-prefill (cpu_quant_matmul.cpp)
  void matmul_int8_activations(const Mat& x, const Weight& w, Mat y);  // --int8-prefill (cpu_quant_matmul.cpp)

  ThreadPool pool_;
  bool batch_invariant_ = false;
  // Bytes of live buffers from alloc() (shared with them: a buffer may outlive the backend).
  std::shared_ptr<std::atomic<int64_t>> buffer_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  CacheSpec spec_;
  const BatchInfo* batch_ = nullptr;
  int k1_per_page_ = 0, k2_per_page_ = 0;
  std::vector<float> k_, v_, k1_, k2_, states_;
};

}  // namespace sala
