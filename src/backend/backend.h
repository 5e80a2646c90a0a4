// The op-level interface the model is written against. The CPU backend (f32) is the readable
// reference; the CUDA backend (bf16 activations, fp32 accumulation and state) implements the same
// ops. The model never sees which backend runs it.
//
// All activations are 2-D row-major matrices [rows, cols] in backend memory. Per-head data is the
// same matrix with cols = heads * head_dim (head-major packing, spec §0).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace sala {

// A view of a matrix in backend memory (does not own it).
struct Mat {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;

  size_t nbytes() const { return size_t(rows * cols) * dtype_size(dtype); }
  // Rows [first, first + count) of this matrix.
  Mat slice_rows(int64_t first, int64_t count) const {
    return {static_cast<uint8_t*>(data) + size_t(first * cols) * dtype_size(dtype), dtype, count, cols};
  }
  // The same memory seen with another number of columns (rows * cols must stay the same).
  Mat reshape(int64_t new_rows, int64_t new_cols) const { return {data, dtype, new_rows, new_cols}; }
};

// Memory owned by a backend (RAII).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  Mat mat(DType dtype, int64_t rows, int64_t cols) { return {data(), dtype, rows, cols}; }
};

// How a weight matrix is held in backend memory (docs/quantization.md, "Formats in memory").
// Every checkpoint quantization maps onto one of the packed formats at load:
//   FP8     e4m3 codes, one f32 scale per output row:  w = s[o] · e4m3(q)
//   Q8, Q4  unsigned 8-/4-bit codes q, one f32 scale s and bias b per group of `group` input
//           columns of a row (group = in: per row):     w = s · q + b
// int8 (signed, per row) is q + 128 with b = −128·s; int4 symmetric q + 8 with b = −8·s; int4
// with zero points b = −s·z; MLX affine is this form already (bf16 scales/biases widened to f32).
// Grouped weights (group < in) are multiplied by their scales and biases rounded to f16 on every
// backend (quant_layout.h: the CUDA tiles store them so); per-row ones by the f32 values.
enum class WeightFormat : uint8_t { Dense, FP8, Q8, Q4 };
const char* weight_format_name(WeightFormat f);  // "dense", "fp8", "q8", "q4"

// A quantized [rows, cols] matrix in the canonical host layout load_quantized_weight takes
// (borrowed). codes: row-major, one byte per value (FP8, Q8) or two per byte for Q4 (element 2j
// in the low nibble of byte j of its row); scales and biases: f32 [rows, cols / group]; biases
// empty for FP8.
struct QuantMatrixView {
  WeightFormat format = WeightFormat::Q4;
  int64_t rows = 0, cols = 0;
  int64_t group = 0;  // input columns per (scale, bias); cols for one per row
  std::span<const uint8_t> codes;
  std::span<const float> scales;
  std::span<const float> biases;
  int64_t groups() const { return group > 0 ? cols / group : 0; }
  size_t code_bytes() const { return size_t(rows) * size_t(format == WeightFormat::Q4 ? cols / 2 : cols); }
  // Throws sala::Error naming `name` when sizes, group or codes (e4m3 NaN) are inconsistent, or a
  // grouped weight's scale or bias is beyond f16's range.
  void validate(const std::string& name) const;
};

// A weight matrix [out, in] in the layout and format the backend wants (converted at load).
struct Weight {
  // Dense: the values (f32 on CPU, bf16 on CUDA). Packed: data = the codes in the backend's own
  // layout (CPU: canonical row-major; CUDA: mma tiles), dtype U8, rows × cols the logical [out, in].
  Mat w;
  WeightFormat format = WeightFormat::Dense;
  int64_t group = 0;        // packed: input columns per scale (in: one per row)
  void* scales = nullptr;   // packed, backend layout. CPU: f32 [out, in/group]; CUDA: tiled (s, b) pairs
  void* biases = nullptr;   // CPU Q8/Q4: f32 [out, in/group]; otherwise null
  size_t packed_bytes = 0;  // packed: bytes a product reads (codes + scales + biases, with padding)
  bool q8_symmetric = false;  // CUDA Q8 per row, every bias −128·scale (symmetric int8; quant_gemv.cu)
  bool zero_packed = false;   // CUDA grouped Q4: zero points packed into the f16 scales (quant_layout.h)
  void* int8_row_scales = nullptr;  // CUDA Q4 / grouped Q8: f32 max |w| / 127 per row (--int8-prefill)
  std::shared_ptr<Buffer> storage;
  int64_t out() const { return w.rows; }
  int64_t in() const { return w.cols; }
  bool packed() const { return format != WeightFormat::Dense; }
  size_t nbytes() const { return packed() ? packed_bytes : w.nbytes(); }
};

// Geometry and constants of the cache pools; fixed when the backend's caches are created.
struct CacheSpec {
  // Sparse (InfLLM-v2) layers.
  int sparse_layers = 0;
  int kv_heads = 0, head_dim = 0, q_heads = 0;
  int block_size = 64;                  // tokens per KV page = one selection block
  int kernel_size = 32, kernel_stride = 16;  // K1; K2 uses 4x both
  int init_blocks = 1, local_blocks = 32, topk = 64;
  int max_pages = 0;                    // pages in the pool (shared by all sequences)
  // Lightning (Simple GLA) layers.
  int lightning_layers = 0;
  int lightning_heads = 0, lightning_dim = 0;
  std::vector<float> log_decay;         // g[h] per lightning head (spec §3.5)
  float lightning_scale = 0;            // s applied to q (spec §3.6)
  int max_slots = 0;                    // lightning state slots (one per live sequence, plus spares)
  float attn_scale = 0;                 // 1/sqrt(head_dim) for sparse layers
};

// One sequence's part of a packed batch. The host fills everything that depends only on lengths.
struct SeqEntry {
  int slot = 0;            // lightning state slot
  int64_t start = 0;       // first row of this sequence's tokens in the packed batch
  int64_t n_new = 0;       // Lq: tokens of this sequence in the call
  int64_t cached = 0;      // C0: tokens already in the caches before the call
  bool sparse = false;     // regime of the sparse layers for this call (spec §4.2, decided on host)
  std::vector<int32_t> pages;  // page table covering positions [0, cached + n_new)
};

struct BatchInfo {
  std::vector<int32_t> tokens;     // [N] token ids, packed sequence after sequence
  std::vector<int32_t> positions;  // [N] absolute position of each token in its sequence
  std::vector<SeqEntry> seqs;
  int64_t n_tokens() const { return int64_t(tokens.size()); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual std::string device_name() const { return name(); }  // the hardware, for reports
  virtual DType act_dtype() const = 0;  // dtype of activations between ops

  // Memory. Buffers are uninitialised.
  virtual std::unique_ptr<Buffer> alloc(size_t bytes) = 0;
  virtual void upload(Mat dst, const float* host) = 0;         // host f32 -> dst (any float dtype)
  virtual void download(const Mat& src, float* host) = 0;      // src (any float dtype) -> host f32
  virtual Weight load_weight(const TensorView& host) = 0;      // [out, in] checkpoint tensor
  virtual Weight load_vector(const TensorView& host) = 0;      // [n] norm weight, kept as [1, n]
  // A [rows, cols] weight filled on the backend itself with values mean + std * N(0,1) from a
  // counter-based generator (seed, index) — used to benchmark full-size models without a file.
  virtual Weight random_weight(int64_t rows, int64_t cols, float mean, float std, uint64_t seed) = 0;
  // A quantized matrix kept packed (docs/quantization.md); matmul decodes it on the fly.
  virtual Weight load_quantized_weight(const QuantMatrixView& q, const std::string& name) = 0;
  // Random packed codes with plausible scales (values of standard deviation ~std, mean ~0), for
  // benchmarks of quantized full-size models. The default builds the canonical host form and
  // calls load_quantized_weight; the CUDA backend generates it on the device.
  virtual Weight random_quantized_weight(WeightFormat format, int64_t rows, int64_t cols, int64_t group, float std,
                                         uint64_t seed);
  virtual void synchronize() {}

  // Caches. create_caches allocates the pools; reset_state zeroes one lightning slot;
  // copy_state copies a slot's lightning states (all layers) to another slot (snapshots).
  virtual void create_caches(const CacheSpec& spec) = 0;
  virtual void reset_state(int slot) = 0;
  virtual void copy_state(int src_slot, int dst_slot) = 0;

  // Makes the batch's metadata (tokens, positions, page tables) visible to the ops below.
  virtual void begin_batch(const BatchInfo& batch) = 0;

  // ---- ops ----
  // out[i] = table[token_i] * scale                               (out: [N, D])
  virtual void embed(const Weight& table, float scale, Mat out) = 0;
  // y = x · Wᵀ  (x: [N, in], y: [N, out]); y is act_dtype or F32 (the logits are written in F32)
  virtual void matmul(const Mat& x, const Weight& w, Mat y) = 0;
  // Row-wise RMSNorm over cols: y = x * rsqrt(mean(x²) + eps) * w  (w: [1, cols]); y may alias x.
  virtual void rmsnorm(const Mat& x, const Weight& w, float eps, Mat y) = 0;
  // In-place rotate-half RoPE of every head of x ([N, heads*head_dim]) at the batch positions.
  virtual void rope(Mat x, int head_dim, double theta) = 0;
  // Several weights applied to the same x: parts[i].y = x · parts[i].wᵀ. The default issues one
  // matmul per part; a backend may fuse them (CUDA decode: one grouped GEMV launch).
  struct MatmulPart {
    const Weight* w;
    Mat y;
  };
  virtual void matmul_group(const Mat& x, std::span<const MatmulPart> parts) {
    for (const MatmulPart& p : parts) matmul(x, *p.w, p.y);
  }
  // The SwiGLU MLP's first half: g = x·gateᵀ, u = x·upᵀ, act = silu(g)·u. The default is
  // matmul_group + silu_mul; a backend may fuse it (CUDA, packed weights, ≤ 8 rows: the activation
  // in the GEMV's epilogue, the same values; g and u are then not written).
  virtual void matmul_silu_mul(const Mat& x, const Weight& gate, const Weight& up, Mat g, Mat u, Mat act) {
    const MatmulPart parts[] = {{&gate, g}, {&up, u}};
    matmul_group(x, parts);
    silu_mul(g, u, act);
  }
  // The residual update fused with the next norm: h = h + alpha·a, then y = rmsnorm(h)·w (y must
  // not alias a). Same results as add_scaled followed by rmsnorm.
  virtual void add_rmsnorm(Mat h, const Mat& a, float alpha, const Weight& w, float eps, Mat y) {
    add_scaled(h, a, alpha);
    rmsnorm(h, w, eps, y);
  }
  // Per-head RMSNorm of q and k (weights [1, head_dim]) followed, when `rope`, by rotate-half RoPE
  // at the batch positions — the lightning layers' q/k path. Default: the four separate ops.
  virtual void qk_norm_rope(Mat q, Mat k, const Weight& q_norm, const Weight& k_norm, float eps, int head_dim,
                            bool rope, double theta) {
    rmsnorm(q.reshape(q.rows * q.cols / head_dim, head_dim), q_norm, eps, q.reshape(q.rows * q.cols / head_dim, head_dim));
    rmsnorm(k.reshape(k.rows * k.cols / head_dim, head_dim), k_norm, eps, k.reshape(k.rows * k.cols / head_dim, head_dim));
    if (rope) {
      this->rope(q, head_dim, theta);
      this->rope(k, head_dim, theta);
    }
  }
  // y = rmsnorm(x)·w gated by sigmoid(z): the lightning output norm and gate. Default: two ops.
  virtual void rmsnorm_gate(const Mat& x, const Weight& w, float eps, const Mat& z, Mat y) {
    rmsnorm(x, w, eps, y);
    sigmoid_mul(y, z, y);
  }
  // out = silu(g) * u                                             (elementwise)
  virtual void silu_mul(const Mat& g, const Mat& u, Mat out) = 0;
  // out = a * sigmoid(z)                                          (elementwise; out may alias a)
  virtual void sigmoid_mul(const Mat& a, const Mat& z, Mat out) = 0;
  // h = h + alpha * a                                             (residual update)
  virtual void add_scaled(Mat h, const Mat& a, float alpha) = 0;
  // out = x * s (elementwise; out may alias x)
  virtual void scale(const Mat& x, float s, Mat out) = 0;
  // out[r] = x[rows[r]]
  virtual void gather_rows(const Mat& x, std::span<const int64_t> rows, Mat out) = 0;

  // Lightning layer `layer` (index among lightning layers): Simple-GLA over each sequence's new
  // tokens, starting from and updating the state in the sequence's slot (spec §3.6–3.8).
  // q, k, v: [N, heads*dim] after q/k norm and RoPE; out: [N, heads*dim].
  virtual void lightning_attention(int layer, const Mat& q, const Mat& k, const Mat& v, Mat out) = 0;
  // The lightning mixer between its projections and o_proj (spec §3): per-head q/k RMSNorm and
  // RoPE, lightning_attention, then the output RMSNorm and sigmoid gate, into out. q and k may be
  // left as they were or normalised. Default: the separate ops; a backend may fuse some (CUDA
  // decode: the q/k norms inside the GLA step's launch), with the same values.
  struct LightningNorms {
    const Weight* q_norm = nullptr;  // with k_norm: per-head RMSNorm; null: q, k enter as they are
    const Weight* k_norm = nullptr;
    bool rope = false;               // RoPE at the batch positions
    double theta = 0;
    int head_dim = 0;
    const Weight* o_norm = nullptr;  // output RMSNorm over the row; null: none
    const Mat* z = nullptr;          // output gate: out·sigmoid(z); null: none
    float eps = 0;
  };
  virtual void lightning_block(int layer, Mat q, Mat k, const Mat& v, const LightningNorms& n, Mat out);
  // lightning_block's first part as separate ops: the q/k norms and RoPE of n applied in place.
  void lightning_qk(Mat q, Mat k, const LightningNorms& n);
  // lightning_block's last part: the output norm and gate of n applied to out in place.
  void lightning_output(const LightningNorms& n, Mat out);

  // Exact rollback of lightning layer `layer` (spec §6.2): sets the state in `slot` to the state
  // of `snapshot_slot` advanced by the first `keep` tokens of k, v ([>= keep, kv_heads*dim], the
  // post-norm/RoPE rows fed to lightning_attention), per head in fp32:
  //   S = γ^keep · S_snap + Σ_{j<keep} γ^{keep−1−j} k_j ⊗ v_j   (exponentials from the log-decay)
  // keep = 0 restores the snapshot. slot may equal snapshot_slot. Not pure: the default (defined
  // in backend/cpu/cpu_rollback.cpp, so this header needs no fmt) throws sala::Error.
  virtual void lightning_rollback(int layer, int slot, int snapshot_slot, const Mat& k, const Mat& v, int64_t keep);

  // Sparse layer `layer` (index among sparse layers): appends each sequence's new k, v to its
  // pages, extends K1/K2 (spec §4.4), then attends every new query to the sequence's keys up to
  // its own position — dense causal (§4.3) or InfLLM-v2 (§4.5–4.8) as SeqEntry::sparse says.
  // q: [N, q_heads*dim]; k, v: [N, kv_heads*dim]; out: [N, q_heads*dim].
  virtual void sparse_attention(int layer, const Mat& q, const Mat& k, const Mat& v, Mat out) = 0;
  // sparse_attention followed, when gate is given, by the output gate out = out·sigmoid(gate) (the
  // sparse layers' o_gate). Default: the two ops; a backend may fuse them (CUDA: the attention
  // kernels' stores), with the same values.
  virtual void sparse_block(int layer, const Mat& q, const Mat& k, const Mat& v, const Mat* gate, Mat out) {
    sparse_attention(layer, q, k, v, out);
    if (gate) sigmoid_mul(out, *gate, out);
  }

  // ---- Optional graph capture/replay of a whole forward (CUDA graphs; the CPU ignores it) ----
  // After begin_batch, the model calls graph_replay(key): true means the backend had a recording
  // for `key` (plus whatever of the batch it bakes into launches itself) and launched it, so the
  // ops must not be issued again. Otherwise the model calls graph_capture_begin(key), issues the
  // ops, and graph_capture_end(key); the backend may record them (and then launches the recording)
  // or just let them run. `key` must fix every op, shape and buffer address of the forward.
  virtual bool graph_replay(uint64_t key) { return false; }
  virtual void graph_capture_begin(uint64_t key) {}
  virtual void graph_capture_end(uint64_t key) {}
  struct GraphStats {
    bool enabled = false;
    int64_t replays = 0, captures = 0, eager = 0;  // forwards with a key, by how they ran
    double gpu_ms = 0;                             // device time of those forwards (events), summed
  };
  virtual GraphStats graph_stats() { return {}; }

  // ---- Memory as the backend sees it (sala bench, issue #6); -1: not known on this backend ----
  struct MemoryStats {
    int64_t used = -1;       // in use now: CUDA device-wide (cudaMemGetInfo); CPU process RSS
    int64_t peak = -1;       // high-water mark of `used` since reset_memory_peak (CUDA: highest seen
                             // by memory_stats calls)
    int64_t total = -1;      // device memory (CPU: physical RAM)
    int64_t allocated = -1;  // bytes the backend allocated itself and still holds (buffers + caches)
  };
  virtual MemoryStats memory_stats() { return {}; }
  virtual void reset_memory_peak() {}  // e.g. after a benchmark's own scratch buffers are freed

  // `--fp8-prefill` (docs/quantization.md "fp8 prefill"): products of per-row FP8 weights with at
  // least kW8A8PrefillMinRows rows (prompt chunks; decode steps of more than 64 sequences) quantize
  // each activation row to e4m3 with its own scale and multiply in fp8 (W8A8: y = s_x·s_w·Σ q_x·q_w);
  // fewer rows (decode, speculative verification of up to 64 rows) keep the weight-only product.
  // Off in a new backend (the command line's default: native_fp8). A backend that cannot run it says so here.
  virtual void set_fp8_prefill(bool on) { fp8_prefill_ = on; }
  bool fp8_prefill() const { return fp8_prefill_; }
  // Whether this backend multiplies fp8 natively (CUDA: fp8 tensor cores, compute capability 8.9+).
  // Where it does, the command line turns the fp8 prefill on unless --no-fp8-prefill is given, as
  // vLLM runs fp8 checkpoints in fp8 (docs/quantization.md, "Prefill").
  virtual bool native_fp8() const { return false; }
  // The fp8 prefill was turned on as that default, not asked for: notes about models without FP8
  // weights stay quiet.
  void set_fp8_prefill_by_default(bool on) { fp8_prefill_by_default_ = on; }
  bool fp8_prefill_by_default() const { return fp8_prefill_by_default_; }
  // `--int8-prefill`: the same for int8 and int4 weights: each activation row quantized to int8
  // (s_x = max|x| / 127, round to nearest even), exact int32 products on int8 tensor cores,
  // y = s_w·s_x·Σ q_x·q_w + c_w·s_x·Σ q_x. Per-row int8 weights (`sala quantize --format int8`)
  // enter as they are (q_w = code − 128, c_w = 128·s_w + b_w: zero for symmetric rows); int4 and
  // grouped int8 (MLX) rows are requantized per row to int8 (c_w = 0). Off by default.
  virtual void set_int8_prefill(bool on) { int8_prefill_ = on; }
  bool int8_prefill() const { return int8_prefill_; }

 protected:
  bool fp8_prefill_ = false;
  bool fp8_prefill_by_default_ = false;
  bool int8_prefill_ = false;
};

// Fewest rows of a product that `--fp8-prefill` and `--int8-prefill` quantize: above the 64 rows
// the packed decode GEMV takes (CUDA), so decode batches of up to 64 rows never see activation
// rounding.
constexpr int64_t kW8A8PrefillMinRows = 65;

// Backends available in this build: "cpu", and "cuda" when compiled with CUDA.
// batch_invariant: results of a row independent of the rest of the batch (CPU: f32 in a fixed
// order; CUDA: fixed decode kernels and splits, for batches of up to 64 rows of decode/verify).
std::unique_ptr<Backend> make_backend(const std::string& name, int threads = 0, bool batch_invariant = false);
std::vector<std::string> available_backends();

}  // namespace sala
