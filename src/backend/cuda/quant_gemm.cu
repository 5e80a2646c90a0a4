// Products of 33+ rows (decode batches, prompt chunks) with packed weights (FP8, Q8, Q4) on Hopper's
// tensor cores, the codes decoded in the GEMM's load path: y[n, o] = Σ_k x[n, k]·w[o, k] with no
// dequantized copy of the matrix (docs/quantization.md, "The GEMM that decodes in its load path").
//
// Why: the dequantize + cuBLAS path writes and re-reads a bf16 copy of every matrix in every
// forward (1 + 2 + 2 bytes per weight against bf16's 2): at a few hundred rows that pass costs
// more than the product; and at 33–64 rows the decode GEMV needs a second launch, re-reading every
// byte. Here each weight is read once per CTA as its packed bytes and decoded in registers.
//
// Speed of light: the tensor cores. 2·N·out·in FLOPs at ~790 TFLOP/s (cuBLAS bf16, H100/H200
// measured); the bytes (codes once from DRAM, x from L2) are far below the memory roof at N ≥ 128.
//
// Kernel (sm_90a, wgmma): a CTA of two warpgroups owns 128 weight rows × 256 tokens (128 or 64
// where N ≤ 128 or 64: wgmma.m64n128k16 / m64n64k16, no padding rows multiplied). The weight
// is the A operand, from registers: warp w holds row block w of the CTA (16 rows), and per k16
// step its lane (g, t) loads the 16-byte piece of the GEMV tile layout (quant_layout.h: rows g and
// g+8, columns 4t..4t+3), trades bytes with two lanes of its quad (shfl) to get the columns
// 2t, 2t+1, 2t+8, 2t+9 that wgmma's A fragment wants, and decodes them as the dequantize kernel
// does — bf16(fma(s, q, b)), FP8 bf16(s·e4m3) — so the products are those of the dequantized
// matrix, in fp32 (only the order of the sums differs from cuBLAS). x is the B operand: 256 rows
// × 64 k per stage in shared memory (cp.async, 128-byte swizzle, 4 stages, 2–3 in flight), read by
// wgmma.m64n256k16 through a matrix descriptor. The codes of stage s+1 are in flight while stage s
// is decoded; how a decode overlaps the wgmmas is the Variant below. Grid: the token tiles of a
// row tile adjacent (blockIdx.x), so a weight comes from DRAM once and from L2 for the others.
// Measured at 390–475 TFLOP/s (~55–60% of cuBLAS bf16) whichever the variant — without the CTA
// barrier (kPipelined) too, where Nsight Compute had the warps of the others waiting;
// qgemm_preferred says where that still beats dequantize + cuBLAS.
//
// The warp-specialized kernel (qgemm_ws_kernel, below) moves the decode to a producer warpgroup
// that writes the bf16 A tile to shared memory; x and the codes arrive by TMA / bulk copies. It
// runs at 506–543 TFLOP/s at 2048 rows for 8-bit weights (~65% of cuBLAS; without the decode
// 674–775: the decode, one producer warpgroup's ALU work, is its limit) and is the automatic choice
// at 129–512 rows (qgemm_ws_preferred; bench/results/2026-11-26-h100-qgemm-ws.md).
//
// Split K: a 4096-row matrix has 32 row tiles, so at one token tile (N ≤ 256, batched decode) the
// grid would leave ~3/4 of the SMs idle. There the K range is split over gridDim.z CTAs per tile
// (qgemm_splits: up to 8, at least 8 stages each) that write fp32 partial sums [split][n][o]; a
// second kernel adds them in split order (deterministic) into y.
#include <cuda.h>  // CUtensorMap (the x tiles' TMA descriptor; the encoder comes from the driver at run time)
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/hopper.cuh"
#include "backend/cuda/quant_decode.cuh"
#include "backend/quant_layout.h"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SALA_QGEMM_WGMMA 1
#endif

namespace sala::cuda {

namespace {

using namespace qlayout;

constexpr int kBM = 128;                         // weight rows per CTA (8 warps × 16)
constexpr int kBN = 256;                         // tokens per CTA (wgmma n); 64 / 128 at N ≤ 64 / 128 (qgemm_tile_n)
constexpr int kBK = 64;                          // k per stage: one 128-byte swizzle row of x
constexpr int kStages = 4;                       // x stages in shared memory (2–3 loads in flight)
constexpr int kThreads = 256;                    // two warpgroups
constexpr int stage_bytes(int bn) { return bn * kBK * 2; }  // 32 KiB at 256 tokens
constexpr int smem_bytes(int bn) { return kStages * stage_bytes(bn) + 1024 + 64; }  // + alignment, 8 mbarriers

// 0: off (the dequantize + cuBLAS path), 1: automatic, 2 / 3 / 4 / 5 / 6: the kernel's kStaged /
// kOverlapped / kSkewed / kPipelined variant or the warp-specialized kernel wherever a shape fits,
// 7: automatic without the warp-specialized kernel (A/B runs).
int g_qgemm_mode = -1;  // -1: not read yet (SALA_CUDA_QGEMM)
int qgemm_mode() {
  if (g_qgemm_mode < 0) {
    const char* e = std::getenv("SALA_CUDA_QGEMM");
    g_qgemm_mode = e && *e ? std::atoi(e) : 1;
  }
  return g_qgemm_mode;
}

#ifdef SALA_QGEMM_WGMMA  // the device code of an sm_90a pass (the kernel's body is empty elsewhere)

// wgmma.mma_async m64nNk16, bf16 × bf16 → f32, d += A·B: B (16×N, K-major, 128-byte swizzle)
// from shared memory through its descriptor; A (64×16) from registers (_rs: the register-A
// kernels) or from shared memory as well (_ss: the warp-specialized kernel, whose producer writes
// the decoded bf16 weight tile K-major with the same swizzle). N = 256 / 128 / 64: 128 / 64 / 32
// accumulators per thread (the narrower tiles multiply no padding rows). The operand lists are
// spelled once here; scale-d is the predicate p (always 1: accumulate).
#define SALA_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                     "+f"(d[i + 6]), "+f"(d[i + 7])
#define SALA_ACC32(i) SALA_ACC8(i), SALA_ACC8(i + 8), SALA_ACC8(i + 16), SALA_ACC8(i + 24)
#define SALA_D0_31                                                                                         \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SALA_D32_63                                                                                             \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SALA_D64_127                                                                                             \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, "  \
  "%85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, " \
  "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, "     \
  "%122, %123, %124, %125, %126, %127"
#define SALA_A_REGS "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])

__device__ __forceinline__ void wgmma_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\nwgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
               "{" SALA_D0_31 ", " SALA_D32_63 ", " SALA_D64_127 "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
               : SALA_ACC32(0), SALA_ACC32(32), SALA_ACC32(64), SALA_ACC32(96)
               : SALA_A_REGS, "l"(desc), "r"(1));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
               "{" SALA_D0_31 ", " SALA_D32_63 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
               : SALA_ACC32(0), SALA_ACC32(32)
               : SALA_A_REGS, "l"(desc), "r"(1));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
               "{" SALA_D0_31 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
               : SALA_ACC32(0)
               : SALA_A_REGS, "l"(desc), "r"(1));
}
__device__ __forceinline__ void wgmma_ss(float (&d)[128], uint64_t adesc, uint64_t bdesc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\nwgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
               "{" SALA_D0_31 ", " SALA_D32_63 ", " SALA_D64_127 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
               : SALA_ACC32(0), SALA_ACC32(32), SALA_ACC32(64), SALA_ACC32(96)
               : "l"(adesc), "l"(bdesc), "r"(1));
}
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t adesc, uint64_t bdesc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
               "{" SALA_D0_31 ", " SALA_D32_63 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
               : SALA_ACC32(0), SALA_ACC32(32)
               : "l"(adesc), "l"(bdesc), "r"(1));
}
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t adesc, uint64_t bdesc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
               "{" SALA_D0_31 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
               : SALA_ACC32(0)
               : "l"(adesc), "l"(bdesc), "r"(1));
}
#undef SALA_A_REGS
#undef SALA_D64_127
#undef SALA_D32_63
#undef SALA_D0_31
#undef SALA_ACC32
#undef SALA_ACC8

// kPipelined's mbarriers (mbar_init, mbar_wait: quant_decode.cuh; mbar_arrive: hopper.cuh): a
// stage's "full" barrier completes when every thread's cp.async copies of it have landed, its
// "empty" barrier when every warp's wgmmas on it are done.
// Arrives once this thread's earlier cp.async copies have completed (counted in the init count).
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Keeps the compiler from moving accumulator accesses across the asynchronous wgmmas.
__device__ __forceinline__ void keep(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// q (an exact small integer) as f32: the bits of 2^23 + q minus 2^23.
__device__ __forceinline__ float int_f32(uint32_t q) { return __uint_as_float(0x4B000000u | q) - 8388608.f; }

// The A fragment of k16 step kk of a stage: a[0] rows g columns 2t, 2t+1; a[1] row g+8, same
// columns; a[2], a[3] the columns 2t+8, 2t+9. c: the lane's tile pieces of the stage; p: {s, b}
// of rows g and g+8 for the step's group. src1/src2: the quad lanes holding columns 2t.. and 2t+8..
template <int FMT, int KK, int CT>
__device__ __forceinline__ void decode_step(const uint4 (&c)[CT], const float4& p, int src1, int src2, int t,
                                            uint32_t (&a)[4]) {
  if constexpr (FMT == kQ4) {
    const uint32_t w = word_of(c[0], KK);
    const uint32_t u1 = __shfl_sync(0xffffffffu, w, src1), u2 = __shfl_sync(0xffffffffu, w, src2);
    // Nibbles of the result: 0 (g, 2t), 1 (g+8, 2t), 2 (g, 2t+1), 3 (g+8, 2t+1), 4..7 the same at 2t+8.
    const uint32_t v = __byte_perm(u1, u2, (t & 1) ? 0x7531u : 0x6420u);
    auto q = [&](int n) { return int_f32((v >> (4 * n)) & 0xFu); };
    a[0] = pack_bf16x2(fmaf(p.x, q(0), p.y), fmaf(p.x, q(2), p.y));
    a[1] = pack_bf16x2(fmaf(p.z, q(1), p.w), fmaf(p.z, q(3), p.w));
    a[2] = pack_bf16x2(fmaf(p.x, q(4), p.y), fmaf(p.x, q(6), p.y));
    a[3] = pack_bf16x2(fmaf(p.z, q(5), p.w), fmaf(p.z, q(7), p.w));
  } else {
    constexpr int tile = KK >> 1, j = KK & 1;
    const uint32_t sel = (t & 1) ? 0x7632u : 0x5410u;
    uint32_t v[2];  // rows g, g+8: bytes 0, 1 = columns 2t, 2t+1; bytes 2, 3 = 2t+8, 2t+9
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const uint32_t w = word_of(c[tile], 2 * j + r8);
      const uint32_t u1 = __shfl_sync(0xffffffffu, w, src1), u2 = __shfl_sync(0xffffffffu, w, src2);
      v[r8] = __byte_perm(u1, u2, sel);
    }
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const float s = r8 ? p.z : p.x, b = r8 ? p.w : p.y;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float lo, hi;
        if constexpr (FMT == kQ8) {
          lo = fmaf(s, q8_f32(v[r8], 2 * h), b);
          hi = fmaf(s, q8_f32(v[r8], 2 * h + 1), b);
        } else {
          const float2 f = fp8x2_float2(v[r8], h);
          lo = s * f.x;
          hi = s * f.y;
        }
        a[r8 + 2 * h] = pack_bf16x2(lo, hi);
      }
    }
  }
}

// This CTA's share of the 64-k stages of an input width `in`: [first, first + count), all of them
// unless K is split over gridDim.z CTAs (blockIdx.z: this one).
struct KRange {
  int first, count;
};
__device__ __forceinline__ KRange k_range(int64_t in) {
  const int64_t total = in / kBK, z = blockIdx.z, zs = gridDim.z;
  const int first = int(total * z / zs);
  return {first, int(total * (z + 1) / zs) - first};
}

// A warp's accumulators of row block rb into y (bf16 / f32) or, with a K split, into its split's
// fp32 partial sums. Accumulator 4j + {0, 1, 2, 3}: rows g, g, g+8, g+8 × tokens 8j + 2t, 8j + 2t + 1.
template <int BN>
__device__ __forceinline__ void store_acc(const float (&acc)[BN / 2], int64_t rb, int g, int t, int n0, int z,
                                          int64_t out, int N, void* y, int ydt, int64_t ldy, float* split_ws) {
  const int64_t row0 = rb * 16 + g;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = n0 + 8 * j + 2 * t + (i & 1);
      const int64_t o = row0 + 8 * (i >> 1);
      if (n < N && o < out) {
        if (split_ws)
          split_ws[(int64_t(z) * N + n) * out + o] = acc[4 * j + i];
        else if (ydt == kBF16)
          static_cast<bf16*>(y)[int64_t(n) * ldy + o] = __float2bfloat16_rn(acc[4 * j + i]);
        else
          static_cast<float*>(y)[int64_t(n) * ldy + o] = acc[4 * j + i];
      }
    }
  }
}

#endif  // SALA_QGEMM_WGMMA

// How a warpgroup's decode meets the tensor cores (kernel comment at the top; measured in
// bench/results/2026-11-25-h100-qgemm.md):
//   kStaged: decode stage s after the stage barrier, then its wgmmas, then wait for them. Both
//     warpgroups decode at the same time, between barriers, while the tensor cores idle.
//   kOverlapped: decode stage s while stage s − 1's wgmmas run (two A buffers; ptxas serializes
//     part of the wgmmas for it, C7513).
//   kSkewed: as kStaged, but warpgroup 1 decodes before the barrier (its A registers are free once
//     it waited for its wgmmas), so at the barrier its wgmmas start while warpgroup 0 decodes, and
//     warpgroup 1 decodes the next stage while warpgroup 0's wgmmas run.
//   kPipelined: no CTA barrier in the loop: per-stage "full" and "empty" mbarriers, so a warpgroup
//     may run up to two stages ahead of the other (decode before waiting for the stage's x).
enum Variant : int { kStaged = 0, kOverlapped = 1, kSkewed = 2, kPipelined = 3 };

// CTAs resident per SM: two with the 64-token tile (its stages are short, so a second CTA's loads
// cover the first one's latency; K split gives the grid the CTAs), else one.
constexpr int ctas_per_sm(int bn) { return bn <= 64 ? 2 : 1; }
// The CTAs per SM the K split plans for: ctas_per_sm, or 1 with SALA_CUDA_QGEMM_CTAS_PER_SM=1 (A/B
// runs: the grid of one resident CTA per SM).
int planned_ctas_per_sm(int bn) {
  static const bool one = [] {
    const char* e = std::getenv("SALA_CUDA_QGEMM_CTAS_PER_SM");
    return e && std::atoi(e) == 1;
  }();
  return one || qgemm_mode() == 6 ? 1 : ctas_per_sm(bn);  // the warp-specialized kernel: one
}

template <int FMT, int VARIANT, int BN = kBN>
__global__ void __launch_bounds__(kThreads, ctas_per_sm(BN))
    qgemm_kernel(QWeight w, const bf16* __restrict__ x, int64_t ldx, void* __restrict__ y, int ydt, int64_t ldy,
                 int N, float* __restrict__ split_ws) {
#ifdef SALA_QGEMM_WGMMA
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sbase = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int n0 = int(blockIdx.x) * BN;
  constexpr int kStageBytes = stage_bytes(BN), kAcc = BN / 2;
  const int64_t rb = int64_t(blockIdx.y) * (kBM / 16) + warp;
  const bool live = rb < (w.out + 15) / 16;  // padding rows of the last tile: zero codes, no stores
  constexpr int KT = tile_k(FMT), CT = kBK / KT;  // tiles per stage: 2 (8-bit) or 1 (Q4)
  // This CTA's stages [sbeg, sbeg + stages) of K (all of them unless split); s below counts from
  // sbeg (ring buffers and barrier phases), addresses use sbeg + s.
  const int z = int(blockIdx.z);
  const KRange kr = k_range(w.in);
  const int sbeg = kr.first, stages = kr.count;
  const bool per_row = w.group == w.in;
  const uint4* codes = static_cast<const uint4*>(w.codes) + (live ? rb : 0) * (w.in / KT) * 32 + lane;
  const int64_t prb = live ? rb : 0;  // parameter tiles: f32 per row, f16 grouped (quant_layout.h)
  const int64_t pidx = prb * (w.in / w.group) * 8 + g;  // grouped: entry pidx + 8·gi (f16 or zero-packed)

  // This thread's share of stage s's x tile into its buffer (rows past N zero-filled).
  auto copy_x = [&](int s) {
    const uint32_t dst = sbase + uint32_t(s % kStages) * kStageBytes;
#pragma unroll
    for (int r = 0; r < BN * 8 / kThreads; ++r) {
      const int q = tid + r * kThreads, row = q >> 3, c = q & 7, n = n0 + row;
      const bf16* src = x + int64_t(n < N ? n : N - 1) * ldx + int64_t(sbeg + s) * kBK + c * 8;
      cp_async16(dst + uint32_t(row * 128 + ((c ^ (row & 7)) << 4)), src, n < N ? 16 : 0);
    }
  };
  auto load_x = [&](int s) {
    if (s < stages) copy_x(s);
    cp_async_commit();  // (empty past the last stage: the group count stays regular)
  };
  auto load_codes = [&](int s, uint4 (&c)[CT], float4& p) {
    if (live && s < stages) {
#pragma unroll
      for (int i = 0; i < CT; ++i) c[i] = ld_stream(codes + (int64_t(sbeg + s) * CT + i) * 32);
      if (!per_row) p = gparam_f32(ld_gparam(w.params, w.zpack, pidx + int64_t(sbeg + s) * kBK / w.group * 8), w.zpack);
    } else {
#pragma unroll
      for (int i = 0; i < CT; ++i) c[i] = make_uint4(0, 0, 0, 0);
    }
  };

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) keep(acc[i]);
  uint4 cbuf[2][CT];
  float4 pbuf[2];
  pbuf[0] = pbuf[1] = live && per_row ? ld_row_param(w.params, prb, g)
                                      : make_float4(0.f, 0.f, 0.f, 0.f);  // per-row formats: for good
  constexpr bool OVERLAP = VARIANT == kOverlapped;
  uint32_t a[OVERLAP ? 2 : 1][4][4];
  const bool early = VARIANT == kSkewed && warp >= 4;  // warpgroup 1 of the skewed variant
  const int src1 = (lane & ~3) | (t >> 1), src2 = src1 + 2;

  // x stages in flight ahead of the one consumed: with OVERLAP, stage s − 1's wgmmas may still
  // read their buffer while stage s + ahead is loaded, so one fewer.
  constexpr int ahead = OVERLAP || VARIANT == kPipelined ? kStages - 2 : kStages - 1;
  const uint32_t bars = sbase + uint32_t(kStages * kStageBytes);  // full[4], then empty[4]
  if constexpr (VARIANT == kPipelined) {
    if (tid == 0)
      for (int i = 0; i < kStages; ++i) mbar_init(bars + 8 * i, kThreads), mbar_init(bars + 32 + 8 * i, kThreads / 32);
    __syncthreads();
  }
  // kPipelined: stage s's copies into its buffer once the stage that used it last is consumed.
  auto produce = [&](int s) {
    if (s >= stages) return;
    const uint32_t b = uint32_t(s % kStages);
    if (s >= kStages) mbar_wait(bars + 32 + 8 * b, uint32_t(s / kStages - 1) & 1u);
    copy_x(s);
    mbar_arrive_cp_async(bars + 8 * b);
  };
#pragma unroll
  for (int s = 0; s < ahead; ++s) VARIANT == kPipelined ? produce(s) : load_x(s);
  load_codes(0, cbuf[0], pbuf[0]);

  // A stage's four A fragments from its codes, and its four wgmmas on x buffer b (one group).
  auto decode_stage = [&](const uint4 (&c)[CT], const float4& pp, uint32_t (&frag)[4][4]) {
    decode_step<FMT, 0>(c, pp, src1, src2, t, frag[0]);
    decode_step<FMT, 1>(c, pp, src1, src2, t, frag[1]);
    decode_step<FMT, 2>(c, pp, src1, src2, t, frag[2]);
    decode_step<FMT, 3>(c, pp, src1, src2, t, frag[3]);
  };
  auto issue_mma = [&](uint32_t b, const uint32_t (&frag)[4][4]) {
    const uint64_t desc = sw128_desc(sbase + b * kStageBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs(acc, frag[kk], desc + uint64_t(2 * kk));  // +32 B per k16
    wgmma_commit();
  };

  // One stage: P is its buffer parity (compile time, so the register arrays stay registers).
  auto step = [&](auto P, int s) {
    constexpr int p = decltype(P)::value, pa = OVERLAP ? p : 0;
    auto decode = [&] { decode_stage(cbuf[p], pbuf[p], a[pa]); };
    if (early) decode();  // codes only: no shared memory needed yet
    load_codes(s + 1, cbuf[p ^ 1], pbuf[p ^ 1]);
    cp_async_wait<ahead - 1>();  // this thread's copies of stage s have landed
    fence_proxy_async();
    __syncthreads();  // everyone's; and the wgmmas that read the buffer loaded next are done
    load_x(s + ahead);
    if (!early) decode();
    issue_mma(uint32_t(s % kStages), a[pa]);
    wgmma_wait<OVERLAP ? 1 : 0>();
  };
  auto step_pipelined = [&](auto P, int s) {
    constexpr int p = decltype(P)::value;
    produce(s + ahead);
    decode_stage(cbuf[p], pbuf[p], a[0]);
    load_codes(s + 1, cbuf[p ^ 1], pbuf[p ^ 1]);
    const uint32_t b = uint32_t(s % kStages);
    mbar_wait(bars + 8 * b, uint32_t(s / kStages) & 1u);  // every thread's copies of stage s landed
    fence_proxy_async();
    issue_mma(b, a[0]);
    wgmma_wait<0>();
    __syncwarp();
    if (lane == 0) mbar_arrive(bars + 32 + 8 * b);  // this warp is done with the buffer
  };
  for (int s = 0; s < stages; s += 2) {
    if constexpr (VARIANT == kPipelined) {
      step_pipelined(std::integral_constant<int, 0>{}, s);
      if (s + 1 < stages) step_pipelined(std::integral_constant<int, 1>{}, s + 1);
    } else {
      step(std::integral_constant<int, 0>{}, s);
      if (s + 1 < stages) step(std::integral_constant<int, 1>{}, s + 1);
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kAcc; ++i) keep(acc[i]);

  if (live) store_acc<BN>(acc, rb, g, t, n0, z, w.out, N, y, ydt, ldy, split_ws);
#else
  __trap();  // not built for sm_90a: qgemm_available() is false and nothing launches this
#endif
}

// The warp-specialized kernel (SALA_CUDA_QGEMM=6): a third warpgroup decodes, the other two only
// multiply. Per 64-k stage the producer warpgroup
//   - copies x with one TMA (a 64 k × BN box, 128-byte swizzle, rows past N zero-filled),
//   - copies the stage's codes of its warps' row blocks with bulk copies S stages ahead (a load's
//     latency under a full GPU's traffic is longer than a stage's decode), and
//   - decodes them from shared memory into a bf16 A tile (K-major, 128-byte swizzle: the values
//     launch_qdequant writes), then arrives on the stage's "full" mbarrier.
// The two consumer warpgroups wait for it, issue four wgmma.m64nBNk16 with A and B from shared
// memory, keep one stage of them in flight (wait_group 1) and release the stage before through its
// "empty" mbarrier. So the tensor cores are fed back to back while the decode runs on the
// producer's own warps — where the register-A variants above make each warpgroup decode between
// its own wgmmas.
constexpr int kWsThreads = 384;  // consumer warpgroups 0, 1; producer warpgroup 2
constexpr int ws_code_bytes(int fmt) { return kBM / 16 * (kBK / tile_k(fmt)) * kTileBytes; }  // 8 / 4 KiB
// A stage: the decoded A tile (16 KiB), x (BN × 128 bytes), the codes; every part 1024-aligned.
constexpr int ws_stage_bytes(int fmt, int bn) { return kBM * kBK * 2 + stage_bytes(bn) + ws_code_bytes(fmt); }
// One CTA per SM (384 threads take up to 168 registers each); stages to fill ~200–225 KiB.
constexpr int ws_stages(int bn) { return bn == 256 ? 4 : bn == 128 ? 5 : 6; }
constexpr int ws_smem_bytes(int fmt, int bn) {
  return ws_stages(bn) * ws_stage_bytes(fmt, bn) + 1024 + 24 * ws_stages(bn);  // + alignment, 3 barriers a stage
}
static_assert(ws_smem_bytes(kFP8, 256) <= 227 * 1024, "the 256-token ring must fit an SM's shared memory");

#ifdef SALA_QGEMM_WGMMA
__device__ __forceinline__ void st_shared_v2(uint32_t addr, uint32_t a, uint32_t b) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr), "r"(a), "r"(b) : "memory");
}
// Four decoded weights of one row at columns col .. col + 3 of a stage's A tile (row r of 128):
// the 8-byte half of a 16-byte swizzle chunk.
__device__ __forceinline__ void store_a4(uint32_t a_tile, int r, int col, float v0, float v1, float v2, float v3) {
  const uint32_t at = a_tile + uint32_t(r * 128 + ((((col >> 3) ^ (r & 7))) << 4) + ((col & 4) << 1));
  st_shared_v2(at, pack_bf16x2(v0, v1), pack_bf16x2(v2, v3));
}
#endif

template <int FMT, int BN>
__global__ void __launch_bounds__(kWsThreads, 1)
    qgemm_ws_kernel(QWeight w, const __grid_constant__ CUtensorMap xmap, void* __restrict__ y, int ydt, int64_t ldy,
                    int N, float* __restrict__ split_ws) {
#ifdef SALA_QGEMM_WGMMA
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sbase = (smem_addr(smem_raw) + 1023u) & ~1023u;
  constexpr int kABytes = kBM * kBK * 2, kXBytes = stage_bytes(BN), kStage = ws_stage_bytes(FMT, BN);
  constexpr int kAcc = BN / 2, S = ws_stages(BN);
  // Barriers: full (the A tile decoded: 128 arrivals, + the x TMA's), empty (8 consumer warps), codes
  // (one expect-tx arrival per producer warp).
  const uint32_t full = sbase + uint32_t(S * kStage), empty = full + 8 * S, codes_bar = empty + 8 * S;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int n0 = int(blockIdx.x) * BN;
  const int z = int(blockIdx.z);
  const KRange kr = k_range(w.in);
  const int sbeg = kr.first, stages = kr.count;
  const int64_t row_blocks = (w.out + 15) / 16;
  if (tid == 0) {
    for (int i = 0; i < S; ++i)
      mbar_init(full + 8 * i, 129), mbar_init(empty + 8 * i, 8), mbar_init(codes_bar + 8 * i, 4);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the async proxy (TMA)
  }
  __syncthreads();

  if (warp >= 8) {  // ---- producer: warp pw decodes row blocks 2·pw, 2·pw + 1 of the tile ----
    const int pw = warp - 8;
    constexpr int KT = tile_k(FMT), CT = kBK / KT;  // tiles per stage and row block: 2 (8-bit), 1 (Q4)
    constexpr uint32_t kRbBytes = CT * kTileBytes;  // one row block's codes of a stage
    const bool per_row = w.group == w.in;
    const int64_t rb0 = int64_t(blockIdx.y) * (kBM / 16) + 2 * pw;
    // Row blocks past the matrix (the last tile's padding) are not copied: their A rows hold stale
    // values, and their outputs are never stored.
    const int live = int(std::min<int64_t>(2, std::max<int64_t>(0, row_blocks - rb0)));
    const uint8_t* wcodes = static_cast<const uint8_t*>(w.codes);
    const int64_t ktiles = w.in / KT;
    // Stage s's codes into slot s % S (lane 0; the slot's previous codes are decoded: __syncwarp).
    auto load_codes = [&](int s) {
      if (lane != 0 || s >= stages) return;
      const uint32_t slot = sbase + uint32_t(s % S) * kStage + kABytes + kXBytes + uint32_t(2 * pw) * kRbBytes;
      const uint32_t bar = codes_bar + 8 * uint32_t(s % S);
      mbar_arrive_expect_tx(bar, uint32_t(live) * kRbBytes);
      for (int r = 0; r < live; ++r)
        bulk_load(slot + r * kRbBytes, wcodes + ((rb0 + r) * ktiles + int64_t(sbeg + s) * CT) * kTileBytes, kRbBytes,
                  bar);
    };
    int64_t prb[2];  // the parameter tiles' row blocks: f32 per row, f16 grouped (quant_layout.h)
#pragma unroll
    for (int r = 0; r < 2; ++r) prb[r] = r < live ? rb0 + r : 0;
    // {s, b} of rows g, g + 8 per row block: per-row formats once; grouped ones a stage ahead.
    auto load_params = [&](int s, float4 (&pp)[2]) {
      if (s >= stages) return;
#pragma unroll
      for (int r = 0; r < 2; ++r)
        pp[r] = param_at(w.params, !per_row, w.zpack, prb[r], w.in / w.group, int64_t(sbeg + s) * kBK / w.group, g);
    };
    auto decode = [&](uint32_t stage, const float4 (&pp)[2]) {
      const uint32_t a_tile = stage, code_slot = stage + kABytes + kXBytes + uint32_t(2 * pw) * kRbBytes + 16 * lane;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = (2 * pw + r) * 16 + g;
        uint4 cc[CT];
#pragma unroll
        for (int i = 0; i < CT; ++i) cc[i] = ld_shared_v4(code_slot + uint32_t(r * kRbBytes + i * kTileBytes));
        if constexpr (FMT == kQ4) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {  // word j: columns 16j + 4t + c of rows g, g + 8 (quant_layout.h)
            const uint32_t wd = word_of(cc[0], j);
#pragma unroll
            for (int r8 = 0; r8 < 2; ++r8) {
              const float s = r8 ? pp[r].z : pp[r].x, b = r8 ? pp[r].w : pp[r].y;
              auto q = [&](int col) {
                return fmaf(s, int_f32((wd >> (4 * (r8 + 2 * (col >> 1) + 4 * (col & 1)))) & 0xFu), b);
              };
              store_a4(a_tile, row + 8 * r8, 16 * j + 4 * t, q(0), q(1), q(2), q(3));
            }
          }
        } else {
#pragma unroll
          for (int i = 0; i < CT; ++i) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {  // word k: mma j = k >> 1, row g + 8·(k & 1), columns 16j + 4t ..
              const uint32_t wd = word_of(cc[i], k);
              const float s = (k & 1) ? pp[r].z : pp[r].x, b = (k & 1) ? pp[r].w : pp[r].y;
              float v[4];
              if constexpr (FMT == kQ8) {
#pragma unroll
                for (int e = 0; e < 4; ++e) v[e] = fmaf(s, q8_f32(wd, e), b);
              } else {
                const float2 lo = fp8x2_float2(wd, 0), hi = fp8x2_float2(wd, 1);
                v[0] = s * lo.x, v[1] = s * lo.y, v[2] = s * hi.x, v[3] = s * hi.y;
              }
              store_a4(a_tile, row + 8 * (k & 1), 32 * i + 16 * (k >> 1) + 4 * t, v[0], v[1], v[2], v[3]);
            }
          }
        }
      }
    };
    // (One copy of the decode per loop below: the unrolled decode is long, and a kernel whose copies
    // outgrow the instruction cache ran at two thirds of the speed.)
    auto produce = [&](int s, const float4 (&pp)[2]) {
      const uint32_t b = uint32_t(s % S), stage = sbase + b * uint32_t(kStage);
      if (s >= S) mbar_wait(empty + 8 * b, uint32_t(s / S - 1) & 1u);  // consumers done with the A tile and x
      if (warp == 8 && lane == 0) {  // x: one TMA copy, counted in bytes by the barrier
        mbar_arrive_expect_tx(full + 8 * b, uint32_t(kXBytes));
        tma_load_2d(stage + kABytes, &xmap, (sbeg + s) * kBK, n0, full + 8 * b);
      }
      mbar_wait(codes_bar + 8 * b, uint32_t(s / S) & 1u);
      decode(stage, pp);
      fence_proxy_async();  // the A tile's generic-proxy stores, before wgmma's async-proxy reads
      mbar_arrive(full + 8 * b);
      __syncwarp();  // every lane has read its codes of the slot: refill it
      load_codes(s + S);
    };
    for (int s = 0; s < S; ++s) load_codes(s);
    float4 pa[2], pb[2];
    load_params(0, pa);
    if (FMT == kFP8 || per_row) {
      for (int s = 0; s < stages; ++s) produce(s, pa);
    } else if constexpr (FMT != kFP8) {
      for (int s = 0; s < stages; s += 2) {
        load_params(s + 1, pb);
        produce(s, pa);
        if (s + 1 >= stages) break;
        load_params(s + 2, pa);
        produce(s + 1, pb);
      }
    }
    return;
  }

  // ---- consumers: warpgroup cw multiplies rows 64·cw .. 64·cw + 63 of the tile ----
  const int cw = warp >> 2;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) keep(acc[i]);
  for (int s = 0; s < stages; ++s) {
    const uint32_t b = uint32_t(s % S), stage = sbase + b * uint32_t(kStage);
    mbar_wait(full + 8 * b, uint32_t(s / S) & 1u);  // x landed (TMA) and the A tile is decoded
    const uint64_t ad = sw128_desc(stage + uint32_t(cw * 64 * 128)), bd = sw128_desc(stage + kABytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_ss(acc, ad + uint64_t(2 * kk), bd + uint64_t(2 * kk));  // +32 B per k16
    wgmma_commit();
    wgmma_wait<1>();  // stage s − 1's wgmmas are done: release its buffer
    if (s > 0 && lane == 0) mbar_arrive(empty + 8 * uint32_t((s - 1) % S));
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kAcc; ++i) keep(acc[i]);

  const int64_t rb = int64_t(blockIdx.y) * (kBM / 16) + warp;
  if (rb < row_blocks) store_acc<BN>(acc, rb, g, t, n0, z, w.out, N, y, ydt, ldy, split_ws);
#else
  __trap();  // not built for sm_90a: qgemm_available() is false and nothing launches this
#endif
}

// 1 when the loaded code has the wgmma kernel (an sm_90a build running on sm_90).
__global__ void qgemm_probe_kernel(int* out) {
#ifdef SALA_QGEMM_WGMMA
  *out = 1;
#else
  *out = 0;
#endif
}

// y[n, o] = Σ_z ws[z][n][o], in split order.
__global__ void qgemm_split_reduce_kernel(const float* __restrict__ ws, int splits, int N, int64_t out, void* y,
                                          int ydt, int64_t ldy) {
  const int64_t total = int64_t(N) * out;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float v = 0.f;
    for (int z = 0; z < splits; ++z) v += ws[z * total + i];
    const int64_t n = i / out, o = i % out;
    if (ydt == kBF16)
      static_cast<bf16*>(y)[n * ldy + o] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(y)[n * ldy + o] = v;
  }
}

// x [N][in] bf16 (row stride ldx) as a TMA tensor, in boxes of 64 k × bn tokens with the 128-byte
// swizzle the kernels' descriptors expect; rows past N read as zeros.
CUtensorMap x_tensor_map(const void* x, int64_t ldx, int64_t in, int N, int bn) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  SALA_CUDA_REQUIRE(encode, "qgemm: the driver has no cuTensorMapEncodeTiled (check qgemm_available first)");
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(in), cuuint64_t(N)}, strides[1] = {cuuint64_t(ldx) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kBK), cuuint32_t(bn)}, unit[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(x), dims, strides, box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    const std::string why = "qgemm: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")";
    SALA_CUDA_REQUIRE(false, why.c_str());
  }
  return map;
}

// Tokens per CTA: 64 or 128 where that covers N and the pipelined variant runs (the automatic
// choice), else 256.
int qgemm_tile_n(int N) {
  const int mode = qgemm_mode();
  if (mode != 1 && mode != 5 && mode != 6 && mode != 7) return kBN;
  return N <= 64 ? 64 : N <= 128 ? 128 : kBN;
}

// Row tiles (kBM rows each, of 16-row blocks) and token tiles of a product: its grid's y and x.
int64_t row_tiles(const QWeight& w) { return ((w.out + 15) / 16 + kBM / 16 - 1) / (kBM / 16); }
int64_t token_tiles(int N) { return (N + qgemm_tile_n(N) - 1) / qgemm_tile_n(N); }
int64_t qgemm_tiles(const QWeight& w, int N) { return token_tiles(N) * row_tiles(w); }

}  // namespace

// Looked up once by qgemm_available — at the first packed load, outside any graph capture.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encode;
}

// CTAs per (row tile, token tile): enough to fill the SMs' CTA slots once, each with at least 8 of the 64-k
// stages (the ring's fill and the partial sums' traffic stay small next to the loop), at most 8.
int qgemm_splits(const QWeight& w, int N) {
  const int64_t ctas = qgemm_tiles(w, N);
  const int64_t by_sms = sm_count() * planned_ctas_per_sm(qgemm_tile_n(N)) / std::max<int64_t>(ctas, 1);
  const int64_t by_k = w.in / kBK / 8;
  return int(std::max<int64_t>(1, std::min<int64_t>({8, by_sms, by_k})));
}

size_t qgemm_split_floats(const QWeight& w, int N) {
  const int splits = qgemm_splits(w, N);
  return splits > 1 ? size_t(splits) * size_t(N) * size_t(w.out) : 0;
}

void set_qgemm_mode(int mode) { g_qgemm_mode = mode; }

// Called at the first packed load (never inside a graph capture): probes the loaded code and
// raises the kernels' dynamic shared-memory limit once.
bool qgemm_available() {
  static const bool available = [] {
    int* d = nullptr;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return false;
    int h = 0;
    qgemm_probe_kernel<<<1, 1>>>(d);
    const bool ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
    cudaFree(d);
    cudaGetLastError();  // a device this build has no code for: the probe fails, the path stays off
    if (!ok || h != 1 || !tensor_map_encoder()) return false;
    for (auto kernel : {qgemm_kernel<kFP8, kStaged>, qgemm_kernel<kFP8, kOverlapped>, qgemm_kernel<kFP8, kSkewed>,
                        qgemm_kernel<kFP8, kPipelined>, qgemm_kernel<kQ8, kStaged>, qgemm_kernel<kQ8, kOverlapped>,
                        qgemm_kernel<kQ8, kSkewed>, qgemm_kernel<kQ8, kPipelined>, qgemm_kernel<kQ4, kStaged>,
                        qgemm_kernel<kQ4, kOverlapped>, qgemm_kernel<kQ4, kSkewed>, qgemm_kernel<kQ4, kPipelined>,
                        qgemm_kernel<kFP8, kPipelined, 128>, qgemm_kernel<kQ8, kPipelined, 128>,
                        qgemm_kernel<kQ4, kPipelined, 128>, qgemm_kernel<kFP8, kPipelined, 64>,
                        qgemm_kernel<kQ8, kPipelined, 64>, qgemm_kernel<kQ4, kPipelined, 64>})
      SALA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(kBN)));
    auto ws_smem = [](int fmt, auto k256, auto k128, auto k64) {
      SALA_CUDA_CHECK(cudaFuncSetAttribute(k256, cudaFuncAttributeMaxDynamicSharedMemorySize, ws_smem_bytes(fmt, 256)));
      SALA_CUDA_CHECK(cudaFuncSetAttribute(k128, cudaFuncAttributeMaxDynamicSharedMemorySize, ws_smem_bytes(fmt, 128)));
      SALA_CUDA_CHECK(cudaFuncSetAttribute(k64, cudaFuncAttributeMaxDynamicSharedMemorySize, ws_smem_bytes(fmt, 64)));
    };
    ws_smem(kFP8, qgemm_ws_kernel<kFP8, 256>, qgemm_ws_kernel<kFP8, 128>, qgemm_ws_kernel<kFP8, 64>);
    ws_smem(kQ8, qgemm_ws_kernel<kQ8, 256>, qgemm_ws_kernel<kQ8, 128>, qgemm_ws_kernel<kQ8, 64>);
    ws_smem(kQ4, qgemm_ws_kernel<kQ4, 256>, qgemm_ws_kernel<kQ4, 128>, qgemm_ws_kernel<kQ4, 64>);
    return true;
  }();
  return available;
}

std::string qgemm_unfit(const QWeight& w, const void* x, int64_t ldx) {
  if (!qgemm_available())
    return "this build has no sm_90a code for this GPU, or its driver no cuTensorMapEncodeTiled (the fused "
           "packed GEMM needs Hopper, CMAKE_CUDA_ARCHITECTURES=90a and a CUDA 12+ driver)";
  if (w.in % kBK != 0) return "the input width " + std::to_string(w.in) + " is not a multiple of 64";
  if (w.group != w.in && w.group % kBK != 0)
    return "groups of " + std::to_string(w.group) + " columns (the fused packed GEMM takes multiples of 64)";
  if (ldx % 8 != 0 || (reinterpret_cast<uintptr_t>(x) & 15) != 0) return "input rows that are not 16-byte aligned";
  return {};
}

// Measured (H100, bench/results/2026-11-25-h100-qgemm.md): the kernel runs at 390–475 TFLOP/s;
// dequantize + cuBLAS pays a fixed ~3 bytes per weight and then runs at cuBLAS's ~750–800. The
// fused kernel wins where that pass dominates and its own grid fills the GPU: one token tile
// (N ≤ 256) of a matrix of 16384+ rows (≥ 128 CTAs; fp8 16384×4096 at 128–256 rows: 80 µs against
// 134–139), or of a 4096-row matrix with K split 4 ways (fp8 4096×16384 at 128 / 256 rows: 86 / 84
// µs against 140 / 145; 4096×4096: 30 / 32 against 36 / 39; int4 4096×4096 about even; with the
// 128-token tile at 128 rows: 63 and 23 µs, bench/results/2026-11-25-h100-qgemm-split.md). At 512
// rows (split 2 ways) and at 2048 prompt rows it is 0.6–0.85× the dequantize path. (The packed
// GEMV keeps N ≤ 64: cuda_quant.cpp.)
//
// The warp-specialized kernel (this session, bench/results/2026-11-26-h100-qgemm-ws.md) is 5–11%
// faster than the pipelined one at 129–256 rows, and at 257–512 rows of the 64M-weight matrices
// (16384×4096, 4096×16384) it beats dequantize + cuBLAS for 8-bit weights: fp8 139.5 against
// 169.6 µs at 512 rows. At ≤ 128 rows the pipelined kernel is as fast or faster; at 2048 it stays
// at ~510–545 TFLOP/s against ~650 effective for dequantize + cuBLAS.
static bool qgemm_ws_preferred(const QWeight& w, int N) {
  return N > 128 && (N <= kBN || (N <= 2 * kBN && w.fmt != kQ4 && w.out * w.in >= int64_t(16384) * 4096));
}

bool qgemm_preferred(const QWeight& w, int N) {
  const int mode = qgemm_mode();
  if (mode == 0) return false;
  if (mode >= 2 && mode <= 6) return true;
  if (N > kBN) return mode == 1 && qgemm_ws_preferred(w, N);
  const int64_t ctas = qgemm_tiles(w, N) * qgemm_splits(w, N);
  return ctas * 4 >= sm_count() * 3;
}

void launch_qgemm(const QWeight& w, const void* x, int64_t ldx, void* y, Dt dty, int64_t ldy, int N, cudaStream_t st,
                  float* split_ws) {
  SALA_CUDA_REQUIRE(qgemm_unfit(w, x, ldx).empty(), "qgemm: shape not supported (check qgemm_unfit first)");
  SALA_CUDA_REQUIRE(dty == kBF16 || dty == kF32, "qgemm: output must be bf16 or f32");
  if (N <= 0) return;
  const int splits = split_ws ? qgemm_splits(w, N) : 1, bn = qgemm_tile_n(N);
  const dim3 grid(unsigned(token_tiles(N)), unsigned(row_tiles(w)), unsigned(splits));
  SALA_CUDA_REQUIRE(grid.y <= 65535u, "qgemm: too many weight rows");
  auto run = [&](auto kernel) {
    kernel<<<grid, kThreads, smem_bytes(bn), st>>>(w, static_cast<const bf16*>(x), ldx, y, int(dty), ldy, N,
                                                   splits > 1 ? split_ws : nullptr);
  };
  // Automatic: kPipelined, the fastest in sum where the kernel is chosen (fp8/int8/int4 16384×4096
  // at 128 and 256 rows, H100: 491 µs against 502–504 for skewed and overlapped; per case the
  // three are within 2–10% of each other) and at 2048 rows (448–469 TFLOP/s).
  const int mode = qgemm_mode();
  if (mode == 6 || (mode == 1 && qgemm_ws_preferred(w, N))) {  // the warp-specialized kernel
    auto ws = [&](auto kernel) {
      kernel<<<grid, kWsThreads, ws_smem_bytes(w.fmt, bn), st>>>(w, x_tensor_map(x, ldx, w.in, N, bn), y, int(dty), ldy,
                                                                 N, splits > 1 ? split_ws : nullptr);
    };
    auto by_tile = [&](auto k256, auto k128, auto k64) { bn == 256 ? ws(k256) : bn == 128 ? ws(k128) : ws(k64); };
    switch (w.fmt) {
      case kFP8: by_tile(qgemm_ws_kernel<kFP8, 256>, qgemm_ws_kernel<kFP8, 128>, qgemm_ws_kernel<kFP8, 64>); break;
      case kQ8: by_tile(qgemm_ws_kernel<kQ8, 256>, qgemm_ws_kernel<kQ8, 128>, qgemm_ws_kernel<kQ8, 64>); break;
      case kQ4: by_tile(qgemm_ws_kernel<kQ4, 256>, qgemm_ws_kernel<kQ4, 128>, qgemm_ws_kernel<kQ4, 64>); break;
      default: SALA_CUDA_REQUIRE(false, "qgemm: unknown packed format");
    }
  } else {
  const int v = mode >= 2 && mode <= 5 ? mode - 2 : kPipelined;
  auto pick = [&](auto... kernels) {  // in Variant order
    int i = 0;
    ((i++ == v ? run(kernels) : void()), ...);
  };
  if (bn < kBN) {  // pipelined only (qgemm_tile_n)
    auto narrow = [&](auto k128, auto k64) { bn == 128 ? run(k128) : run(k64); };
    switch (w.fmt) {
      case kFP8: narrow(qgemm_kernel<kFP8, kPipelined, 128>, qgemm_kernel<kFP8, kPipelined, 64>); break;
      case kQ8: narrow(qgemm_kernel<kQ8, kPipelined, 128>, qgemm_kernel<kQ8, kPipelined, 64>); break;
      case kQ4: narrow(qgemm_kernel<kQ4, kPipelined, 128>, qgemm_kernel<kQ4, kPipelined, 64>); break;
      default: SALA_CUDA_REQUIRE(false, "qgemm: unknown packed format");
    }
  } else {
    switch (w.fmt) {
      case kFP8: pick(qgemm_kernel<kFP8, 0>, qgemm_kernel<kFP8, 1>, qgemm_kernel<kFP8, 2>, qgemm_kernel<kFP8, 3>); break;
      case kQ8: pick(qgemm_kernel<kQ8, 0>, qgemm_kernel<kQ8, 1>, qgemm_kernel<kQ8, 2>, qgemm_kernel<kQ8, 3>); break;
      case kQ4: pick(qgemm_kernel<kQ4, 0>, qgemm_kernel<kQ4, 1>, qgemm_kernel<kQ4, 2>, qgemm_kernel<kQ4, 3>); break;
      default: SALA_CUDA_REQUIRE(false, "qgemm: unknown packed format");
    }
  }
  }
  SALA_CUDA_LAUNCH("qgemm kernel");
  if (splits > 1) {
    const int64_t total = int64_t(N) * w.out;
    qgemm_split_reduce_kernel<<<grid_for(total, 256, sm_count() * 8), 256, 0, st>>>(split_ws, splits, N, w.out, y,
                                                                                     int(dty), ldy);
    SALA_CUDA_LAUNCH("qgemm split reduce");
  }
}

}  // namespace sala::cuda
