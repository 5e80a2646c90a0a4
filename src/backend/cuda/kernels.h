// Host-callable launchers of the CUDA kernels (implemented in the .cu files of this directory) and
// the plain-old-data structures the backend uploads for them in begin_batch. No CUDA C++ here, so
// the backend itself is ordinary C++ (cuda_backend.cpp).
#pragma once
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

namespace sala::cuda {

// Element types the kernels understand (activations may be F32 or BF16; F16 is accepted by the
// generic elementwise paths).
enum Dt : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Timing experiments (bench_skip.cpp, SALA_CUDA_BENCH_SKIP): whether a one-row launch of these
// kernels is skipped — outputs wrong, a warning printed once.
enum BenchSkip : int { kSkipAddNorm = 1, kSkipGateNorm = 2, kSkipGla = 4, kSkipAttention = 8 };
bool bench_skips(int kernels, int64_t rows);

// ---- per-batch metadata (built on the host in begin_batch, one upload per batch) ----
struct SeqMeta {
  int32_t slot, start, n_new, cached;
  int32_t sparse, page_off, n_pages, pad;
};

// One CTA of the attention kernel: 16 query rows (tokens × heads of one KV head) against one
// split of the unit's key chunks. Dense: chunks are 32-key tiles of [0, p_max]; sparse: chunks are
// the selected blocks of the unit's single token (selection list `sel_item`).
struct AttnItem {
  int32_t seq, row0, ntok, kvh;
  int32_t head0, nheads, nchunks, sparse;
  int32_t split, nsplit, part, sel_item;  // part: first partial slot of this unit (-1: no split)
  int32_t tpu, pad[3];                    // tokens per warp (shared-tile dense kernel)
};

// One (token row, all KV heads) that needs InfLLM-v2 block selection.
constexpr int kSelectGroupTokens = 8;  // prefill selection: tokens of one sequence per scoring CTA
constexpr int kSelectPoolCtas = 16;    // split selection: CTAs pooling one (item, KV head)'s block keys

struct SelItem {
  int32_t seq, row, p, T;
  int32_t ncol;       // stage-1 columns computed: min(n1(p+1), scored_columns(qb))
  int32_t vis2;       // K2 chunks visible: n2(p+1)
  int32_t nsel;       // blocks selected: min(topk + local, NB(T)) (< qb + 1 here)
  int32_t pad;
  int64_t cs_off;     // offset (floats) of this item's chunk scores, kv_heads × ncol
  int64_t key_off;    // offset (uint32) of this item's block keys, kv_heads × (qb + 1)
};

// One compressed chunk to build: mean of `window` keys from token `first` of sequence `seq`.
struct CompressJob {
  int32_t seq, first, window, level;  // level 1: K1, 2: K2
  int64_t dst_row;                    // row index in the level's pool (layer offset added by the kernel)
};

// Geometry of the sparse-layer pools (bf16), row = kv_heads × head_dim values.
struct PoolGeom {
  void* k;
  void* v;
  void* k1;
  void* k2;
  int32_t bs, kvh, d, max_pages;
  int32_t k1pp, k2pp, ks, st;
  int32_t init_blocks, local_blocks, topk, pad;
};

// ---- elementwise (elementwise.cu) ----
enum EwOp : int { kSiluMul = 0, kSigmoidMul = 1, kAddScaled = 2, kScale = 3 };
// out = op(a, b) elementwise over n values; for kAddScaled, a is h (read) and out is h (written).
void launch_elementwise(EwOp op, int64_t n, const void* a, Dt dta, const void* b, Dt dtb, void* out, Dt dto,
                        float alpha, cudaStream_t st);
void launch_rmsnorm(const void* x, Dt dtx, const void* w, Dt dtw, void* y, Dt dty, int64_t rows, int64_t cols,
                    float eps, cudaStream_t st);
// h += bf16(alpha·a); y = rmsnorm(h)·w, bf16 rows of 1024…16384 columns. Returns false (nothing
// launched) for other shapes/dtypes: the caller then issues add_scaled + rmsnorm.
bool launch_add_rmsnorm(void* h, const void* a, float alpha, const void* w, void* y, Dt dt, int64_t rows, int64_t cols,
                        float eps, cudaStream_t st);
// Per-head RMSNorm of bf16 q [q_rows head rows] and k [k_rows] (weights [head_dim]) and, when
// positions is not null, rotate-half RoPE — one launch. head_dim ≤ 128, multiple of 16; false
// (nothing launched) otherwise.
bool launch_qk_norm_rope(void* q, int64_t q_rows, const void* qw, void* k, int64_t k_rows, const void* kw, int q_heads,
                         int k_heads, int head_dim, float eps, const int32_t* positions, const float* inv_freq,
                         cudaStream_t st);
// y = bf16(rmsnorm(x)·w) · bf16(sigmoid(z)), bf16 rows of 1024…16384 columns; false otherwise.
bool launch_rmsnorm_gate(const void* x, const void* w, const void* z, void* y, int64_t rows, int64_t cols, float eps,
                         cudaStream_t st);
void launch_rope(void* x, Dt dt, int64_t rows, int64_t cols, int head_dim, const int32_t* positions,
                 const float* inv_freq, cudaStream_t st);
void launch_embed(const void* table, Dt dtt, int64_t cols, const int32_t* tokens, int64_t rows, float scale, void* out,
                  Dt dto, cudaStream_t st);
void launch_gather_rows(const void* x, Dt dtx, const int64_t* rows_idx, int64_t rows, int64_t cols, void* out, Dt dto,
                        cudaStream_t st);
// Up to kGatherInline row indices travel in the kernel's parameters (no copy, graph-capture safe).
constexpr int kGatherInline = 256;
struct GatherRows {
  int32_t idx[kGatherInline];
};
void launch_gather_rows_inline(const void* x, Dt dtx, const GatherRows& rows_idx, int64_t rows, int64_t cols,
                               void* out, Dt dto, cudaStream_t st);
void launch_convert(const void* src, Dt dts, void* dst, Dt dtd, int64_t n, cudaStream_t st);
// Programmatic dependent launch for the small decode kernels (norms, elementwise, GLA recurrent).
void set_small_kernel_pdl(bool on);
void launch_random_bf16(void* dst, int64_t n, float mean, float std, uint64_t seed, cudaStream_t st);

// ---- matrix products (gemv.cu; the large case is cuBLAS in cuda_backend.cpp) ----
// y[n, o] = Σ_i x[n, i] · W[o, i] for n < N ≤ 8; W bf16 [out, in] row-major.
// mode: 0 automatic, 1 FMA kernel, 2 tensor-core kernel (4 warps/CTA), 3 tensor-core (16 warps).
// pdl: launch with programmatic dependent launch (sm_90): the kernel loads its first weight stage
// into registers before waiting for the previous kernel's outputs.
void launch_gemv(const void* x, Dt dtx, int64_t ldx, const void* w, int64_t out, int64_t in, void* y, Dt dty,
                 int64_t ldy, int N, int mode, bool pdl, cudaStream_t st);
// Grouped decode GEMV: several weights with the same `in` applied to the same x in ONE launch
// (q/k/v/gate projections, gate/up): one ramp and tail instead of one per matrix, and small
// matrices become one large, bandwidth-efficient grid. Every y has dtype dty.
constexpr int kGemvMaxParts = 4;
struct GemvPart {
  const void* w;  // bf16 [out, in]
  void* y;        // [N, ldy]
  int64_t out, ldy;
};
struct GemvSet {
  GemvPart part[kGemvMaxParts];
  unsigned first[kGemvMaxParts + 1];  // first CTA of each part (filled by the launcher)
  int count;
};
void launch_gemv_set(const void* x, Dt dtx, int64_t ldx, GemvSet set, int64_t in, Dt dty, int N, int mode, bool pdl,
                     cudaStream_t st);

// ---- packed weights (quant_gemv.cu; layouts in backend/quant_layout.h) ----
struct QWeight {
  int fmt;              // qlayout::kFP8, kQ8, kQ4
  const void* codes;    // tile layout
  const void* params;   // tiles {s, b, s, b}: f32 per row, f16 grouped, or zero-packed (quant_layout.h)
  int64_t out, in, group;  // group == in: one scale per row
  int sym = 0;  // Q8 per row, every bias −128·scale (symmetric int8): the GEMV decodes q − 128, no Σx
  int zpack = 0;  // grouped Q4: zero points packed into the f16 scales, 4-byte entries (quant_layout.h)
};
// y[n, o] = Σ_i x[n, i] · W[o, i] for n < N ≤ 8, decoding the tiles in registers (bf16 mma,
// fp32 accumulation, scales and biases applied in fp32 per group). x bf16, 8-byte aligned rows
// (ldx % 4 == 0); y bf16 or f32. warps per CTA: 4, 8 or 16 (0: automatic). pdl as launch_gemv.
// split_ws (optional, split_ws_floats floats): workspace of the 9–32-row products of fewer than
// kQSplitMaxRows rows, whose columns are split kQSplitWays ways over CTAs (quant_gemv.cu):
// kQSplitWays · N · rows floats; without it they take another kernel.
constexpr int kQSplitWays = 8;
constexpr int64_t kQSplitMaxRows = 16384;
void launch_qgemv(const QWeight& w, const void* x, int64_t ldx, void* y, Dt dty, int64_t ldy, int N, int warps,
                  bool pdl, cudaStream_t st, float* split_ws = nullptr, size_t split_ws_floats = 0);
// Products of more rows than one GEMV launch takes (N > 32) with a packed weight on Hopper tensor cores,
// the codes decoded in the GEMM's load path (quant_gemm.cu): y[n, o] = Σ x[n, k]·w[o, k] with the
// dequantize kernel's bf16 weights, fp32 sums. x bf16 rows of ldx elements; y bf16 or f32.
// qgemm_preferred: whether it is the faster path for this product (measured crossover;
// SALA_CUDA_QGEMM / set_qgemm_mode: 0 never, 1 automatic, 2–6 always, the staged / overlapped /
// skewed / pipelined variant or the warp-specialized kernel, 7 automatic without the latter — tests,
// benchmarks); qgemm_unfit says why a shape or build cannot take it (empty: it can);
// qgemm_available: the build has sm_90a code for this GPU.
bool qgemm_preferred(const QWeight& w, int N);
// Whether later loads of grouped int4 with integer zero points take the zero-packed parameter form
// (default on; SALA_CUDA_ZPACK=0 off): tests load one matrix both ways (cuda_quant.cpp).
void set_zero_pack(bool on);
bool qgemm_available();
std::string qgemm_unfit(const QWeight& w, const void* x, int64_t ldx);
// split_ws (f32, qgemm_split_floats(w, N) of them; null: no split): where one token tile's row tiles
// would leave SMs idle (a 4096-row matrix has 32), qgemm_splits(w, N) CTAs share each tile's K
// range and a second kernel adds their partial sums in order (deterministic).
int qgemm_splits(const QWeight& w, int N);
size_t qgemm_split_floats(const QWeight& w, int N);  // 0: no split for this product
void launch_qgemm(const QWeight& w, const void* x, int64_t ldx, void* y, Dt dty, int64_t ldy, int N, cudaStream_t st,
                  float* split_ws = nullptr);
void set_qgemm_mode(int mode);
// Grouped packed GEMV (as GemvSet): weights with the same format, in and group applied to the same
// x in one launch (q/k/v/z, gate/up: ~11 µs per 4096×4096 fp8 launch alone, latency bound). Each
// CTA computes its part's row block as a launch of that part alone with the same warps per CTA
// would (bit for bit); the automatic launch shape is that of one matrix of all the parts' rows.
struct QGemvPart {
  QWeight w;
  void* y;  // [N, ldy]
  int64_t ldy;
};
struct QGemvSet {
  QGemvPart part[kGemvMaxParts];
  unsigned first[kGemvMaxParts + 1];  // first CTA of each part (filled by the launcher)
  int count;
};
// Every part symmetric int8 (QWeight::sym): the GEMVs decode q − 128 without the bias term.
inline bool symmetric_q8(const QGemvSet& set) {
  for (int i = 0; i < set.count; ++i)
    if (!set.part[i].w.sym) return false;
  return true;
}
void launch_qgemv_set(const QGemvSet& set, const void* x, int64_t ldx, Dt dty, int N, int warps, bool pdl,
                      cudaStream_t st, float* split_ws = nullptr, size_t split_ws_floats = 0);
// The MLP's act = silu(x·gateᵀ)·(x·upᵀ) for N ≤ 8 rows in one launch (bf16 [N, ldact]; gate and up
// of one format and shape): what launch_qgemv_set of the pair followed by silu_mul computes.
void launch_qgemv_act(const QWeight& gate, const QWeight& up, const void* x, int64_t ldx, void* act, int64_t ldact,
                      int N, bool pdl, cudaStream_t st);
// Rows [row0, row0 + rows) of W (row0 % 16 == 0) as bf16 row-major [rows, in] (prefill: cuBLAS
// multiplies them).
void launch_qdequant(const QWeight& w, int64_t row0, int64_t rows, void* dst, cudaStream_t st);
// W8A8 prefill (w8a8_prefill.cu). Activations: bf16 rows x [N, ldx] (in ≤ kQuantRowsMaxIn: a row
// is held in registers) -> e4m3 or int8 q [N, in] (row-major) with one scale per row (max|x| / 448
// or / 127; int8 also scale·Σq). Weights: rows
// [row0, row0 + rows) (row0 % 16 == 0) of a per-row FP8 or Q8 weight as row-major bytes [rows, in]
// (Q8: code − 128) with their scales [rows] (Q8: and offsets 128·s + b; FP8: offsets unused).
// int8 epilogue: cuBLASLt's int32 products (column-major [rows, N]) -> y[n, r] =
// fma(offset_r, (s·Σq)_n, (acc·scale_r)·s_n).
constexpr int64_t kQuantRowsMaxIn = 16384;
void launch_quant_rows_fp8(const void* x, int64_t ldx, int64_t N, int64_t in, void* q, float* scales,
                           cudaStream_t st);
void launch_quant_rows_int8(const void* x, int64_t ldx, int64_t N, int64_t in, void* q, float* scales,
                            float* scaled_sums, cudaStream_t st);
void launch_qcanonical(const QWeight& w, int64_t row0, int64_t rows, void* codes, float* scales, float* offsets,
                       cudaStream_t st);
void launch_int8_epilogue(const int32_t* acc, int64_t rows, int64_t N, const float* sw, const float* cw,
                          const float* sx, const float* sxsum, void* y, Dt dty, int64_t ldy, cudaStream_t st);
// --int8-prefill for Q4 / grouped Q8 (quant_gemv.cu). launch_qrow_int8_scales: scales[r] =
// max |w[r, :]| / 127 of the bf16 dequantization (1 for a zero row), for every row (once per
// weight, at load). launch_qrequant_int8: rows [row0, row0 + rows) (row0 % 16 == 0) as int8
// requantized with those scales (offset 0) — the bits of launch_qdequant followed by
// launch_quant_rows_int8, in one pass — row-major [rows, in] (cuBLASLt), or with tiles in the 8-bit
// tile layout of a [rows, in] matrix (w8a8_gemm.cu; in % 32 == 0).
void launch_qrow_int8_scales(const QWeight& w, float* scales, cudaStream_t st);
void launch_qrequant_int8(const QWeight& w, const float* row_scales, int64_t row0, int64_t rows, void* codes,
                          float* scales, float* offsets, bool tiles, cudaStream_t st);
// Canonical codes (row-major, QuantMatrixView) -> tile layout, on the device.
void launch_qtile(const QWeight& w, const void* canonical, void* tiles, cudaStream_t st);
// Random codes (no fp8 NaN codes) and params {s·f, b·f}, f ∈ [0.75, 1.25) per (row, group);
// padded rows get s = b = 0.
void launch_qrandom(const QWeight& w, void* codes, void* params, float scale, float bias, uint64_t seed,
                    cudaStream_t st);

// ---- lightning (gla.cu) ----
struct GlaArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  Dt dt;                    // dtype of q, k, v, out (all the same)
  int64_t ldq, ldk, ldv, ldo;
  float* states;            // [slot][layer][head][d][d]
  int32_t layer, layers, heads, kv_heads, d;
  const float* log_decay;   // [heads] (device)
  float scale;
  const SeqMeta* seqs;
  const int32_t* seq_list;  // sequences handled by this launch
  int32_t n_list;
  bool force_fma;           // chunked: use the fp32 FMA kernel even where the tensor-core one applies
};
void launch_gla_recurrent(const GlaArgs& a, cudaStream_t st);
void launch_gla_chunked(const GlaArgs& a, cudaStream_t st);
// The recurrent step with the per-head q/k RMSNorm and RoPE in the kernel (decode, verify): q and
// k enter un-normalised and are not written; the values of qk_norm_rope followed by
// launch_gla_recurrent. bf16, d = 64 or 128; returns false for what it does not cover.
struct GlaQkNorms {
  const void* q_norm;        // [d] bf16
  const void* k_norm;
  const int32_t* positions;  // RoPE at the batch positions (with inv_freq); null: none
  const float* inv_freq;
  float eps;
};
bool launch_gla_recurrent_normed(const GlaArgs& a, const GlaQkNorms& n, cudaStream_t st);

// ---- lightning rollback for speculative decoding (rollback.cu) ----
// states[slot][layer][h] = exp(keep·g_h)·states[snapshot_slot][layer][h] + Σ_{j<keep}
// exp((keep−1−j)·g_h)·k_j ⊗ v_j, for keep ≥ 1 (keep 0 is a plain copy, done by the host).
struct RollbackArgs {
  const void* k;            // [>= keep, kv_heads*d], row stride ldk
  const void* v;
  Dt dt;                    // dtype of k and v
  int64_t ldk, ldv;
  float* states;            // [slot][layer][head][d][d]
  const float* log_decay;   // [heads] (device)
  int32_t slot, snapshot_slot, layer, layers, heads, kv_heads, d, keep;
};
void launch_lightning_rollback(const RollbackArgs& a, cudaStream_t st);

// ---- sparse layers (cache.cu, select.cu, attention.cu) ----
struct SparseArgs {
  PoolGeom pool;
  int32_t layer;
  int32_t q_heads;          // all q heads; G = q_heads / kv_heads
  float scale;              // softmax scale (1/sqrt(d))
  const void* q;
  Dt dtq;
  int64_t ldq;
  void* out;
  Dt dto;
  int64_t ldo;
  const void* gate;         // null, or the output gate [rows, ldo]: out = attention·sigmoid(gate)
  Dt dtg;
  const SeqMeta* seqs;
  const int32_t* pages;     // flattened page tables
  // selection
  const SelItem* sel_items;
  int32_t n_sel_items;
  int32_t kmax;             // topk + local_blocks: stride of the selection lists
  const int32_t* sel_groups;  // fused path: first item of each token group, then n_sel_items
  int32_t n_sel_groups;
  int32_t sel_splits;       // CTAs per (item, KV head) scoring the keys: 1 = one fused kernel
  int32_t sel_prefill;      // token groups (prefill): the warp-per-token kernel instead of the fused one
  float* sel_ml;            // split scratch: [item][kv head][split][G] (max, sum) of K2 pass
  float* chunk_scores;      // scratch (SelItem::cs_off)
  uint32_t* block_keys;     // scratch (SelItem::key_off)
  uint32_t* sel_cand;       // split path: [item][kv head][kSelectPoolCtas][kmax] candidate keys
  int32_t* sel;             // [n_sel_items][kv_heads][kmax]
  // attention
  const AttnItem* items;
  int32_t n_items;
  float* partial;           // [slot][16][d] unnormalised outputs of split units
  float* partial_ml;        // [slot][16][2] (max, sum) in the log2 domain
  const int32_t* combine_items;  // indices of items with split == 0 and nsplit > 1
  int32_t n_combine;
  // dense prefill: CTA = 4 warps = 4 consecutive token groups sharing every K/V tile
  const AttnItem* dense_items;
  int32_t n_dense_items;
  int32_t max_blocks;       // blocks of the longest sequence with sparse shared-tile items (0: none)
};
void launch_append_kv(const PoolGeom& pool, int layer, const void* k, const void* v, Dt dt, int64_t ldk, int64_t ldv,
                      const int64_t* row_dst, int64_t n_rows, cudaStream_t st);
void launch_compress(const PoolGeom& pool, int layer, const CompressJob* jobs, int n_jobs, const SeqMeta* seqs,
                     const int32_t* pages, cudaStream_t st);
void launch_select(const SparseArgs& a, cudaStream_t st);
void launch_attention(const SparseArgs& a, cudaStream_t st);

}  // namespace sala::cuda
