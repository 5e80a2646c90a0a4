// Elementwise and row-wise kernels: silu_mul, sigmoid_mul, add_scaled, scale, rmsnorm, rope,
// embed, gather_rows, dtype conversion, random fill.
//
// Speed of light (bf16 activations, H100 ~3.35 TB/s HBM, ~3.0 TB/s measured copy):
//   * silu_mul / sigmoid_mul: read 2n + write n bf16 = 6n bytes, ~10 FLOP/elem → bandwidth bound.
//     MLP of one 512-token chunk: n = 512·16384 → 50 MB → ~17 µs.
//   * add_scaled: 6n bytes (read h, a; write h). scale: 4n bytes.
//   * rmsnorm: read 2·rows·cols (+ the weight once), write rows·cols·2 bytes; ~4 FLOP/elem.
//     Decode (1 × 4096): 16 KB — launch-latency bound (~2-3 µs), not bandwidth.
//   * rope: read+write rows·cols·2 bytes, one sincos per (row, pair) → bandwidth bound for bf16.
//   * embed / gather_rows: rows·cols·2 bytes each way.
// All fast paths move 16 bytes per thread access; mixed-dtype cases use a generic scalar path.
// Measured (H200, 2026-11-22, vs 4.22 TB/s copy): silu_mul 512×16384 15.3 µs (78%); rmsnorm
// 2048×4096 8.3 µs (96%); decode-sized calls (1 row) 3.5-5 µs: launch latency, not bandwidth.
#include <cmath>
#include <initializer_list>

#include "backend/cuda/common.cuh"
#include "backend/cuda/head_norm.cuh"
#include "core/rng.h"

namespace sala::cuda {

namespace {

template <int OP>
__device__ __forceinline__ float ew_apply(float a, float b, float alpha, int dto) {
  if constexpr (OP == kSiluMul) {
    return rnd(dto, silu(a)) * b;
  } else if constexpr (OP == kSigmoidMul) {
    const float g = 1.0f / (1.0f + expf(-b));
    return a * rnd(dto, g);
  } else if constexpr (OP == kAddScaled) {
    return a + rnd(dto, alpha * b);
  } else {
    return a * alpha;
  }
}

template <int OP>
__global__ void ew_bf16x8(int64_t n8, const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* out,
                          float alpha) {
  launch_dependents();  // the next kernel may start loading its weights (common.cuh)
  grid_dep_wait();  // launched with PDL in decode (g_small_pdl)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    float fa[8], fb[8], fo[8];
    unpack8(a[i], fa);
    if constexpr (OP != kScale) unpack8(b[i], fb);
#pragma unroll
    for (int j = 0; j < 8; ++j) fo[j] = ew_apply<OP>(fa[j], OP != kScale ? fb[j] : 0.f, alpha, kBF16);
    out[i] = pack8(fo);
  }
}

template <int OP>
__global__ void ew_generic(int64_t n, const void* a, int dta, const void* b, int dtb, void* out, int dto, float alpha) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = ldf(a, dta, i);
    const float y = OP != kScale ? ldf(b, dtb, i) : 0.f;
    stf(out, dto, i, ew_apply<OP>(x, y, alpha, dto));
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <int OP>
void ew_launch(int64_t n, const void* a, Dt dta, const void* b, Dt dtb, void* out, Dt dto, float alpha,
               cudaStream_t st) {
  const bool fast = dta == kBF16 && dto == kBF16 && (OP == kScale || dtb == kBF16) && n % 8 == 0 && aligned16(a) &&
                    aligned16(out) && (OP == kScale || aligned16(b));
  if (fast) {
    const int64_t n8 = n / 8;
    launch_pdl(g_small_pdl, ew_bf16x8<OP>, dim3(grid_for(n8, 256, 132 * 16)), dim3(256), 0, st, n8,
               static_cast<const uint4*>(a), static_cast<const uint4*>(b), static_cast<uint4*>(out), alpha);
  } else {
    ew_generic<OP><<<grid_for(n, 256, 132 * 16), 256, 0, st>>>(n, a, dta, b, dtb, out, dto, alpha);
  }
  SALA_CUDA_LAUNCH("elementwise kernel");
}

// ---- rmsnorm: one warp per row ----
__global__ void rmsnorm_bf16(const bf16* x, const bf16* w, bf16* y, int64_t rows, int cols, float eps) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * cols);
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  uint4* yr = reinterpret_cast<uint4*>(y + row * cols);
  const int n8 = cols / 8;
  float ss = 0.f;
  for (int i = lane; i < n8; i += 32) {
    float f[8];
    unpack8(xr[i], f);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(cols) + eps);
  for (int i = lane; i < n8; i += 32) {
    float f[8], g[8];
    unpack8(xr[i], f);
    unpack8(wr[i], g);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = rbf(f[j] * inv) * g[j];
    yr[i] = pack8(f);
  }
}

// The wide row kernels' shared steps (256 threads, 8 warps, one row per CTA): a thread's sum of
// squares of its pieces, and 1 / rms of the row from every thread's partial sum.
template <int PPT>
__device__ __forceinline__ float sum_squares(const uint4 (&v)[PPT]) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < PPT; ++i) {
    float f[8];
    unpack8(v[i], f);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
  }
  return ss;
}
__device__ __forceinline__ float block_inv_rms(float ss, float* red, int cols, float eps) {
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) tot += red[i];
  return 1.0f / sqrtf(tot / float(cols) + eps);
}

// A thread's pieces (tid + 256·i, zeros past the row) of a row of n8 16-byte pieces.
template <int PPT>
__device__ __forceinline__ void load_row_pieces(const uint4* r, int n8, uint4 (&v)[PPT]) {
#pragma unroll
  for (int i = 0; i < PPT; ++i) {
    const int p = int(threadIdx.x) + 256 * i;
    v[i] = p < n8 ? r[p] : make_uint4(0, 0, 0, 0);
  }
}
// The norm weight's pieces: weights are never written by earlier kernels, so the wide kernels load
// them before their dependency wait — off the path after the reduction.
template <int PPT>
__device__ __forceinline__ void load_weight_pieces(const bf16* w, int n8, uint4 (&wv)[PPT]) {
  load_row_pieces(reinterpret_cast<const uint4*>(w), n8, wv);
}

// Wide rows (≥ 1024 bf16): one CTA of 256 threads per row, the row held in registers (PPT
// 16-byte pieces per thread), so every load is issued before the first use: one memory round trip.
template <int PPT>
__global__ void __launch_bounds__(256) rmsnorm_bf16_wide(const bf16* x, const bf16* w, bf16* y, int cols, float eps) {
  launch_dependents();  // the next kernel may start loading its weights (common.cuh)
  const int n8 = cols / 8, tid = threadIdx.x;
  uint4 wv[PPT];
  load_weight_pieces(w, n8, wv);
  grid_dep_wait();  // launched with PDL in decode (g_small_pdl)
  __shared__ float red[8];
  const int64_t row = blockIdx.x;
  uint4* yr = reinterpret_cast<uint4*>(y + row * cols);
  uint4 v[PPT];
  load_row_pieces(reinterpret_cast<const uint4*>(x + row * cols), n8, v);
  const float ss = sum_squares(v);
  const float inv = block_inv_rms(ss, red, cols, eps);
#pragma unroll
  for (int i = 0; i < PPT; ++i) {
    const int p = tid + 256 * i;
    if (p >= n8) continue;
    float f[8], g[8];
    unpack8(v[i], f);
    unpack8(wv[i], g);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = rbf(f[j] * inv) * g[j];
    yr[p] = pack8(f);
  }
}

// Residual update fused with the next RMSNorm (decode: one launch instead of two):
// h = h + bf16(alpha·a) stored as bf16, then y = bf16(h·inv)·w — the same rounding points and
// summation order as add_scaled followed by rmsnorm_bf16_wide, so results are bit-identical.
template <int PPT>
__global__ void __launch_bounds__(256) add_rmsnorm_bf16_wide(bf16* h, const bf16* a, float alpha, const bf16* w, bf16* y,
                                                             int cols, float eps) {
  launch_dependents();  // the next kernel may start loading its weights (common.cuh)
  const int n8 = cols / 8, tid = threadIdx.x;
  uint4 wv[PPT], v[PPT], av[PPT];
  load_weight_pieces(w, n8, wv);
  grid_dep_wait();  // launched with PDL in decode (g_small_pdl)
  __shared__ float red[8];
  const int64_t row = blockIdx.x;
  uint4* hr = reinterpret_cast<uint4*>(h + row * cols);
  uint4* yr = reinterpret_cast<uint4*>(y + row * cols);
  load_row_pieces(hr, n8, v);
  load_row_pieces(reinterpret_cast<const uint4*>(a + row * cols), n8, av);
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < PPT; ++i) {
    float f[8], g[8];
    unpack8(v[i], f);
    unpack8(av[i], g);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = rbf(f[j] + rbf(alpha * g[j]));
    v[i] = pack8(f);
    if (tid + 256 * i < n8) hr[tid + 256 * i] = v[i];
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
  }
  const float inv = block_inv_rms(ss, red, cols, eps);
#pragma unroll
  for (int i = 0; i < PPT; ++i) {
    const int p = tid + 256 * i;
    if (p >= n8) continue;
    float f[8], g[8];
    unpack8(v[i], f);
    unpack8(wv[i], g);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = rbf(f[j] * inv) * g[j];
    yr[p] = pack8(f);
  }
}

__global__ void rmsnorm_generic(const void* x, int dtx, const void* w, int dtw, void* y, int dty, int64_t rows,
                                int cols, float eps) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float ss = 0.f;
  for (int c = lane; c < cols; c += 32) {
    const float v = ldf(x, dtx, row * cols + c);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(cols) + eps);
  for (int c = lane; c < cols; c += 32) {
    const float v = ldf(x, dtx, row * cols + c);
    stf(y, dty, row * cols + c, rnd(dty, v * inv) * ldf(w, dtw, c));
  }
}

// ---- rope: one thread per (row, head, pair) ----
__global__ void rope_kernel(void* x, int dt, int64_t rows, int64_t cols, int head_dim, const int32_t* positions,
                            const float* inv_freq) {
  const int half = head_dim / 2;
  const int64_t heads = cols / head_dim;
  const int64_t total = rows * heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int i = int(idx % half);
    const int64_t rh = idx / half;
    const int64_t r = rh / heads, h = rh % heads;
    const float angle = float(positions[r]) * inv_freq[i];
    float sn, cs;
    sincosf(angle, &sn, &cs);
    const int64_t base = r * cols + h * head_dim;
    const float a = ldf(x, dt, base + i), b = ldf(x, dt, base + i + half);
    stf(x, dt, base + i, a * cs - b * sn);
    stf(x, dt, base + i + half, b * cs + a * sn);
  }
}

// ---- fused per-head q/k RMSNorm + RoPE (lightning layers at decode: 1 launch instead of 4) ----
// A half-warp owns one (token, head) row of head_dim ≤ 128 bf16 values, 8 per lane, exactly as
// rmsnorm_bf16 lays them out (same summation order: the reduction over lanes 0..15 matches
// warp_sum with idle upper lanes), the normalised row is rounded to bf16 like the stored rmsnorm
// output, and the rotate-half partner of lane l is lane l ± head_dim/16, read by shuffle — so the
// result is bit-identical to rmsnorm followed by rope_kernel.
__global__ void __launch_bounds__(256) qk_norm_rope_bf16(bf16* q, int64_t q_rows, const bf16* qw, bf16* k,
                                                         int64_t k_rows, const bf16* kw, int q_heads, int k_heads,
                                                         int head_dim, float eps, const int32_t* positions,
                                                         const float* inv_freq) {
  launch_dependents();  // the next kernel may start loading its weights (common.cuh)
  const int64_t hr = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 16;  // global head row
  const int lane = threadIdx.x % 16;
  const unsigned mask = 0xffffu << (threadIdx.x % 32 / 16 * 16);
  const bool is_q = hr < q_rows;
  if (!is_q && hr >= q_rows + k_rows) return;  // whole half-warps exit together
  const int64_t row = is_q ? hr : hr - q_rows;
  bf16* x = (is_q ? q : k) + row * head_dim;
  const int64_t token = row / (is_q ? q_heads : k_heads);
  // The weight and the rotation (batch metadata) before the wait; q and k after it.
  const HeadNormLane c = head_norm_lane(is_q ? qw : kw, head_dim, positions ? float(positions[token]) : 0.f,
                                        positions ? inv_freq : nullptr, lane);
  grid_dep_wait();  // launched with PDL in decode (g_small_pdl)
  const bool has = lane < head_dim / 8;
  float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (has) unpack8(reinterpret_cast<const uint4*>(x)[lane], f);
  norm_rope_half_warp(f, c, head_dim, eps, positions != nullptr, lane, mask);
  if (has) reinterpret_cast<uint4*>(x)[lane] = pack8(f);
}

// ---- fused output RMSNorm + sigmoid gate: y = bf16(bf16(rmsnorm(x)·w) · bf16(sigmoid(z))) ----
// Same rounding points and order as rmsnorm_bf16_wide followed by the sigmoid_mul kernel.
template <int PPT>
__global__ void __launch_bounds__(256) rmsnorm_gate_bf16_wide(const bf16* x, const bf16* w, const bf16* z, bf16* y,
                                                              int cols, float eps) {
  launch_dependents();  // the next kernel may start loading its weights (common.cuh)
  const int n8 = cols / 8, tid = threadIdx.x;
  uint4 wv[PPT], v[PPT], zv[PPT];
  load_weight_pieces(w, n8, wv);
  grid_dep_wait();  // launched with PDL in decode (g_small_pdl)
  __shared__ float red[8];
  const int64_t row = blockIdx.x;
  uint4* yr = reinterpret_cast<uint4*>(y + row * cols);
  load_row_pieces(reinterpret_cast<const uint4*>(x + row * cols), n8, v);
  load_row_pieces(reinterpret_cast<const uint4*>(z + row * cols), n8, zv);
  const float ss = sum_squares(v);
  const float inv = block_inv_rms(ss, red, cols, eps);
#pragma unroll
  for (int i = 0; i < PPT; ++i) {
    const int p = tid + 256 * i;
    if (p >= n8) continue;
    float f[8], g[8], zz[8];
    unpack8(v[i], f);
    unpack8(wv[i], g);
    unpack8(zv[i], zz);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = rbf(rbf(f[j] * inv) * g[j]) * rbf(1.0f / (1.0f + expf(-zz[j])));
    yr[p] = pack8(f);
  }
}

// ---- embed / gather ----
__global__ void embed_bf16x8(const uint4* table, int64_t cols8, const int32_t* tokens, int64_t rows, float scale,
                             uint4* out) {
  const int64_t total = rows * cols8;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / cols8, c = idx % cols8;
    float f[8];
    unpack8(table[int64_t(tokens[r]) * cols8 + c], f);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] *= scale;
    out[idx] = pack8(f);
  }
}

__global__ void embed_generic(const void* table, int dtt, int64_t cols, const int32_t* tokens, int64_t rows,
                              float scale, void* out, int dto) {
  const int64_t total = rows * cols;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    stf(out, dto, idx, ldf(table, dtt, int64_t(tokens[r]) * cols + c) * scale);
  }
}

__global__ void gather_kernel(const void* x, int dtx, const int64_t* rows_idx, int64_t rows, int64_t cols, void* out,
                              int dto) {
  const int64_t total = rows * cols;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    stf(out, dto, idx, ldf(x, dtx, rows_idx[r] * cols + c));
  }
}

__global__ void gather_inline_kernel(const void* x, int dtx, GatherRows rows_idx, int64_t rows, int64_t cols,
                                     void* out, int dto) {
  const int64_t total = rows * cols;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    stf(out, dto, idx, ldf(x, dtx, int64_t(rows_idx.idx[r]) * cols + c));
  }
}

__global__ void convert_kernel(const void* src, int dts, void* dst, int dtd, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    stf(dst, dtd, i, ldf(src, dts, i));
}

__global__ void random_kernel(bf16* dst, int64_t n, float mean, float std, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(mean + std * normal01(seed, uint64_t(i)));
}

}  // namespace

void launch_elementwise(EwOp op, int64_t n, const void* a, Dt dta, const void* b, Dt dtb, void* out, Dt dto,
                        float alpha, cudaStream_t st) {
  if (n <= 0) return;
  switch (op) {
    case kSiluMul: return ew_launch<kSiluMul>(n, a, dta, b, dtb, out, dto, alpha, st);
    case kSigmoidMul: return ew_launch<kSigmoidMul>(n, a, dta, b, dtb, out, dto, alpha, st);
    case kAddScaled: return ew_launch<kAddScaled>(n, a, dta, b, dtb, out, dto, alpha, st);
    case kScale: return ew_launch<kScale>(n, a, dta, b, dtb, out, dto, alpha, st);
  }
}

void launch_rmsnorm(const void* x, Dt dtx, const void* w, Dt dtw, void* y, Dt dty, int64_t rows, int64_t cols,
                    float eps, cudaStream_t st) {
  if (rows <= 0) return;
  const unsigned blocks = unsigned((rows + 7) / 8);
  const bool vec = dtx == kBF16 && dtw == kBF16 && dty == kBF16 && cols % 8 == 0 && aligned16(x) && aligned16(w) &&
                   aligned16(y);
  if (vec && cols >= 1024 && cols <= 8 * 256 * 8) {
    const int ppt = int((cols / 8 + 255) / 256);
    auto go = [&](auto kernel) {
      launch_pdl(g_small_pdl, kernel, dim3(unsigned(rows)), dim3(256), 0, st, static_cast<const bf16*>(x),
                 static_cast<const bf16*>(w), static_cast<bf16*>(y), int(cols), eps);
    };
    if (ppt <= 1) go(rmsnorm_bf16_wide<1>);
    else if (ppt <= 2) go(rmsnorm_bf16_wide<2>);
    else if (ppt <= 4) go(rmsnorm_bf16_wide<4>);
    else go(rmsnorm_bf16_wide<8>);
  } else if (vec)
    rmsnorm_bf16<<<blocks, 256, 0, st>>>(static_cast<const bf16*>(x), static_cast<const bf16*>(w),
                                         static_cast<bf16*>(y), rows, int(cols), eps);
  else
    rmsnorm_generic<<<blocks, 256, 0, st>>>(x, dtx, w, dtw, y, dty, rows, int(cols), eps);
  SALA_CUDA_LAUNCH("rmsnorm kernel");
}

namespace {

// Dynamic shared memory for a one-row norm launch (decode, batch 1) that it does not use: enough that
// no product CTA fits on its SM beside it, so that its few loads do not queue behind a product
// CTA's weight copies on the same SM (an SM draws a few tens of GB/s). H100, 4K batch 1, both
// norms: fp8 / int8 + lm_head −0.02 to −0.04 ms per step, int4 and bf16 within noise
// (bench/results/2026-11-27-h100-attention-split.md, run 16).
constexpr int kSoloSmem = 150 * 1024;

// kSoloSmem with every listed kernel's attribute raised to it (call once), or 0 where the device
// cannot grant that much.
template <typename... Kernel>
size_t solo_smem_for(Kernel... kernels) {
  int dev = 0, optin = 0;
  SALA_CUDA_CHECK(cudaGetDevice(&dev));
  SALA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (optin < kSoloSmem) return 0;
  for (const void* k : {reinterpret_cast<const void*>(kernels)...})
    SALA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSoloSmem));
  return kSoloSmem;
}
}  // namespace

bool launch_add_rmsnorm(void* h, const void* a, float alpha, const void* w, void* y, Dt dt, int64_t rows, int64_t cols,
                        float eps, cudaStream_t st) {
  const bool ok = dt == kBF16 && cols % 8 == 0 && cols >= 1024 && cols <= 8 * 256 * 8 && aligned16(h) &&
                  aligned16(a) && aligned16(w) && aligned16(y);
  if (!ok || rows <= 0) return false;
  if (bench_skips(kSkipAddNorm, rows)) return true;
  const int ppt = int((cols / 8 + 255) / 256);
  static const size_t solo = solo_smem_for(add_rmsnorm_bf16_wide<1>, add_rmsnorm_bf16_wide<2>,
                                           add_rmsnorm_bf16_wide<4>, add_rmsnorm_bf16_wide<8>);
  const size_t smem = rows == 1 ? solo : 0;
  auto go = [&](auto kernel) {
    launch_pdl(g_small_pdl, kernel, dim3(unsigned(rows)), dim3(256), smem, st, static_cast<bf16*>(h),
               static_cast<const bf16*>(a), alpha, static_cast<const bf16*>(w), static_cast<bf16*>(y), int(cols), eps);
  };
  if (ppt <= 1) go(add_rmsnorm_bf16_wide<1>);
  else if (ppt <= 2) go(add_rmsnorm_bf16_wide<2>);
  else if (ppt <= 4) go(add_rmsnorm_bf16_wide<4>);
  else go(add_rmsnorm_bf16_wide<8>);
  SALA_CUDA_LAUNCH("add_rmsnorm kernel");
  return true;
}

bool launch_qk_norm_rope(void* q, int64_t q_rows, const void* qw, void* k, int64_t k_rows, const void* kw, int q_heads,
                         int k_heads, int head_dim, float eps, const int32_t* positions, const float* inv_freq,
                         cudaStream_t st) {
  const bool ok = head_dim % 16 == 0 && head_dim <= 128 && aligned16(q) && aligned16(k) && aligned16(qw) &&
                  aligned16(kw);
  if (!ok) return false;
  const int64_t threads = (q_rows + k_rows) * 16;
  if (threads == 0) return true;
  launch_pdl(g_small_pdl, qk_norm_rope_bf16, dim3(unsigned((threads + 255) / 256)), dim3(256), 0, st,
      static_cast<bf16*>(q), q_rows, static_cast<const bf16*>(qw), static_cast<bf16*>(k), k_rows,
      static_cast<const bf16*>(kw), q_heads, k_heads, head_dim, eps, positions, inv_freq);
  SALA_CUDA_LAUNCH("qk_norm_rope kernel");
  return true;
}

bool launch_rmsnorm_gate(const void* x, const void* w, const void* z, void* y, int64_t rows, int64_t cols, float eps,
                         cudaStream_t st) {
  const bool ok = cols % 8 == 0 && cols >= 1024 && cols <= 8 * 256 * 8 && aligned16(x) && aligned16(w) &&
                  aligned16(z) && aligned16(y);
  if (!ok || rows <= 0) return false;
  if (bench_skips(kSkipGateNorm, rows)) return true;
  const int ppt = int((cols / 8 + 255) / 256);
  static const size_t solo = solo_smem_for(rmsnorm_gate_bf16_wide<1>, rmsnorm_gate_bf16_wide<2>,
                                           rmsnorm_gate_bf16_wide<4>, rmsnorm_gate_bf16_wide<8>);
  const size_t smem = rows == 1 ? solo : 0;
  auto go = [&](auto kernel) {
    launch_pdl(g_small_pdl, kernel, dim3(unsigned(rows)), dim3(256), smem, st, static_cast<const bf16*>(x),
               static_cast<const bf16*>(w), static_cast<const bf16*>(z), static_cast<bf16*>(y), int(cols), eps);
  };
  if (ppt <= 1) go(rmsnorm_gate_bf16_wide<1>);
  else if (ppt <= 2) go(rmsnorm_gate_bf16_wide<2>);
  else if (ppt <= 4) go(rmsnorm_gate_bf16_wide<4>);
  else go(rmsnorm_gate_bf16_wide<8>);
  SALA_CUDA_LAUNCH("rmsnorm_gate kernel");
  return true;
}

void launch_rope(void* x, Dt dt, int64_t rows, int64_t cols, int head_dim, const int32_t* positions,
                 const float* inv_freq, cudaStream_t st) {
  const int64_t total = rows * (cols / head_dim) * (head_dim / 2);
  if (total <= 0) return;
  rope_kernel<<<grid_for(total, 256), 256, 0, st>>>(x, dt, rows, cols, head_dim, positions, inv_freq);
  SALA_CUDA_LAUNCH("rope kernel");
}

void launch_embed(const void* table, Dt dtt, int64_t cols, const int32_t* tokens, int64_t rows, float scale, void* out,
                  Dt dto, cudaStream_t st) {
  if (rows <= 0) return;
  if (dtt == kBF16 && dto == kBF16 && cols % 8 == 0 && aligned16(table) && aligned16(out))
    embed_bf16x8<<<grid_for(rows * cols / 8, 256), 256, 0, st>>>(static_cast<const uint4*>(table), cols / 8, tokens,
                                                                  rows, scale, static_cast<uint4*>(out));
  else
    embed_generic<<<grid_for(rows * cols, 256), 256, 0, st>>>(table, dtt, cols, tokens, rows, scale, out, dto);
  SALA_CUDA_LAUNCH("embed kernel");
}

void launch_gather_rows(const void* x, Dt dtx, const int64_t* rows_idx, int64_t rows, int64_t cols, void* out, Dt dto,
                        cudaStream_t st) {
  if (rows <= 0) return;
  gather_kernel<<<grid_for(rows * cols, 256), 256, 0, st>>>(x, dtx, rows_idx, rows, cols, out, dto);
  SALA_CUDA_LAUNCH("gather_rows kernel");
}

void launch_gather_rows_inline(const void* x, Dt dtx, const GatherRows& rows_idx, int64_t rows, int64_t cols,
                               void* out, Dt dto, cudaStream_t st) {
  if (rows <= 0) return;
  gather_inline_kernel<<<grid_for(rows * cols, 256), 256, 0, st>>>(x, dtx, rows_idx, rows, cols, out, dto);
  SALA_CUDA_LAUNCH("gather_rows kernel");
}

void launch_convert(const void* src, Dt dts, void* dst, Dt dtd, int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  convert_kernel<<<grid_for(n, 256, 132 * 16), 256, 0, st>>>(src, dts, dst, dtd, n);
  SALA_CUDA_LAUNCH("convert kernel");
}

void launch_random_bf16(void* dst, int64_t n, float mean, float std, uint64_t seed, cudaStream_t st) {
  if (n <= 0) return;
  random_kernel<<<grid_for(n, 256, 132 * 32), 256, 0, st>>>(static_cast<bf16*>(dst), n, mean, std, seed);
  SALA_CUDA_LAUNCH("random kernel");
}

void set_small_kernel_pdl(bool on) { g_small_pdl = on; }

}  // namespace sala::cuda
