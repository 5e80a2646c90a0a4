// Packed weights on the GPU (docs/quantization.md): the decode GEMV that reads FP8/Q8/Q4 tiles
// directly, the dequantization of row blocks to bf16 for the cuBLAS prefill path, the tiling of
// canonical codes at load, and random packed weights for benchmarks. Layout: quant_layout.h.
//
// Speed of light (decode, N ≤ 8): the packed bytes once per call. Per weight, 9B geometry:
//   Q4 group 64: 0.5 B codes + 8 B (s, b as f32) / 64 = 0.625 B   (bf16: 2 B → 3.2× less)
//   Q8 / FP8 per row: 1 B + 8 B per row ≈ 1.0 B                     (2× less)
//   4096×4096 Q4: 10.5 MB → 3.1 µs at 3.35 TB/s; 16384×4096: 42 MB → 12.5 µs.
// At these sizes launch and ramp (~2-3 µs) weigh more than for bf16, so PDL (prefetch of the
// first tiles into L2 before griddepcontrol.wait) matters more.
//
// Kernel: a CTA owns 16 output rows (one row block); its W warps take the row block's 512-byte
// tiles in turn, kU tiles in flight per lane (one 16-byte load each). Per mma.sync.m16n8k16 a lane
// decodes its codes for rows g and g+8 into the bf16 A fragment with bit tricks (exact: every
// code value is a bf16), x (bf16, the B fragment) is one 8-byte load, and the products of the
// integer codes accumulate in fp32 (cq). Scales and biases are applied in fp32 when a group ends:
//   y += s·Σ x·q + b·Σ x,   Σ x from a second mma with an all-ones A (cx; none for FP8).
// Q4 decodes 128 + q (one lop3 per two values, no subtraction): its bias becomes b − 128·s (the
// cancellation of 128·Σx costs ~3 bits of the fp32 sums: ~3e-6 relative, far under bf16 rounding).
// FP8 decodes e4m3·2^-8 through f16 (exact, subnormals included): its scale becomes 256·s.
// Instruction budget per 16-byte piece (a lane, Q4): 4 words → 16 lop3/shift, 8 mma, ≤ 8 FMA —
// well under the ALU rate that 3.35 TB/s of Q4 needs (2 values per byte); Q8/FP8 spend ~2.5 ALU
// ops per value (one byte), also under it.
#include "core/rng.h"
#include "backend/cuda/common.cuh"
#include "backend/quant_layout.h"

namespace sala::cuda {

namespace {

using namespace qlayout;

constexpr int kU = 4;  // tiles in flight per lane and iteration

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ float2 f16x2_to_float2(uint32_t h) {
  return make_float2(__half2float(__ushort_as_half(uint16_t(h & 0xffffu))), __half2float(__ushort_as_half(uint16_t(h >> 16))));
}

__device__ __forceinline__ uint32_t f16x2_to_bf16x2(uint32_t h) {
  const float2 f = f16x2_to_float2(h);
  return pack_bf16x2(f.x, f.y);  // exact: e4m3·2^-8 has 4 significant bits
}

// The A fragment (a0: row g k0,k1; a1: row g+8 k0,k1; a2: row g k2,k3; a3: row g+8 k2,k3) of
// mma j from a lane's 16-byte piece.
template <int FMT>
__device__ __forceinline__ void decode_a(const uint4& c, int j, uint32_t a[4]) {
  if constexpr (FMT == kQ4) {
    const uint32_t w = word_of(c, j);
#pragma unroll
    for (int p = 0; p < 4; ++p) a[p] = q4_bf16x2(w, p);
  } else if constexpr (FMT == kQ8) {
    const uint32_t wg = word_of(c, 2 * j), wg8 = word_of(c, 2 * j + 1);
    a[0] = pack_bf16x2(q8_f32(wg, 0), q8_f32(wg, 1));
    a[1] = pack_bf16x2(q8_f32(wg8, 0), q8_f32(wg8, 1));
    a[2] = pack_bf16x2(q8_f32(wg, 2), q8_f32(wg, 3));
    a[3] = pack_bf16x2(q8_f32(wg8, 2), q8_f32(wg8, 3));
  } else {
    const uint32_t wg = word_of(c, 2 * j), wg8 = word_of(c, 2 * j + 1);
    a[0] = f16x2_to_bf16x2(fp8_f16x2(wg, 0));
    a[1] = f16x2_to_bf16x2(fp8_f16x2(wg8, 0));
    a[2] = f16x2_to_bf16x2(fp8_f16x2(wg, 1));
    a[3] = f16x2_to_bf16x2(fp8_f16x2(wg8, 1));
  }
}

template <typename YT>
__device__ __forceinline__ void store_y(YT* p, float v);
template <>
__device__ __forceinline__ void store_y<bf16>(bf16* p, float v) { *p = __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ void store_y<float>(float* p, float v) { *p = v; }

template <int FMT, int W, typename YT>
__global__ void __launch_bounds__(W * 32) qgemv_kernel(QWeight w, const bf16* __restrict__ x, int64_t ldx,
                                                        YT* __restrict__ y, int64_t ldy, int N) {
  constexpr int KT = tile_k(FMT), MT = KT / 16;
  constexpr bool kBias = FMT != kFP8;
  __shared__ float red[W][16][8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t rb = blockIdx.x, in = w.in, G = w.group;
  const int64_t ktiles = (in + KT - 1) / KT, groups = in / G;
  const uint4* codes = static_cast<const uint4*>(w.codes) + rb * ktiles * 32 + lane;
  const float4* params = reinterpret_cast<const float4*>(w.params) + rb * groups * 8 + g;
  const bool per_row = G == in;                     // one flush at the end
  const bool tile_group = !per_row && G % KT == 0;  // every tile inside one group: flush per tile
  // Group of tile k: k / (G / KT) — a shift when that is a power of two (no division per tile).
  const uint32_t tpg = tile_group ? uint32_t(G / KT) : 1u, G32 = uint32_t(G);
  const int tpg_shift = (tpg & (tpg - 1)) == 0 ? __ffs(int(tpg)) - 1 : -1;
  const bool xv = g < N;
  const bf16* xr = x + (xv ? g : 0) * ldx + 4 * t;
  const uint32_t ones[4] = {0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u};  // bf16 1.0
  float cf[4] = {0.f, 0.f, 0.f, 0.f}, cq[4] = {0.f, 0.f, 0.f, 0.f}, cx[4] = {0.f, 0.f, 0.f, 0.f};

  auto flush = [&](const float4 p) {
    float s0 = p.x, b0 = p.y, s1 = p.z, b1 = p.w;
    if constexpr (FMT == kFP8) s0 *= 256.f, s1 *= 256.f;
    if constexpr (FMT == kQ4) b0 = fmaf(-128.f, s0, b0), b1 = fmaf(-128.f, s1, b1);
    cf[0] = fmaf(s0, cq[0], cf[0]);
    cf[1] = fmaf(s0, cq[1], cf[1]);
    cf[2] = fmaf(s1, cq[2], cf[2]);
    cf[3] = fmaf(s1, cq[3], cf[3]);
    if constexpr (kBias) {
      cf[0] = fmaf(b0, cx[0], cf[0]);
      cf[1] = fmaf(b0, cx[1], cf[1]);
      cf[2] = fmaf(b1, cx[2], cf[2]);
      cf[3] = fmaf(b1, cx[3], cf[3]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) cq[i] = cx[i] = 0.f;
  };

  // Weights never depend on earlier kernels: start pulling them into L2 before the dependency wait.
#pragma unroll
  for (int u = 0; u < kU; ++u)
    if (warp + u * W < ktiles) prefetch_l2(codes + (warp + u * W) * 32);
  const float4 zero4f = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4 prow = per_row ? __ldg(params) : zero4f;
  grid_dep_wait();

  const uint4 zero4 = make_uint4(0, 0, 0, 0);
  const uint2 zero2 = make_uint2(0, 0);
  for (int64_t kt = warp; kt < ktiles; kt += int64_t(W) * kU) {
    uint4 cw[kU];
    float4 pt[kU];
    uint2 xf[kU][MT];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t k = kt + u * W;
      cw[u] = k < ktiles ? __ldg(codes + k * 32) : zero4;
      const uint32_t gi = tpg_shift >= 0 ? uint32_t(k) >> tpg_shift : uint32_t(k) / tpg;
      pt[u] = tile_group && k < ktiles ? __ldg(params + gi * 8) : zero4f;
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const int64_t k0 = k * KT + 16 * j;
        xf[u][j] = xv && k < ktiles && k0 + 4 * t < in ? *reinterpret_cast<const uint2*>(xr + k0) : zero2;
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t k = kt + u * W;
      if (k >= ktiles) break;
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const int64_t k0 = k * KT + 16 * j;
        if (k0 >= in) break;
        uint32_t a[4];
        decode_a<FMT>(cw[u], j, a);
        mma16816(cq, a, xf[u][j].x, xf[u][j].y);
        if constexpr (kBias) mma16816(cx, ones, xf[u][j].x, xf[u][j].y);
        // Groups smaller than a tile (group % 16 == 0): flush at each group end and tile end.
        if (!per_row && !tile_group && ((uint32_t(k0) + 16) % G32 == 0 || j == MT - 1))
          flush(__ldg(params + (uint32_t(k0) / G32) * 8));
      }
      if (tile_group) flush(pt[u]);
    }
  }
  if (per_row) flush(prow);

  red[warp][g][2 * t] = cf[0];
  red[warp][g][2 * t + 1] = cf[1];
  red[warp][g + 8][2 * t] = cf[2];
  red[warp][g + 8][2 * t + 1] = cf[3];
  __syncthreads();
  if (threadIdx.x < 128) {
    const int row = threadIdx.x / 8, n = threadIdx.x % 8;
    const int64_t o = rb * 16 + row;
    if (n < N && o < w.out) {
      float v = 0.f;
#pragma unroll
      for (int i = 0; i < W; ++i) v += red[i][row][n];
      store_y<YT>(y + n * ldy + o, v);
    }
  }
}

// One thread per lane piece of the row blocks [rb0, rb0 + nrb): rows [row0, row0 + rows) of W.
// Index arithmetic in 32 bits (≤ 2^31 pieces per call, checked by the launcher).
template <int FMT>
__global__ void qdequant_kernel(QWeight w, int64_t rb0, uint32_t nrb, int64_t row0, int64_t rows, bf16* dst) {
  constexpr int KT = tile_k(FMT), MT = KT / 16;
  const int64_t in = w.in;
  const uint32_t G = uint32_t(w.group), ktiles = uint32_t((in + KT - 1) / KT), groups = uint32_t(in / w.group);
  const uint32_t total = nrb * ktiles * 32;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int lane = int(i % 32), g = lane / 4, t = lane % 4;
    const uint32_t kt = (i / 32) % ktiles;
    const int64_t rb = rb0 + (i / 32) / ktiles;
    const uint4 c = __ldg(static_cast<const uint4*>(w.codes) + (rb * ktiles + kt) * 32 + lane);
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      const uint32_t k = kt * KT + 16 * j + 4 * t;
      if (k >= in) break;
      // The mma step's 16 columns share one group (group % 16 == 0, or one per row).
      const float4 p = __ldg(reinterpret_cast<const float4*>(w.params) + (rb * groups + (k - 4 * t) / G) * 8 + g);
#pragma unroll
      for (int r8 = 0; r8 < 2; ++r8) {
        const int64_t row = rb * 16 + g + 8 * r8;
        if (row >= w.out || row >= row0 + rows) continue;
        const float s = r8 ? p.z : p.x, b = r8 ? p.w : p.y;
        float v[4];
        if constexpr (FMT == kQ4) {
          const uint32_t word = word_of(c, j);
#pragma unroll
          for (int cc = 0; cc < 4; ++cc)
            v[cc] = fmaf(s, float((word >> (4 * (r8 + 2 * (cc >> 1) + 4 * (cc & 1)))) & 0xfu), b);
        } else if constexpr (FMT == kQ8) {
          const uint32_t word = word_of(c, 2 * j + r8);
#pragma unroll
          for (int cc = 0; cc < 4; ++cc) v[cc] = fmaf(s, float((word >> (8 * cc)) & 0xffu), b);
        } else {
          const uint32_t word = word_of(c, 2 * j + r8);
          const float2 f01 = f16x2_to_float2(fp8_f16x2(word, 0)), f23 = f16x2_to_float2(fp8_f16x2(word, 1));
          v[0] = s * (f01.x * 256.f), v[1] = s * (f01.y * 256.f), v[2] = s * (f23.x * 256.f), v[3] = s * (f23.y * 256.f);
        }
        uint2 out;
        out.x = pack_bf16x2(v[0], v[1]);
        out.y = pack_bf16x2(v[2], v[3]);
        *reinterpret_cast<uint2*>(dst + (row - row0) * in + k) = out;
      }
    }
  }
}

template <int FMT>
__global__ void qtile_kernel(QWeight w, const uint8_t* __restrict__ src, uint4* __restrict__ dst) {
  constexpr int KT = tile_k(FMT), MT = KT / 16;
  const int64_t in = w.in, ktiles = (in + KT - 1) / KT, rbs = (w.out + 15) / 16;
  const int64_t total = rbs * ktiles * 32;
  const int64_t row_bytes = FMT == kQ4 ? in / 2 : in;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int lane = int(i % 32), g = lane / 4, t = lane % 4;
    const int64_t kt = (i / 32) % ktiles, rb = i / 32 / ktiles;
    uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int r8 = 0; r8 < 2; ++r8) {
        const int64_t row = rb * 16 + g + 8 * r8;
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          const int64_t k = kt * KT + 16 * j + 4 * t + cc;
          if (row >= w.out || k >= in) continue;
          const uint8_t b = src[row * row_bytes + (FMT == kQ4 ? k / 2 : k)];
          if constexpr (FMT == kQ4)
            words[j] |= uint32_t((k & 1) ? b >> 4 : b & 0xf) << (4 * (r8 + 2 * (cc >> 1) + 4 * (cc & 1)));
          else
            words[2 * j + r8] |= uint32_t(b) << (8 * cc);
        }
      }
    dst[i] = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

__global__ void qrandom_codes_kernel(uint32_t* codes, int64_t words, bool fp8, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < words; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t v = uint32_t(splitmix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(i)));
    if (fp8)  // no NaN codes (S.1111.111)
#pragma unroll
      for (int b = 0; b < 4; ++b)
        if (((v >> (8 * b)) & 0x7fu) == 0x7fu) v -= 1u << (8 * b);
    codes[i] = v;
  }
}

__global__ void qrandom_params_kernel(QWeight w, float* params, float scale, float bias, uint64_t seed) {
  const int64_t groups = w.in / w.group, n = (w.out + 15) / 16 * groups * 8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int g = int(i % 8);
    const int64_t gi = (i / 8) % groups, rb = i / 8 / groups;
    float p[4];
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const int64_t row = rb * 16 + g + 8 * r8;
      const float f = 0.75f + 0.5f * uniform01(seed ^ 0x5ca1eull, uint64_t(row * groups + gi));
      p[2 * r8] = row < w.out ? scale * f : 0.f;
      p[2 * r8 + 1] = row < w.out ? bias * f : 0.f;
    }
    reinterpret_cast<float4*>(params)[i] = make_float4(p[0], p[1], p[2], p[3]);
  }
}

// Launch with programmatic stream serialization when pdl (the kernel waits in grid_dep_wait).
template <typename... KArgs, typename... Args>
void launch_pdl(bool pdl, void (*kernel)(KArgs...), unsigned blocks, unsigned threads, cudaStream_t st, Args... args) {
  if (!pdl) {
    kernel<<<blocks, threads, 0, st>>>(args...);
    return;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  SALA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

template <int FMT, int W>
void qgemv_w(const QWeight& w, const void* x, int64_t ldx, void* y, Dt dty, int64_t ldy, int N, bool pdl,
             cudaStream_t st) {
  const unsigned blocks = unsigned((w.out + 15) / 16);
  const auto* xb = static_cast<const bf16*>(x);
  if (dty == kBF16)
    launch_pdl(pdl, qgemv_kernel<FMT, W, bf16>, blocks, W * 32, st, w, xb, ldx, static_cast<bf16*>(y), ldy, N);
  else
    launch_pdl(pdl, qgemv_kernel<FMT, W, float>, blocks, W * 32, st, w, xb, ldx, static_cast<float*>(y), ldy, N);
}

template <int FMT>
void qgemv_f(const QWeight& w, const void* x, int64_t ldx, void* y, Dt dty, int64_t ldy, int N, int warps, bool pdl,
             cudaStream_t st) {
  switch (warps) {
    case 16: return qgemv_w<FMT, 16>(w, x, ldx, y, dty, ldy, N, pdl, st);
    case 8: return qgemv_w<FMT, 8>(w, x, ldx, y, dty, ldy, N, pdl, st);
    default: return qgemv_w<FMT, 4>(w, x, ldx, y, dty, ldy, N, pdl, st);
  }
}

bool al8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7) == 0; }

}  // namespace

void launch_qgemv(const QWeight& w, const void* x, int64_t ldx, void* y, Dt dty, int64_t ldy, int N, int warps,
                  bool pdl, cudaStream_t st) {
  if (N <= 0 || w.out <= 0) return;
  SALA_CUDA_REQUIRE(N <= 8, "qgemv: at most 8 rows");
  SALA_CUDA_REQUIRE(dty == kBF16 || dty == kF32, "qgemv: y must be bf16 or f32");
  SALA_CUDA_REQUIRE(al8(x) && ldx % 4 == 0 && w.in % 4 == 0, "qgemv: x rows must be 8-byte aligned");
  SALA_CUDA_REQUIRE(w.group == w.in || w.group % 16 == 0, "qgemv: group size must be a multiple of 16");
  // Few row blocks (out ≤ 8192): more warps per CTA share a row block's tiles so that every SM
  // still has enough 16-byte loads in flight; many row blocks: 4 warps, more CTAs per SM.
  if (warps != 4 && warps != 8 && warps != 16) warps = w.out <= 8192 ? 8 : 4;
  switch (w.fmt) {
    case kFP8: qgemv_f<kFP8>(w, x, ldx, y, dty, ldy, N, warps, pdl, st); break;
    case kQ8: qgemv_f<kQ8>(w, x, ldx, y, dty, ldy, N, warps, pdl, st); break;
    case kQ4: qgemv_f<kQ4>(w, x, ldx, y, dty, ldy, N, warps, pdl, st); break;
    default: SALA_CUDA_REQUIRE(false, "qgemv: unknown packed format");
  }
  SALA_CUDA_LAUNCH("qgemv kernel");
}

void launch_qdequant(const QWeight& w, int64_t row0, int64_t rows, void* dst, cudaStream_t st) {
  if (rows <= 0) return;
  SALA_CUDA_REQUIRE(row0 % 16 == 0, "qdequant: first row must start a row block");
  const int64_t rb0 = row0 / 16, nrb = (rows + 15) / 16;
  const int64_t n = nrb * ((w.in + tile_k(w.fmt) - 1) / tile_k(w.fmt)) * 32;
  SALA_CUDA_REQUIRE(n < (int64_t(1) << 31), "qdequant: too many rows per call");
  const unsigned blocks = grid_for(n, 256, 132 * 16);
  auto* d = static_cast<bf16*>(dst);
  switch (w.fmt) {
    case kFP8: qdequant_kernel<kFP8><<<blocks, 256, 0, st>>>(w, rb0, uint32_t(nrb), row0, rows, d); break;
    case kQ8: qdequant_kernel<kQ8><<<blocks, 256, 0, st>>>(w, rb0, uint32_t(nrb), row0, rows, d); break;
    case kQ4: qdequant_kernel<kQ4><<<blocks, 256, 0, st>>>(w, rb0, uint32_t(nrb), row0, rows, d); break;
    default: SALA_CUDA_REQUIRE(false, "qdequant: unknown packed format");
  }
  SALA_CUDA_LAUNCH("qdequant kernel");
}

void launch_qtile(const QWeight& w, const void* canonical, void* tiles, cudaStream_t st) {
  const int64_t n = (w.out + 15) / 16 * ((w.in + tile_k(w.fmt) - 1) / tile_k(w.fmt)) * 32;
  const unsigned blocks = grid_for(n, 256, 132 * 16);
  const auto* s = static_cast<const uint8_t*>(canonical);
  auto* d = static_cast<uint4*>(tiles);
  switch (w.fmt) {
    case kFP8: qtile_kernel<kFP8><<<blocks, 256, 0, st>>>(w, s, d); break;
    case kQ8: qtile_kernel<kQ8><<<blocks, 256, 0, st>>>(w, s, d); break;
    case kQ4: qtile_kernel<kQ4><<<blocks, 256, 0, st>>>(w, s, d); break;
    default: SALA_CUDA_REQUIRE(false, "qtile: unknown packed format");
  }
  SALA_CUDA_LAUNCH("qtile kernel");
}

void launch_qrandom(const QWeight& w, void* codes, float* params, float scale, float bias, uint64_t seed,
                    cudaStream_t st) {
  const TileGeom geo{w.fmt, w.out, w.in, w.group};
  const int64_t words = geo.code_bytes() / 4, np = geo.param_floats() / 4;
  qrandom_codes_kernel<<<grid_for(words, 256, 132 * 16), 256, 0, st>>>(static_cast<uint32_t*>(codes), words,
                                                                       w.fmt == kFP8, seed);
  SALA_CUDA_LAUNCH("qrandom codes kernel");
  qrandom_params_kernel<<<grid_for(np, 256, 132 * 16), 256, 0, st>>>(w, params, scale, bias, seed);
  SALA_CUDA_LAUNCH("qrandom params kernel");
}

}  // namespace sala::cuda
