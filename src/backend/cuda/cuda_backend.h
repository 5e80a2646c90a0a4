// The CUDA backend: bf16 activations and weights, fp32 accumulation, fp32 lightning states and
// softmax statistics (spec §2.6). Host-side orchestration only; the kernels are in the .cu files of
// this directory behind kernels.h. See docs/cuda-backend.md.
//
// Cache layout (device memory, the CPU backend's layout in bf16; states fp32):
//   K, V pages:  [sparse_layer][page][block_size][kv_heads][head_dim]           bf16
//   K1 pages:    [sparse_layer][page][block_size/stride][kv_heads][head_dim]    bf16
//   K2 pages:    [sparse_layer][page][block_size/(4·stride)][kv_heads][head_dim] bf16
//   states:      [slot][lightning_layer][head][dim(key)][dim(value)]             f32
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <unordered_map>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"

typedef struct cublasContext* cublasHandle_t;
typedef struct cublasLtContext* cublasLtHandle_t;

namespace sala {

// cuBLAS / cuBLASLt workspace (one, shared: both run on the backend's stream).
inline constexpr size_t kCublasWorkspace = 32u << 20;

// Grow-only device allocation (never shrinks; contents are not preserved on growth).
class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  void* reserve(size_t bytes);  // pointer valid until the next reserve() that grows
  void* data() const { return ptr_; }
  size_t capacity() const { return cap_; }
  void release();

 private:
  void* ptr_ = nullptr;
  size_t cap_ = 0;
};

// Pinned host staging for asynchronous uploads; waits for its previous copy before reuse.
class HostStage {
 public:
  HostStage() = default;
  ~HostStage();
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;
  void* get(size_t bytes);          // waits for the last copy out of this buffer, grows if needed
  void copied(cudaStream_t stream);  // records the end of a copy out of this buffer

 private:
  void* ptr_ = nullptr;
  size_t cap_ = 0;
  cudaEvent_t event_ = nullptr;
  bool pending_ = false;
};

class CudaBackend final : public Backend {
 public:
  // batch_invariant: every row's result independent of what else is in the batch (`--deterministic`):
  // decode GEMVs of one fixed kernel in launches of ≤ 8 rows (up to 64 rows), one token per attention
  // unit with key splits from its own context, the fused block selection. Slower; for exact
  // speculative greedy identity and reproducible batched serving.
  explicit CudaBackend(int device = 0, bool batch_invariant = false);
  bool batch_invariant() const { return batch_invariant_; }
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  DType act_dtype() const override { return DType::BF16; }

  std::unique_ptr<Buffer> alloc(size_t bytes) override;
  void upload(Mat dst, const float* host) override;
  void download(const Mat& src, float* host) override;
  Weight load_weight(const TensorView& host) override;
  Weight load_vector(const TensorView& host) override;
  Weight random_weight(int64_t rows, int64_t cols, float mean, float std, uint64_t seed) override;
  // Packed weights (cuda_quant.cpp): tiles for the decode GEMV (quant_gemv.cu), dequantized to a
  // bf16 scratch for cuBLAS in prefill.
  Weight load_quantized_weight(const QuantMatrixView& q, const std::string& name) override;
  Weight random_quantized_weight(WeightFormat format, int64_t rows, int64_t cols, int64_t group, float std,
                                 uint64_t seed) override;
  void synchronize() override;
  // --fp8-prefill: cuBLASLt's fp8 GEMM with per-row scales (cuda_quant.cpp); sm_89 or newer.
  void set_fp8_prefill(bool on) override;
  bool native_fp8() const override { return props_.major * 10 + props_.minor >= 89; }
  // --int8-prefill: cuBLASLt's int8 GEMM on Q8 / Q4 weights, exact int32 products (cuda_quant.cpp).
  void set_int8_prefill(bool on) override;

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
  void matmul_group(const Mat& x, std::span<const MatmulPart> parts) override;
  void matmul_silu_mul(const Mat& x, const Weight& gate, const Weight& up, Mat g, Mat u, Mat act) override;  // cuda_quant.cpp
  void add_rmsnorm(Mat h, const Mat& a, float alpha, const Weight& w, float eps, Mat y) override;
  void qk_norm_rope(Mat q, Mat k, const Weight& q_norm, const Weight& k_norm, float eps, int head_dim, bool rope,
                    double theta) override;
  void rmsnorm_gate(const Mat& x, const Weight& w, float eps, const Mat& z, Mat y) override;
  void scale(const Mat& x, float s, Mat out) override;
  void gather_rows(const Mat& x, std::span<const int64_t> rows, Mat out) override;
  void lightning_attention(int layer, const Mat& q, const Mat& k, const Mat& v, Mat out) override;
  void lightning_block(int layer, Mat q, Mat k, const Mat& v, const LightningNorms& n, Mat out) override;
  void lightning_rollback(int layer, int slot, int snapshot_slot, const Mat& k, const Mat& v, int64_t keep) override;
  void sparse_attention(int layer, const Mat& q, const Mat& k, const Mat& v, Mat out) override;
  void sparse_block(int layer, const Mat& q, const Mat& k, const Mat& v, const Mat* gate, Mat out) override;

  // CUDA graphs of decode forwards (docs/cuda-backend.md). A recording is keyed by the model's key
  // and the launch signature of the last begin_batch (item counts, metadata/scratch addresses,
  // knobs); the first forward with a new key runs eagerly (warms lazy allocations), the second is
  // captured and launched, later ones replay. SALA_CUDA_GRAPHS=0 or set_graphs(false) disables.
  bool graph_replay(uint64_t key) override;
  void graph_capture_begin(uint64_t key) override;
  void graph_capture_end(uint64_t key) override;
  GraphStats graph_stats() override;
  // Device-wide use from cudaMemGetInfo; peak is the highest use seen by these calls.
  MemoryStats memory_stats() override;
  void reset_memory_peak() override { mem_peak_ = 0; }
  void set_graphs(bool on);
  bool graphs() const { return graphs_; }
  size_t graph_count() const;  // instantiated graphs held

  // For tests and benchmarks.
  cudaStream_t stream() const { return stream_; }
  // A packed weight as the packed kernels take it (kernels.h: codes, tiled params, shape, group).
  static cuda::QWeight qweight(const Weight& w);  // cuda_quant.cpp
  const CacheSpec& spec() const { return spec_; }
  const cudaDeviceProp& props() const { return props_; }
  std::string device_name() const;
  // Copies one slot/layer of lightning state (heads·d·d floats) to the host.
  void download_state(int slot, int layer, float* host);
  // Test hooks: the last begin_batch's selection work items, the selection lists written by the
  // last sparse_attention call ([item][kv_head][topk + local_blocks]), and a whole cache pool as
  // f32 (which: 0 K, 1 V, 2 K1, 3 K2).
  const std::vector<cuda::SelItem>& debug_sel_items() const { return sel_items_host_; }
  std::vector<int32_t> debug_selection();
  std::vector<float> debug_pool(int which);
  // Fills the K, V, K1 and K2 pools with random bf16 (benchmarks of long contexts without their prefill).
  void debug_fill_pools_random(uint64_t seed);
  // Forces small-N products through cuBLAS (false) or allows the GEMV kernel (true, default).
  void set_use_gemv(bool on) { use_gemv_ = on; }
  // GEMV variant (benchmarks): 0 automatic, 1 FMA, 2 tensor cores 4 warps, 3 tensor cores 16 warps.
  void set_gemv_mode(int mode) { gemv_mode_ = mode; }
  // Programmatic dependent launch of the GEMV kernels (default on for sm_90+).
  void set_pdl(bool on) { pdl_ = on; }
  // The mixers' small ops inside their kernels (default on): the lightning q/k norms in the
  // recurrent GLA launch (decode, verify), the sparse output gate in the attention kernels' stores.
  // Off: launches of their own (tests, A/B; SALA_CUDA_MIXER_FUSION=0).
  void set_mixer_fusion(bool on) { mixer_fusion_ = on; }
  int64_t fused_gla_launches() const { return fused_gla_launches_; }  // test hook: the fused path ran
  // Chunked GLA prefill through the fp32 FMA kernel instead of the tensor-core one (tests, A/B).
  void set_gla_fma(bool on) { gla_fma_ = on; }
  // Largest context (in blocks) for which InfLLM-v2 prefill rows use the shared-tile kernel
  // (4 tokens per CTA over the union of their blocks); -1: automatic (2 × the block budget).
  void set_sparse_shared_max_blocks(int64_t blocks) { sparse_shared_max_blocks_ = blocks; }
  // CTAs per (token, KV head) for the block selection's scoring passes; -1 (default): chosen per
  // batch (split when few tokens select over long contexts, e.g. decode at 1M). Tests force both.
  void set_select_splits(int splits) { select_splits_knob_ = splits; }

 private:
  void gemm_cublas(const Mat& x, const Weight& w, Mat y);
  void matmul_packed(const Mat& x, const Weight& w, Mat y);  // cuda_quant.cpp
  void matmul_group_packed(const Mat& x, std::span<const MatmulPart> parts);  // cuda_quant.cpp
  // W8A8 prefill products (cuda_quant.cpp). The unfit functions give the reason the fp8 / int8
  // product cannot take this weight and output (empty: it can); w8a8_path which product takes
  // x [N, in] · wᵀ (None: weight-only). x's rows are quantized once (quantize_rows) for every
  // product that shares them (matmul_group).
  enum class W8A8Path { None, Fp8, Int8 };
  struct QuantizedRows {
    const uint8_t* codes;  // [n, in] e4m3 or int8
    const float* scales;   // [n] per-row scales
    const float* sums;     // [n] int8: s·Σq per row
    int64_t n;
    W8A8Path path;
  };
  std::string fp8_prefill_unfit(const Weight& w, const Mat& y) const;
  std::string int8_prefill_unfit(const Weight& w, const Mat& y) const;
  W8A8Path w8a8_path(const Weight& w, int64_t N, const Mat& y) const;
  QuantizedRows quantize_rows(const void* xb, int64_t N, int64_t in, W8A8Path path);
  void matmul_w8a8(const QuantizedRows& xq, const Weight& w, Mat y);
  void matmul_fp8_activations(const QuantizedRows& xq, const Weight& w, Mat y);
  void matmul_int8_activations(const QuantizedRows& xq, const Weight& w, Mat y);
  const void* packed_input(const Mat& x);  // x as 8-byte aligned bf16 rows
  // The column-split workspace for a packed product of n rows (≤ 32) and `rows` outputs, or null
  // where the split does not apply (cuda_quant.cpp).
  float* qsplit_workspace(int64_t n, int64_t rows, size_t* floats);
  int qgemv_warps() const;
  Weight alloc_packed(int fmt, int64_t rows, int64_t cols, int64_t group, bool zpack);
  void finish_packed(const Weight& w);  // the int8 row scales of weights --int8-prefill requantizes
  const float* inv_freq(double theta, int head_dim);
  cuda::GlaArgs gla_args(int layer, const Mat& q, const Mat& k, const Mat& v, const Mat& out) const;
  void clear_graphs();
  void abort_capture();
  void collect_timing();
  uint64_t launch_signature() const;
  int choose_select_splits(const std::vector<cuda::SelItem>& items) const;

  int device_ = 0;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublas_lt_ = nullptr;  // created by set_fp8_prefill(true) or set_int8_prefill(true)
  void* cublas_ws_ = nullptr;
  bool use_gemv_ = true;
  int gemv_mode_ = 0;
  bool pdl_ = true;
  bool gla_fma_ = false;
  bool mixer_fusion_ = true;
  int64_t fused_gla_launches_ = 0;
  int64_t sparse_shared_max_blocks_ = -1;
  int select_splits_knob_ = -1;
  bool batch_invariant_ = false;

  // Caches.
  CacheSpec spec_;
  bool caches_ = false;
  void* k_ = nullptr;
  void* v_ = nullptr;
  void* k1_ = nullptr;
  void* k2_ = nullptr;
  float* states_ = nullptr;
  float* log_decay_ = nullptr;
  int k1pp_ = 0, k2pp_ = 0;
  size_t state_floats_ = 0;  // per (slot, layer)

  // Batch metadata (host copies and device pointers into meta_).
  std::vector<int32_t> tokens_host_;
  std::vector<cuda::SelItem> sel_items_host_;
  int64_t n_tokens_ = 0;
  bool batch_ready_ = false;
  HostStage stage_[2];
  int stage_i_ = 0;
  DeviceArena meta_;
  int32_t* d_tokens_ = nullptr;
  int32_t* d_positions_ = nullptr;
  cuda::SeqMeta* d_seqs_ = nullptr;
  int32_t* d_pages_ = nullptr;
  int64_t* d_row_dst_ = nullptr;
  int32_t* d_rec_list_ = nullptr;
  int32_t* d_chunk_list_ = nullptr;
  cuda::CompressJob* d_jobs_ = nullptr;
  cuda::SelItem* d_sel_items_ = nullptr;
  int32_t* d_sel_groups_ = nullptr;  // first item of each prefill token group (+ end)
  cuda::AttnItem* d_items_ = nullptr;
  int32_t* d_combine_ = nullptr;
  cuda::AttnItem* d_dense_items_ = nullptr;
  int n_dense_items_ = 0;
  int32_t max_blocks_ = 0;
  int n_seqs_ = 0, n_rec_ = 0, n_chunked_ = 0, n_jobs_ = 0, n_sel_ = 0, n_sel_groups_ = 0, sel_splits_ = 1, n_items_ = 0, n_combine_ = 0;
  bool sel_prefill_ = false;  // the selection scores token groups with select_prefill_kernel (select.cu)
  bool rows_covered_ = false;

  // Scratch.
  DeviceArena x_bf16_;     // x converted for cuBLAS
  DeviceArena qscratch_;   // packed weights: row blocks dequantized to bf16 for cuBLAS (fixed size)
  DeviceArena fp8x_;       // --fp8/int8-prefill: activations as e4m3 or int8 rows, then their scales
  DeviceArena int8acc_;    // --int8-prefill: cuBLASLt's int32 products of one weight block
  DeviceArena qsplit_;     // packed 9–32-row products of few rows: the column split's partial sums
  DeviceArena qgemm_split_;  // the fused packed GEMM's K-split partial sums (4096-row matrices, N ≤ 512)
  DeviceArena sel_;        // selection lists
  DeviceArena scores_;     // stage-1 chunk scores
  DeviceArena keys_;       // pooled block keys
  DeviceArena cand_;       // split selection: each pooling CTA's top-K candidate keys
  DeviceArena sel_ml_;     // per-split (max, sum) of the selection's K2 pass
  DeviceArena partial_;    // split-attention partials
  DeviceArena partial_ml_;
  DeviceArena gather_idx_;
  HostStage gather_stage_;
  std::map<std::pair<double, int>, std::unique_ptr<Buffer>> inv_freq_;

  // CUDA graphs.
  struct GraphEntry {
    cudaGraphExec_t exec = nullptr;  // null: seen once, not captured yet
    uint64_t last_use = 0;
    bool failed = false;  // capture failed: always eager
  };
  bool graphs_ = true;
  std::unordered_map<uint64_t, GraphEntry> graph_map_;
  uint64_t graph_sig_ = 0;    // launch signature of the last begin_batch
  uint64_t graph_clock_ = 0;
  uint64_t capturing_ = 0;    // full key being captured (0: none)
  bool timing_ = false;       // a forward between the two events is pending
  cudaEvent_t ev_start_ = nullptr, ev_end_ = nullptr;
  GraphStats gstats_;
  int64_t mem_peak_ = 0;  // memory_stats()
};

std::unique_ptr<Backend> make_cuda_backend(int device);
bool cuda_device_available();

}  // namespace sala
