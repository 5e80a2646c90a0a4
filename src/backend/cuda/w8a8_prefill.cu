// W8A8 prefill (`--fp8-prefill`, `--int8-prefill`; docs/quantization.md): the passes around
// cuBLASLt's 8-bit GEMMs (cuda_quant.cpp) — each activation row quantized to e4m3 or int8 with its
// own scale; row blocks of a per-row FP8 or Q8 weight copied out of the GEMV's tile layout into the
// row-major [rows, in] bytes cuBLASLt reads (Q8: code − 128, the top bit flipped), with their
// scales (Q8: and offsets 128·s + b); and, for int8, the epilogue that turns cuBLASLt's exact int32
// products into y = fma(c_w, s_x·Σq_x, (acc·s_w)·s_x) — its int8 GEMM has no float output with
// per-row and per-token scales, unlike the fp8 one (outer-vector scales). Q4 and grouped Q8
// weights reach int8 through qrequant_int8_kernel (quant_gemv.cu): the activation quantizer's
// rule applied to their bf16 rows.
//
// Speed of light (H100, ~3 TB/s): the weight pass reads and writes 1 byte per weight (the bf16
// dequantization it replaces writes 2, which the bf16 GEMM then reads again): 16.8 M weights of
// a 4096×4096 matrix → ~11 µs. The activation pass reads 2 and writes 1 byte per value, twice over
// the row (max, then encode; the second read hits L1/L2): 4096 × 4096 → ~6 µs. The int8 epilogue
// reads the int32 products and writes y, 4 + 4 + 2 bytes per output with the GEMM's write:
// 4096 tokens × 16384 outputs → ~0.2 ms.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/quant_decode.cuh"
#include "backend/quant_layout.h"

namespace sala::cuda {

namespace {

using namespace qlayout;

constexpr int kQuantThreads = 256;

__device__ __forceinline__ void unpack4(uint2 v, float f[4]) {
  f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
}

// The max of a value over the CTA (every thread gets it).
__device__ float block_max(float v) {
  __shared__ float red[kQuantThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < kQuantThreads / 32; ++w) v = fmaxf(v, red[w]);
  return v;
}

// A row of `pieces` 4-value pieces held in registers: the thread's pieces tid + 256·j, j < P, all
// loaded before any is used (one round trip to DRAM per row rather than one per piece, and no
// second read for the encoding pass). H100, 4K prompt: ~1.9 TB/s with a loop of loads, ~2.2 now
// (bench/results/2026-11-27-w8a8-prefill-passes.md).
template <int P>
struct RowPieces {
  uint2 v[P];
  __device__ void load(const uint2* xr, int64_t pieces) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t i = threadIdx.x + int64_t(j) * kQuantThreads;
      v[j] = i < pieces ? xr[i] : make_uint2(0u, 0u);  // zeros: no effect on max |x| or Σq
    }
  }
  __device__ float absmax() const {
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      float f[4];
      unpack4(v[j], f);
#pragma unroll
      for (int c = 0; c < 4; ++c) m = fmaxf(m, fabsf(f[c]));
    }
    return block_max(m);
  }
};

// Two f32 as an e4m3x2 (lo in the low byte): round to nearest even, saturating at ±448 — the
// rounding of f32_to_fp8_e4m3 (core/dtype.h), which the CPU reference uses.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// One CTA per row of ≤ 4·256·P values: s = max|x| / 448 (1 for an all-zero row), q = e4m3(x / s)
// with IEEE division, as the CPU reference computes it. 8-byte pieces of 4 values (in % 4 == 0,
// rows 8-byte aligned: checked by the launcher).
template <int P>
__global__ void __launch_bounds__(kQuantThreads) quant_rows_fp8_kernel(const bf16* __restrict__ x, int64_t ldx,
                                                                    int64_t in, uint8_t* __restrict__ q,
                                                                    float* __restrict__ scales) {
  const int64_t n = blockIdx.x, pieces = in / 4;
  RowPieces<P> row;
  row.load(reinterpret_cast<const uint2*>(x + n * ldx), pieces);
  const float amax = row.absmax();
  const float s = amax > 0.f ? __fdiv_rn(amax, 448.f) : 1.f;
  if (threadIdx.x == 0) scales[n] = s;
  uint32_t* qr = reinterpret_cast<uint32_t*>(q + n * in);
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kQuantThreads;
    if (i >= pieces) break;
    float f[4];
    unpack4(row.v[j], f);
    qr[i] = e4m3x2(__fdiv_rn(f[0], s), __fdiv_rn(f[1], s)) | e4m3x2(__fdiv_rn(f[2], s), __fdiv_rn(f[3], s)) << 16;
  }
}

// One CTA per row of ≤ 4·256·P values: s = max|x| / 127 (1 for an all-zero row), q = rint(x / s)
// clamped to ±127 (the integers of IEEE division: rint_div_recip), and s·Σq — as the CPU
// reference (cpu_quant_matmul.cpp) computes them.
template <int P>
__global__ void __launch_bounds__(kQuantThreads) quant_rows_int8_kernel(const bf16* __restrict__ x, int64_t ldx,
                                                                     int64_t in, int8_t* __restrict__ q,
                                                                     float* __restrict__ scales,
                                                                     float* __restrict__ scaled_sums) {
  const int64_t n = blockIdx.x, pieces = in / 4;
  RowPieces<P> row;
  row.load(reinterpret_cast<const uint2*>(x + n * ldx), pieces);
  const float amax = row.absmax();
  const float s = amax > 0.f ? __fdiv_rn(amax, 127.f) : 1.f, r = __frcp_rn(s);
  uint32_t* qr = reinterpret_cast<uint32_t*>(q + n * in);
  int sum = 0;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kQuantThreads;
    if (i >= pieces) break;
    float f[4];
    unpack4(row.v[j], f);
    uint32_t packed = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int v = max(-127, min(127, rint_div_recip(f[c], s, r)));
      sum += v;
      packed |= uint32_t(v & 0xff) << (8 * c);
    }
    qr[i] = packed;
  }
  __shared__ int ired[kQuantThreads / 32];
  sum = warp_sum_int(sum);
  if (threadIdx.x % 32 == 0) ired[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
#pragma unroll
    for (int w = 0; w < kQuantThreads / 32; ++w) total += ired[w];
    scales[n] = s;
    scaled_sums[n] = __fmul_rn(s, float(total));
  }
}

// f(std::integral_constant<int, P>) with P the pieces per thread of a row of `in` values, rounded
// up to a compiled count: the quantizers' launch for that row length.
static_assert(kQuantRowsMaxIn == 4 * kQuantThreads * 16, "the largest row takes 16 pieces per thread");
template <typename F>
void with_row_pieces(int64_t in, F&& f) {
  const int64_t p = (in / 4 + kQuantThreads - 1) / kQuantThreads;
  if (p <= 1) f(std::integral_constant<int, 1>{});
  else if (p <= 2) f(std::integral_constant<int, 2>{});
  else if (p <= 4) f(std::integral_constant<int, 4>{});
  else if (p <= 8) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 16>{});
}

// One thread per 16-byte lane piece of row blocks [rb0, rb0 + nrb) of a per-row 8-bit weight (the
// inverse of qtile_kernel): word 2j + r8 holds row 16·rb + g + 8·r8, columns kt·32 + 16j + 4t ..
// +3. FP8 codes are copied; Q8 codes get their top bit flipped (code − 128 as int8). Lane (g, 0)
// of tile 0 also writes the scales of rows g and g + 8 (Q8: and their offsets 128·s + b).
template <int FMT>
__global__ void qcanonical_kernel(QWeight w, int64_t rb0, uint32_t nrb, int64_t row0, int64_t rows,
                                  uint8_t* __restrict__ dst, float* __restrict__ scales, float* __restrict__ offsets) {
  constexpr int KT = tile_k(FMT), MT = KT / 16;
  constexpr uint32_t kFlip = FMT == kQ8 ? 0x80808080u : 0u;
  const int64_t in = w.in;
  const uint32_t ktiles = uint32_t((in + KT - 1) / KT);
  for_each_lane_piece(FMT, in, rb0, nrb, [&](int64_t rb, uint32_t kt, int lane) {
    const int g = lane / 4, t = lane % 4;
    const uint4 c = __ldg(static_cast<const uint4*>(w.codes) + (rb * ktiles + kt) * 32 + lane);
    const uint32_t words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const int64_t row = rb * 16 + g + 8 * r8;
      if (row >= w.out || row >= row0 + rows) continue;
      if (kt == 0 && t == 0) {
        const float4 p = __ldg(reinterpret_cast<const float4*>(w.params) + rb * 8 + g);  // one group per row
        const float s = r8 ? p.z : p.x;
        scales[row - row0] = s;
        if constexpr (FMT == kQ8) offsets[row - row0] = __fmaf_rn(128.f, s, r8 ? p.w : p.y);
      }
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const int64_t k = int64_t(kt) * KT + 16 * j + 4 * t;
        if (k < in) *reinterpret_cast<uint32_t*>(dst + (row - row0) * in + k) = words[2 * j + r8] ^ kFlip;
      }
    }
  });
}

// acc: cuBLASLt's int32 D, column-major [rows, N] (ld = rows); y[n, r] (y already offset to the
// block's first column) in bf16 or f32. Grid: x over 4-row groups, y over tokens (strided).
template <typename YT>
__device__ __forceinline__ void store_y(YT* p, float v) {
  if constexpr (sizeof(YT) == 4) *p = v;
  else *p = __float2bfloat16_rn(v);
}

template <typename YT, bool VEC>
__global__ void __launch_bounds__(256) int8_epilogue_kernel(const int32_t* __restrict__ acc, int64_t rows, int64_t N,
                                                            const float* __restrict__ sw, const float* __restrict__ cw,
                                                            const float* __restrict__ sx,
                                                            const float* __restrict__ sxsum, YT* __restrict__ y,
                                                            int64_t ldy) {
  const int64_t r = 4 * (int64_t(blockIdx.x) * 256 + threadIdx.x);
  if (r >= rows) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const float s = sx[n], ss = sxsum[n];
    const int32_t* a = acc + n * rows + r;
    YT* yr = y + n * ldy + r;
    if constexpr (VEC) {  // rows % 4 == 0, 16-byte acc / scale rows, 4-value aligned y rows
      const int4 v = *reinterpret_cast<const int4*>(a);
      const float4 w = *reinterpret_cast<const float4*>(sw + r), c = *reinterpret_cast<const float4*>(cw + r);
      const float o[4] = {__fmaf_rn(c.x, ss, __fmul_rn(__fmul_rn(float(v.x), w.x), s)),
                          __fmaf_rn(c.y, ss, __fmul_rn(__fmul_rn(float(v.y), w.y), s)),
                          __fmaf_rn(c.z, ss, __fmul_rn(__fmul_rn(float(v.z), w.z), s)),
                          __fmaf_rn(c.w, ss, __fmul_rn(__fmul_rn(float(v.w), w.w), s))};
      if constexpr (sizeof(YT) == 4) {
        *reinterpret_cast<float4*>(yr) = make_float4(o[0], o[1], o[2], o[3]);
      } else {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(o[0], o[1]), hi = __floats2bfloat162_rn(o[2], o[3]);
        uint2 packed;
        packed.x = *reinterpret_cast<const uint32_t*>(&lo), packed.y = *reinterpret_cast<const uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(yr) = packed;
      }
    } else {
      for (int64_t k = 0; k < 4 && r + k < rows; ++k)
        store_y(yr + k, __fmaf_rn(cw[r + k], ss, __fmul_rn(__fmul_rn(float(a[k]), sw[r + k]), s)));
    }
  }
}

}  // namespace

void launch_quant_rows_fp8(const void* x, int64_t ldx, int64_t N, int64_t in, void* q, float* scales,
                           cudaStream_t st) {
  if (N <= 0) return;
  SALA_CUDA_REQUIRE(in % 4 == 0 && ldx % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 7) == 0,
                    "quant_rows_fp8: rows must be 8-byte aligned multiples of 4 values");
  SALA_CUDA_REQUIRE(N < (int64_t(1) << 31), "quant_rows_fp8: too many rows");
  SALA_CUDA_REQUIRE(in <= kQuantRowsMaxIn, "quant_rows_fp8: rows longer than kQuantRowsMaxIn values");
  const auto* xb = static_cast<const bf16*>(x);
  auto* qb = static_cast<uint8_t*>(q);
  with_row_pieces(in, [&](auto P) {
    quant_rows_fp8_kernel<P()><<<unsigned(N), kQuantThreads, 0, st>>>(xb, ldx, in, qb, scales);
  });
  SALA_CUDA_LAUNCH("quant_rows_fp8 kernel");
}

void launch_quant_rows_int8(const void* x, int64_t ldx, int64_t N, int64_t in, void* q, float* scales,
                            float* scaled_sums, cudaStream_t st) {
  if (N <= 0) return;
  SALA_CUDA_REQUIRE(in % 4 == 0 && ldx % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 7) == 0,
                    "quant_rows_int8: rows must be 8-byte aligned multiples of 4 values");
  SALA_CUDA_REQUIRE(N < (int64_t(1) << 31) && in * 127 < (int64_t(1) << 31), "quant_rows_int8: too many rows or columns");
  SALA_CUDA_REQUIRE(in <= kQuantRowsMaxIn, "quant_rows_int8: rows longer than kQuantRowsMaxIn values");
  const auto* xb = static_cast<const bf16*>(x);
  auto* qb = static_cast<int8_t*>(q);
  with_row_pieces(in, [&](auto P) {
    quant_rows_int8_kernel<P()><<<unsigned(N), kQuantThreads, 0, st>>>(xb, ldx, in, qb, scales, scaled_sums);
  });
  SALA_CUDA_LAUNCH("quant_rows_int8 kernel");
}

void launch_qcanonical(const QWeight& w, int64_t row0, int64_t rows, void* codes, float* scales, float* offsets,
                       cudaStream_t st) {
  if (rows <= 0) return;
  SALA_CUDA_REQUIRE((w.fmt == kFP8 || (w.fmt == kQ8 && offsets)) && w.group == w.in,
                    "qcanonical: per-row FP8 or Q8 weights only (Q8 with offsets)");
  SALA_CUDA_REQUIRE(row0 % 16 == 0 && w.in % 4 == 0, "qcanonical: first row must start a row block");
  const int64_t rb0 = row0 / 16, nrb = (rows + 15) / 16;
  const int64_t n = nrb * ((w.in + tile_k(w.fmt) - 1) / tile_k(w.fmt)) * 32;
  SALA_CUDA_REQUIRE(n < (int64_t(1) << 31), "qcanonical: too many rows per call");
  auto* dst = static_cast<uint8_t*>(codes);
  if (w.fmt == kFP8)
    qcanonical_kernel<kFP8><<<grid_for(n, 256, 132 * 16), 256, 0, st>>>(w, rb0, uint32_t(nrb), row0, rows, dst, scales, offsets);
  else
    qcanonical_kernel<kQ8><<<grid_for(n, 256, 132 * 16), 256, 0, st>>>(w, rb0, uint32_t(nrb), row0, rows, dst, scales, offsets);
  SALA_CUDA_LAUNCH("qcanonical kernel");
}

void launch_int8_epilogue(const int32_t* acc, int64_t rows, int64_t N, const float* sw, const float* cw,
                          const float* sx, const float* sxsum, void* y, Dt dty, int64_t ldy, cudaStream_t st) {
  if (rows <= 0 || N <= 0) return;
  SALA_CUDA_REQUIRE(dty == kBF16 || dty == kF32, "int8 epilogue: y must be bf16 or f32");
  const size_t ys = dty == kBF16 ? 2 : 4;
  const auto al = [](const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  const bool vec = rows % 4 == 0 && al(acc, 16) && al(sw, 16) && al(cw, 16) && al(y, 4 * ys) && (ldy * ys) % (4 * ys) == 0;
  const dim3 grid(unsigned((rows + 1023) / 1024), unsigned(std::min<int64_t>(N, 65535)));
  auto launch = [&](auto* yt) {
    using YT = std::remove_pointer_t<decltype(yt)>;
    if (vec) int8_epilogue_kernel<YT, true><<<grid, 256, 0, st>>>(acc, rows, N, sw, cw, sx, sxsum, static_cast<YT*>(y), ldy);
    else int8_epilogue_kernel<YT, false><<<grid, 256, 0, st>>>(acc, rows, N, sw, cw, sx, sxsum, static_cast<YT*>(y), ldy);
  };
  if (dty == kBF16) launch(static_cast<bf16*>(nullptr));
  else launch(static_cast<float*>(nullptr));
  SALA_CUDA_LAUNCH("int8 epilogue kernel");
}

}  // namespace sala::cuda
