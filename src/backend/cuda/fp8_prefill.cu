// `--fp8-prefill` (docs/quantization.md "fp8 prefill"): the two passes that feed cuBLASLt's fp8
// GEMM (cuda_quant.cpp) — each activation row quantized to e4m3 with its own scale, and row blocks
// of a packed FP8 weight copied out of the GEMV's tile layout into the row-major e4m3 [rows, in]
// cuBLASLt reads, with their per-row scales.
//
// Speed of light (H200, ~4.3 TB/s copy): the weight pass reads 1 and writes 1 byte per weight
// (the bf16 dequantization it replaces writes 2, which the bf16 GEMM then reads again): 16.8 M
// weights of a 4096×4096 matrix → ~8 µs. The activation pass reads 2 and writes 1 byte per value
// twice over the row (max, then encode; the second read hits L1/L2): 4096 × 4096 → ~5 µs.
#include "backend/cuda/common.cuh"
#include "backend/quant_layout.h"

namespace sala::cuda {

namespace {

using namespace qlayout;

constexpr int kQuantThreads = 256;

// Two f32 as an e4m3x2 (lo in the low byte): round to nearest even, saturating at ±448 — the
// rounding of f32_to_fp8_e4m3 (core/dtype.h), which the CPU reference uses.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// One CTA per row: s = max|x| / 448 (1 for an all-zero row), q = e4m3(x / s) with IEEE division,
// as the CPU reference computes it. 8-byte pieces of 4 values (in % 4 == 0, rows 8-byte aligned:
// checked by the launcher).
__global__ void __launch_bounds__(kQuantThreads) quant_rows_fp8_kernel(const bf16* __restrict__ x, int64_t ldx,
                                                                    int64_t in, uint8_t* __restrict__ q,
                                                                    float* __restrict__ scales) {
  const int64_t n = blockIdx.x;
  const uint2* xr = reinterpret_cast<const uint2*>(x + n * ldx);
  const int64_t pieces = in / 4;
  auto unpack4 = [](uint2 v, float f[4]) {
    f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
  };
  float amax = 0.f;
  for (int64_t i = threadIdx.x; i < pieces; i += kQuantThreads) {
    float f[4];
    unpack4(xr[i], f);
#pragma unroll
    for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(f[j]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __shared__ float red[kQuantThreads / 32];
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = red[0];
#pragma unroll
  for (int w = 1; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, red[w]);
  const float s = amax > 0.f ? __fdiv_rn(amax, 448.f) : 1.f;
  if (threadIdx.x == 0) scales[n] = s;
  uint32_t* qr = reinterpret_cast<uint32_t*>(q + n * in);
  for (int64_t i = threadIdx.x; i < pieces; i += kQuantThreads) {
    float f[4];
    unpack4(xr[i], f);
    qr[i] = e4m3x2(__fdiv_rn(f[0], s), __fdiv_rn(f[1], s)) | e4m3x2(__fdiv_rn(f[2], s), __fdiv_rn(f[3], s)) << 16;
  }
}

// One thread per 16-byte lane piece of row blocks [rb0, rb0 + nrb) (the inverse of qtile_kernel
// for FP8): word 2j + r8 holds row 16·rb + g + 8·r8, columns kt·32 + 16j + 4t .. +3. Lane (g, 0)
// of tile 0 also writes the scales of rows g and g + 8.
__global__ void qcanonical_fp8_kernel(QWeight w, int64_t rb0, uint32_t nrb, int64_t row0, int64_t rows,
                                      uint8_t* __restrict__ dst, float* __restrict__ scales) {
  constexpr int KT = tile_k(kFP8), MT = KT / 16;
  const int64_t in = w.in;
  const uint32_t ktiles = uint32_t((in + KT - 1) / KT), total = nrb * ktiles * 32;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int lane = int(i % 32), g = lane / 4, t = lane % 4;
    const uint32_t kt = (i / 32) % ktiles;
    const int64_t rb = rb0 + (i / 32) / ktiles;
    const uint4 c = __ldg(static_cast<const uint4*>(w.codes) + (rb * ktiles + kt) * 32 + lane);
    const uint32_t words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const int64_t row = rb * 16 + g + 8 * r8;
      if (row >= w.out || row >= row0 + rows) continue;
      if (kt == 0 && t == 0) {
        const float4 p = __ldg(reinterpret_cast<const float4*>(w.params) + rb * 8 + g);  // one group per row
        scales[row - row0] = r8 ? p.z : p.x;
      }
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const int64_t k = int64_t(kt) * KT + 16 * j + 4 * t;
        if (k < in) *reinterpret_cast<uint32_t*>(dst + (row - row0) * in + k) = words[2 * j + r8];
      }
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
  quant_rows_fp8_kernel<<<unsigned(N), kQuantThreads, 0, st>>>(static_cast<const bf16*>(x), ldx, in,
                                                              static_cast<uint8_t*>(q), scales);
  SALA_CUDA_LAUNCH("quant_rows_fp8 kernel");
}

void launch_qcanonical_fp8(const QWeight& w, int64_t row0, int64_t rows, void* codes, float* scales,
                           cudaStream_t st) {
  if (rows <= 0) return;
  SALA_CUDA_REQUIRE(w.fmt == kFP8 && w.group == w.in, "qcanonical_fp8: per-row FP8 weights only");
  SALA_CUDA_REQUIRE(row0 % 16 == 0 && w.in % 4 == 0, "qcanonical_fp8: first row must start a row block");
  const int64_t rb0 = row0 / 16, nrb = (rows + 15) / 16;
  const int64_t n = nrb * ((w.in + tile_k(kFP8) - 1) / tile_k(kFP8)) * 32;
  SALA_CUDA_REQUIRE(n < (int64_t(1) << 31), "qcanonical_fp8: too many rows per call");
  qcanonical_fp8_kernel<<<grid_for(n, 256, 132 * 16), 256, 0, st>>>(w, rb0, uint32_t(nrb), row0, rows,
                                                                     static_cast<uint8_t*>(codes), scales);
  SALA_CUDA_LAUNCH("qcanonical_fp8 kernel");
}

}  // namespace sala::cuda
