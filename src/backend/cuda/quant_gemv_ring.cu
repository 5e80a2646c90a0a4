// The packed decode GEMV at one row fed by the bulk copy engine (sm_90): int4 in tile groups,
// per-row fp8 / int8, int8 in groups (MLX 8-bit). One CTA per SM (int4: two) streams its share of
// the product's row blocks through a shared-memory ring of 16 KB code chunks (grouped formats: each
// with its groups' scales and biases), and 16 warps decode from there.
//
// Why (bench/results/2026-11-27-h100-ring-gemv.md): one 9B token's int4 g128 weights (5.16 GB)
// streamed this way by loads alone take 1.76 ms (2.93 TB/s) over the 129 products in step order,
// one launch each, where the register-staged GEMV (quant_gemv.cu) moved its products at ~2.5 TB/s
// (2.06 ms of the step): products of 9–75 MB are held by the bytes a CTA keeps in flight (register
// stages: ~64–80 KB per SM; the ring: 160–200 KB, issued by one thread without occupying the
// decoding warps). H100, 4K batch 1, + lm_head: int4 g128 2.63–2.66 → 2.47–2.50 ms per step, g64
// 2.81 → 2.63–2.66, fp8 3.79–3.81 → 3.56–3.63, int8 3.83 → 3.60–3.73, int8 g64 4.25 → 4.11–4.12.
//
// Speed of light, H100 (3.35 TB/s peak, ~3.0 reachable by a read): int4 g128 stores 0.53125 B per
// weight (codes 0.5 + f16 scale and bias per 128; zero-packed, z in the scale's low bits, 0.515625;
// 0.5625 with the f32 parameters of before, when
// 2×16384×4096 (gate/up) = 75.5 MB → 25 µs at 3.0 TB/s, measured 27.3): gate/up 71.3 MB → 23.8 µs;
// fp8 1 B: gate/up 134 MB → 45 µs, measured 45.4 (products alone).
//
// Layout (quant_layout.h): a row block's tiles are contiguous (ktiles × 512 B) and so are its
// group parameters (groups × 8 entries of 8 bytes, zero-packed 4), so a chunk of 32 tiles (int4: 2048 columns, 8-bit: 1024)
// is one bulk copy of codes and, for int4, one of the chunk's groups' parameters. A CTA takes the
// units [U·c/C, U·(c+1)/C) (a unit: one row block of one part; with ACT the gate's and the up's
// row block). Its producer (one thread of a 17th warp) fills the ring in unit order — the first
// `pre` chunks before the dependency wait (weights never depend on the previous kernel; more
// would compete with the small kernels before this one for memory), int4's paced ~1 µs apart
// (kDefaultPace) — and each of 16 consumer
// warps takes 2 tiles of every chunk, then frees it on its "empty" mbarrier. x is staged as f16
// (·2⁻⁴) and the mma runs in f16: int4 codes are made f16 where they lie (1024 + q, 1024 + 16·q:
// 5 instructions per 8 codes against the register GEMV's 7) and flushed per tile with the offsets
// folded into the group's scale and bias — per warp's pair of tiles where both lie in one group
// (PAIR: half the parameter work; products alone 1–4% faster) — Σx of each tile computed once per
// CTA instead of by a second mma per step; fp8 and int8 take the register GEMV's exact f16 decodes
// (decode_a_f16) and the row's scale (and bias·Σx) at the unit's end, grouped int8 flushed like int4.
// At a unit's end the warps' sums meet in shared memory (double-buffered: one barrier per unit).
// Bit for bit the same sums for a part whether launched alone, grouped, or fused with silu·mul;
// not bit for bit the register GEMV (another summation order; int4's offset 1024 costs ~10 bits
// of the fp32 sums: ~1e-5 relative).
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/quant_gemv_ring.h"

namespace sala::cuda {

namespace {

using namespace qlayout;

// Grouped int8 (the MLX 8-bit layout: a scale and bias per group of 32..1024 columns) as the
// kernel's format: the f16 decode of per-row int8 with the parameters riding with the codes.
constexpr int kQ8G = 5;

constexpr int kRingWarps = 16;  // consumers; warp kRingWarps is the producer
constexpr int kRingThreads = (kRingWarps + 1) * 32;
constexpr int kChunkTiles = 32;  // 16 KB of codes
constexpr int kWarpTiles = kChunkTiles / kRingWarps;  // each consumer warp's tiles of a chunk
constexpr int kChunkCodeBytes = kChunkTiles * kTileBytes;
constexpr int kMaxParamBytes = kChunkTiles * 64;  // groups of one tile (int4 64, int8 32): 8 × 4 f16 each
// A slot: the chunk's codes, then (grouped formats) its groups' parameters.
template <int FMT>
constexpr int kSlotBytes = kChunkCodeBytes + (FMT == kQ4 || FMT == kQ8G ? kMaxParamBytes : 0);
constexpr int kMaxSlots = 13;
constexpr int kMaxIn = 16384;  // x staged in shared memory as f16 (32 KB)
constexpr size_t kSmemLimit = 222 * 1024;  // dynamic: 227 KB per CTA less the static reduction buffer
// CTAs per SM: int4 two (each ≤ 104 KB and ≤ 56 registers per thread, no spills: 32 decoding warps
// per SM), 8-bit one. The grid has that many per SM.
template <int FMT>
constexpr int kCtasPerSm = FMT == kQ4 ? 2 : 1;
template <int FMT>
constexpr size_t kCtaSmem = kCtasPerSm<FMT> == 1 ? kSmemLimit : 104 * 1024;
template <int FMT>
constexpr int kChunkCols = kChunkTiles * tile_k(FMT == kQ4 ? kQ4 : kQ8);  // Q4 2048, 8-bit 1024

struct RingArgs {
  QGemvSet set;       // first[]: first unit of each part (ACT: gate and up, units = row blocks)
  const bf16* x;      // [1, in]
  int units, slots, pre, y_f32, trigger;
  int pace;  // SM cycles between the chunks requested before the dependency wait (0: all at once)
};

__device__ __forceinline__ void mbar_arrive_one(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// (w & MASK) | bits in one lop3 (the C++ spelling compiles to two; see nibbles_or).
template <uint32_t MASK>
__device__ __forceinline__ uint32_t and_or(uint32_t w, uint32_t bits) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(r) : "r"(w), "n"(MASK), "r"(bits));
  return r;
}
// x is staged as f16 times kXh: exact for 2^-10 ≤ |x| < 2^20 (bf16's 8 significant bits in f16),
// smaller values round by ≤ 2^-25 absolute — as the register GEMV's XH path.
constexpr float kXh = 1.f / 16.f;
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kRingWarps * 32) : "memory");
}

// The weight and row block of unit u's r-th row block.
template <bool ACT>
__device__ __forceinline__ void unit_block(const QGemvSet& s, int u, int r, int* part, int* rb) {
  if constexpr (ACT) {
    *part = r, *rb = u;
  } else {
    int p = 0;
#pragma unroll
    for (int i = 1; i < kGemvMaxParts; ++i) p += i < s.count && unsigned(u) >= s.first[i];
    *part = p, *rb = u - int(s.first[p]);
  }
}

// FMT: kQ4 (groups of 64..2048 dividing 2048) and kQ8G (int8 in groups of 32..1024 dividing
// 1024): the parameters ride with the codes, flushed per tile; kFP8, kQ8 or kQ8S (per row: one
// scale, and for kQ8 one bias, per row, applied at the unit's end). LOADS_ONLY (benchmarks:
// set_qgemv_ring(2, ...)): the consumers only read the codes, no decode or mma (the outputs are
// wrong) — what the ring moves without the arithmetic. PAIR (grouped, a consumer warp's two tiles
// of a chunk in one group: kQ4 in groups of ≥ 128 columns, kQ8G of ≥ 64): the pair's mma sums are
// flushed once, with the pair's Σx — half the parameter loads, conversions and flushes of the
// per-tile path. ZP (kQ4): zero-packed parameters, 4 bytes per entry (QWeight::zpack; every part).
template <int FMT, bool ACT, bool LOADS_ONLY = false, bool PAIR = false, bool ZP = false>
__global__ void __launch_bounds__(kRingThreads, kCtasPerSm<FMT>) qgemv_ring_kernel(const RingArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int R = ACT ? 2 : 1;
  constexpr bool kGrouped = FMT == kQ4 || FMT == kQ8G;
  constexpr int KT = FMT == kQ4 ? 64 : 32, MT = KT / 16, CC = kChunkCols<FMT>;
  constexpr bool kTileSums = FMT == kQ4 || FMT == kQ8 || FMT == kQ8G;  // the bias term b·Σx
  static_assert(!PAIR || (kGrouped && kWarpTiles == 2), "PAIR: grouped formats, two tiles per warp");
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ float red[2][R][kRingWarps][16];
  __shared__ float xtotal;  // kQ8: Σx of the whole row
  const QGemvSet& set = a.set;
  const int in = int(set.part[0].w.in), G = int(set.part[0].w.group);
  constexpr int kEntry = ZP ? 4 : 8;  // bytes of a grouped (rb, gi, g) parameter entry
  static_assert(!ZP || FMT == kQ4, "qgemv ring ZP: int4 only");
  const int ktiles = in / KT, groups = in / G, cpr = in / CC, pbytes = kGrouped ? CC / G * 8 * kEntry : 0;
  const int gshift = __ffs(G) - 1;  // grouped: G is a power of two (it divides the chunk's columns)
  const int slots = a.slots;
  uint8_t* const ring = smem;
  uint2* const xs = reinterpret_cast<uint2*>(smem + size_t(slots) * kSlotBytes<FMT>);  // x[4i .. 4i + 3]·kXh, f16
  float* const tsum = reinterpret_cast<float*>(smem + size_t(slots) * kSlotBytes<FMT> + size_t(in) * 2);  // Σx per tile
  const uint32_t full = smem_addr(tsum + ktiles), empty = full + 8 * slots;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int u0 = int(int64_t(a.units) * blockIdx.x / gridDim.x), u1 = int(int64_t(a.units) * (blockIdx.x + 1) / gridDim.x);
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, kRingWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (a.trigger) launch_dependents();

  if (warp == kRingWarps) {  // the producer
    if (lane != 0) return;
    int it = 0, s = 0;
    uint32_t phase = 0;  // of the slot's "empty" barrier to wait for, once the ring has gone round
    const long long t0 = clock64();
    for (int u = u0; u < u1; ++u)
      for (int r = 0; r < R; ++r) {
        int part, rb;
        unit_block<ACT>(set, u, r, &part, &rb);
        const QWeight& w = set.part[part].w;
        const uint8_t* codes = static_cast<const uint8_t*>(w.codes) + size_t(rb) * size_t(ktiles) * kTileBytes;
        const uint8_t* params = static_cast<const uint8_t*>(w.params) + size_t(rb) * size_t(groups) * 8 * kEntry;
        for (int cc = 0; cc < cpr; ++cc, ++it) {
          if (it == a.pre) grid_dep_wait();  // the rest once the kernels before have finished
          // Paced: chunk i of those before the wait no earlier than i·pace cycles after the start.
          if (it < a.pre && a.pace > 0)
            while (clock64() - t0 < (long long)a.pace * it) __nanosleep(32);
          if (it >= slots) mbar_wait(empty + 8 * s, phase);
          uint8_t* slot = ring + size_t(s) * kSlotBytes<FMT>;
          mbar_arrive_expect_tx(full + 8 * s, uint32_t(kChunkCodeBytes + pbytes));
          bulk_load(smem_addr(slot), codes + size_t(cc) * kChunkCodeBytes, kChunkCodeBytes, full + 8 * s);
          if constexpr (kGrouped)
            bulk_load(smem_addr(slot + kChunkCodeBytes), params + size_t(cc) * pbytes, uint32_t(pbytes), full + 8 * s);
          if (++s == slots) s = 0, phase ^= it >= slots;  // the first round waits for nothing
        }
      }
    return;
  }

  // The consumers: x after the dependency wait.
  grid_dep_wait();
  // x into shared memory as f16·kXh, and Σx of each tile's columns once for all row blocks (the
  // bias term b·Σx): KT / 4 consecutive lanes hold a tile (in / 4 is a multiple of 256).
  for (int i = int(threadIdx.x); i < in / 4; i += kRingWarps * 32) {
    const uint2 v = reinterpret_cast<const uint2*>(a.x)[i];
    const float f0 = __uint_as_float(v.x << 16), f1 = __uint_as_float(v.x & 0xffff0000u);
    const float f2 = __uint_as_float(v.y << 16), f3 = __uint_as_float(v.y & 0xffff0000u);
    uint2 h;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(h.x) : "f"(f1 * kXh), "f"(f0 * kXh));
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(h.y) : "f"(f3 * kXh), "f"(f2 * kXh));
    xs[i] = h;
    if constexpr (kTileSums) {
      float sum = (f0 + f1) + (f2 + f3);
#pragma unroll
      for (int o = KT / 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if ((lane & (KT / 4 - 1)) == 0) tsum[i / (KT / 4)] = sum;
    }
  }
  consumers_sync();
  if constexpr (FMT == kQ8) {  // per-row bias: Σx of the row
    if (warp == 0) {
      float sum = 0.f;
      for (int k = lane; k < ktiles; k += 32) sum += tsum[k];
      sum = warp_sum(sum);
      if (lane == 0) xtotal = sum;
    }
    consumers_sync();
  }
  int s = 0;
  uint32_t phase = 0;  // of the slot's "full" barrier
  int buf = 0;
  for (int u = u0; u < u1; ++u, buf ^= 1) {
    // Per-row formats: the row block's scale (and bias) for the reduction lanes, early.
    float4 prow[R];
    if constexpr (!kGrouped) {
      if (warp == 0 && lane < 16)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          int part, rb;
          unit_block<ACT>(set, u, r, &part, &rb);
          prow[r] = ld_row_param(set.part[part].w.params, rb, lane & 7);
        }
    }
    float cf[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float cq[2][4] = {};  // per row: the whole row's sums (two chains: half the dependent latency)
#pragma unroll
      for (int i = 0; i < 4; ++i) cf[r][i] = 0.f;
      for (int cc = 0; cc < cpr; ++cc) {
        mbar_wait(full + 8 * s, phase);
        const uint8_t* slot = ring + size_t(s) * kSlotBytes<FMT>;
        float4 p;  // grouped: the (pair's) group parameters (ZP: kQ4's folded s0, b0, s1, b1 below)
        float sx;  // and Σx of its columns
#pragma unroll
        for (int q = 0; q < kWarpTiles; ++q) {
          const int tile = warp * kWarpTiles + q, col = cc * CC + tile * KT;
          const uint4 c = *reinterpret_cast<const uint4*>(slot + tile * kTileBytes + lane * 16);
          if constexpr (LOADS_ONLY) {
            cf[r][0] += __uint_as_float((c.x ^ c.y ^ c.z ^ c.w) & 0x007fffffu);
            continue;
          }
          if constexpr (kGrouped) {
            const bool first = !PAIR || q == 0, last = !PAIR || q == kWarpTiles - 1;  // folded: q unrolled
            if (first) {
              const uint8_t* pg = slot + kChunkCodeBytes + (((tile * KT) >> gshift) * 8 + g) * kEntry;
              if constexpr (ZP) {  // {s|z, s|z}: the folded parameters of the flush below, directly
                p = zparam_folded<10, 6>(*reinterpret_cast<const uint32_t*>(pg));  // −s·(1024 + z), −s·(64 + z)
                p.x *= 16.f;
              } else {
                p = gparam_f32(*reinterpret_cast<const uint2*>(pg));  // f16 {s, b, s, b}
              }
#pragma unroll
              for (int i = 0; i < 4; ++i) cq[0][i] = cq[1][i] = 0.f;
              sx = tsum[cc * kChunkTiles + tile];
            } else {
              sx += tsum[cc * kChunkTiles + tile];
            }
            if constexpr (FMT == kQ4) {
#pragma unroll
              for (int j = 0; j < MT; ++j) {
                const uint2 xf = xs[(col + 16 * j + 4 * t) / 4];
                const uint32_t wd = word_of(c, j), w8 = wd >> 8;
                // f16 under the codes where they lie: rows g 1024 + q (low nibbles of each byte
                // pair), rows g + 8 1024 + 16·q (high nibbles) — 5 instructions per 8 codes.
                const uint32_t af[4] = {and_or<0x000F000Fu>(wd, 0x64006400u), and_or<0x00F000F0u>(wd, 0x64006400u),
                                        and_or<0x000F000Fu>(w8, 0x64006400u), and_or<0x00F000F0u>(w8, 0x64006400u)};
                mma16816_f16(cq[j & 1], af, xf);
              }
              // acc = Σ (1024 + q)·x/16 for rows g, Σ (1024 + 16·q)·x/16 for rows g + 8; so
              // s·Σq·x + b·Σx = 16·s·acc + (b − 1024·s)·Σx, and s·acc + (b − 64·s)·Σx.
              if (!last) continue;
              const float s0 = ZP ? p.x : 16.f * p.x, b0 = ZP ? p.y : fmaf(-1024.f, p.x, p.y);
              const float s1 = p.z, b1 = ZP ? p.w : fmaf(-64.f, p.z, p.w);
              cf[r][0] = fmaf(s0, cq[0][0] + cq[1][0], fmaf(b0, sx, cf[r][0]));
              cf[r][2] = fmaf(s1, cq[0][2] + cq[1][2], fmaf(b1, sx, cf[r][2]));
            } else {  // grouped int8: exact codes q, acc = Σ q·x/16
#pragma unroll
              for (int j = 0; j < MT; ++j) {
                uint32_t af[4];
                decode_a_f16<kQ8>(c, j, af);
                mma16816_f16(cq[j & 1], af, xs[(col + 16 * j + 4 * t) / 4]);
              }
              if (!last) continue;
              cf[r][0] = fmaf(16.f * p.x, cq[0][0] + cq[1][0], fmaf(p.y, sx, cf[r][0]));
              cf[r][2] = fmaf(16.f * p.z, cq[0][2] + cq[1][2], fmaf(p.w, sx, cf[r][2]));
            }
          } else {  // exact f16 codes (e4m3; 1024 + q − 1024 or − 1152), the row's sums in cq
#pragma unroll
            for (int j = 0; j < MT; ++j) {
              uint32_t af[4];
              decode_a_f16<FMT>(c, j, af);
              mma16816_f16(cq[(q * MT + j) & 1], af, xs[(col + 16 * j + 4 * t) / 4]);
            }
          }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive_one(empty + 8 * s);
        if (++s == slots) s = 0, phase ^= 1;
      }
      if constexpr (!kGrouped) cf[r][0] = cq[0][0] + cq[1][0], cf[r][2] = cq[0][2] + cq[1][2];
    }
    // Column 0 of the C fragment (lanes t = 0) is the row's sum; the warps' sums meet here.
    if (t == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) red[buf][r][warp][g] = cf[r][0], red[buf][r][warp][g + 8] = cf[r][2];
    consumers_sync();
    if (warp == 0 && lane < 16) {
      float v[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        v[r] = 0.f;
#pragma unroll
        for (int wi = 0; wi < kRingWarps; ++wi) v[r] += red[buf][r][wi][lane];
        if constexpr (!kGrouped) {  // y = s·Σq·x (+ b·Σx): acc = Σ q·x/16
          const float sc = lane < 8 ? prow[r].x : prow[r].z, bi = lane < 8 ? prow[r].y : prow[r].w;
          v[r] *= sc * (1.f / kXh);
          if constexpr (FMT == kQ8) v[r] = fmaf(bi, xtotal, v[r]);
        }
      }
      int part, rb;
      unit_block<ACT>(set, u, 0, &part, &rb);
      const QGemvPart& pt = set.part[part];
      const int64_t o = int64_t(rb) * 16 + lane;
      if (o < pt.w.out) {
        if constexpr (ACT)  // as silu_mul of the bf16 outputs: silu(g) rounded to bf16, times u
          static_cast<bf16*>(pt.y)[o] = __float2bfloat16_rn(rbf(silu(rbf(v[0]))) * rbf(v[1]));
        else if (a.y_f32)
          static_cast<float*>(pt.y)[o] = v[0];
        else
          static_cast<bf16*>(pt.y)[o] = __float2bfloat16_rn(v[0]);
      }
    }
  }
#else
  __trap();
#endif
}

// A/B knobs (benchmarks, tests); −1: the format's default below.
int env_or(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : fallback;
}
// 0: the register GEMV; 2: the ring's loads alone (a timing experiment: outputs wrong, says so).
int ring_mode_from_env() {
  const int m = env_or("SALA_CUDA_QGEMV_RING", 1);
  if (m == 2)
    std::fprintf(stderr, "warning: SALA_CUDA_QGEMV_RING=2: the ring GEMV only loads its weights, outputs are wrong "
                         "(timing experiments only)\n");
  return m == 2 ? 2 : m != 0;
}
int g_ring_mode = ring_mode_from_env();
int g_ring_formats = env_or("SALA_CUDA_QGEMV_RING_FORMATS", 3);  // bit 0 int4, bit 1 fp8 / int8
int g_ring_slots = env_or("SALA_CUDA_QGEMV_RING_SLOTS", -1);  // at most this many chunks in the ring
int g_ring_pre = env_or("SALA_CUDA_QGEMV_RING_PRE", -1);      // chunks requested before the dependency wait
int g_ring_pair = env_or("SALA_CUDA_QGEMV_RING_PAIR", 1);     // 0: grouped weights flush per tile
int g_ring_pace = env_or("SALA_CUDA_QGEMV_RING_PACE", -1);    // cycles between the pre-wait chunks
// Defaults from the H100 4K batch-1 step (bench/results/2026-11-27-h100-ring-gemv.md): int4 4 chunks
// before the wait (0: 2.77, 2: 2.58–2.62, 4: 2.53, 8: 2.59 ms/step for g128, f32 parameters then);
// with f16 parameters (2026-11-27-h100-f16-group-params.md) 8 slots of 18 KB in one CTA per SM
// (2.38–2.39 ms against 2.43–2.45 with the 11 that fit: a ring that leaves shared memory free
// starts beside the one-CTA norm kernels before it), then two CTAs per SM of 4 slots each (2.35–2.38
// against 2.38–2.44 in interleaved runs: twice the decoding warps); with the pair flush
// (2026-11-27-h100-step-decomposition.md, runs 10–12) 3 chunks before the wait: int4 g128 + lm_head
// 2.27–2.30 ms against 2.30–2.32 with 4 (2: 2.33, 5: 2.32; 3 or 5 slots: 2.30–2.34). 8-bit: 8
// before the wait (fp8 + lm_head 3.60–3.63 ms against 3.64 with 4) and 10 slots of 16 KB in one CTA
// (13: 3.59–3.60, 8: 3.61, 6: 3.90; two CTAs of 4: 3.61).
template <int FMT>
constexpr int kDefaultPre = FMT == kQ4 ? 3 : 8;
template <int FMT>
constexpr int kDefaultSlots = FMT == kQ4 ? 4 : 10;
// int4's chunks before the wait are requested ~1 µs apart (2000 cycles at 1980 MHz) instead of at
// once (bench/results/2026-11-27-ring-pacing.md): all 264 CTAs' 3 chunks in one burst (13 MB)
// queue in L2 while the one-CTA residual norm before the product reads and writes its row, and
// that norm then takes twice its uncongested time. H100, 4K batch 1, kernel trace: the 63 residual
// norms 223 → 169 µs per step, the products after them +34, the step −30 µs; int4 g128 + lm_head
// a median 2.956× → 3.007× bf16 over ~20 interleaved comparisons. 1500–2000 cycles is the optimum
// (1000 gains less, 3000 and more land chunks after the wait). 8-bit: slower paced (fp8 + lm_head
// 3.51 → 3.55 ms at 2000 cycles, neutral at 1000), so at once.
template <int FMT>
constexpr int kDefaultPace = FMT == kQ4 ? 2000 : 0;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// sm_90 (bulk copies, mbarrier try_wait) with the shared memory a ring CTA takes.
bool device_fits() {
  static const bool ok = [] {
    int dev = 0, major = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return major >= 9 && size_t(optin) >= kSmemLimit + 5 * 1024;
  }();
  return ok;
}

template <int FMT, bool ACT, bool LOADS_ONLY = false, bool PAIR = false, bool ZP = false>
void launch_ring_f(RingArgs a, bool pdl, cudaStream_t st) {
  if constexpr (!LOADS_ONLY) {
    if (g_ring_mode == 2) return launch_ring_f<FMT, ACT, true, false, ZP>(a, pdl, st);
  }
  const size_t in = size_t(a.set.part[0].w.in);
  const size_t fixed = in * 2 + in / 32 * 4;  // x, Σx per tile
  const int cap = g_ring_slots >= 2 ? std::min(g_ring_slots, kMaxSlots) : kDefaultSlots<FMT>;
  a.slots = int(std::min<size_t>(cap, (kCtaSmem<FMT> - fixed - 16 * kMaxSlots) / kSlotBytes<FMT>));
  a.pre = g_ring_pre >= 0 ? g_ring_pre : kDefaultPre<FMT>;
  a.pace = !pdl ? 0 : g_ring_pace >= 0 ? g_ring_pace : kDefaultPace<FMT>;  // without PDL nothing runs before it
  const size_t smem = size_t(a.slots) * kSlotBytes<FMT> + fixed + 16 * size_t(a.slots);
  auto* kernel = qgemv_ring_kernel<FMT, ACT, LOADS_ONLY, PAIR, ZP>;
  static const bool attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kCtaSmem<FMT>)) == cudaSuccess &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) ==
          cudaSuccess;
  SALA_CUDA_REQUIRE(attr, "qgemv ring: shared memory attributes refused");
  const int ctas = std::min(a.units, sm_count() * kCtasPerSm<FMT>);
  launch_pdl(pdl, kernel, dim3(unsigned(ctas)), dim3(kRingThreads), smem, st, a);
}

template <bool ACT>
void launch_ring(const RingArgs& a, bool pdl, cudaStream_t st) {
  const QWeight& w = a.set.part[0].w;
  // A consumer warp's tiles of a chunk (int4 128 columns, int8 64) in one group: one flush (PAIR).
  const bool pair = g_ring_pair && w.group != w.in && w.group >= kWarpTiles * tile_k(w.fmt);
  switch (w.fmt) {
    case kQ4:
      if (w.zpack)
        return pair ? launch_ring_f<kQ4, ACT, false, true, true>(a, pdl, st)
                    : launch_ring_f<kQ4, ACT, false, false, true>(a, pdl, st);
      return pair ? launch_ring_f<kQ4, ACT, false, true>(a, pdl, st) : launch_ring_f<kQ4, ACT>(a, pdl, st);
    case kFP8: return launch_ring_f<kFP8, ACT>(a, pdl, st);
    case kQ8:
      if (w.group != w.in)
        return pair ? launch_ring_f<kQ8G, ACT, false, true>(a, pdl, st) : launch_ring_f<kQ8G, ACT>(a, pdl, st);
      if (symmetric_q8(a.set)) return launch_ring_f<kQ8S, ACT>(a, pdl, st);
      return launch_ring_f<kQ8, ACT>(a, pdl, st);
    default: SALA_CUDA_REQUIRE(false, "qgemv ring: unknown packed format");
  }
}

}  // namespace

void set_qgemv_ring(int mode, int pre, int pace) {
  g_ring_mode = mode;
  g_ring_pre = pre;
  g_ring_pace = pace;
}

bool qgemv_ring_applies(const QGemvSet& set, int N) {
  const QWeight& w = set.part[0].w;
  if (g_ring_mode == 0 || N != 1 || !device_fits()) return false;
  if (w.fmt == kQ4) {
    if (!(g_ring_formats & 1)) return false;
    constexpr int cols = kChunkCols<kQ4>;
    if (w.in % cols != 0 || w.group % 64 != 0 || cols % w.group != 0) return false;
  } else if (w.fmt == kFP8 || w.fmt == kQ8) {  // per row, or int8 in groups (MLX 8-bit)
    constexpr int cols = kChunkCols<kQ8>;
    const bool grouping_ok = w.group == w.in || (w.fmt == kQ8 && w.group % 32 == 0 && cols % w.group == 0);
    if (!(g_ring_formats & 2) || !grouping_ok || w.in % cols != 0) return false;
  } else {
    return false;
  }
  if (w.in > kMaxIn) return false;
  for (int i = 0; i < set.count; ++i)
    if (!aligned16(set.part[i].w.codes) || !aligned16(set.part[i].w.params)) return false;
  for (int i = 1; i < set.count; ++i)
    if (set.part[i].w.zpack != w.zpack) {  // one parameter form per launch (never from one checkpoint's quantizer)
      static bool noted = false;
      if (!noted)
        std::fprintf(stderr, "note: cuda: a grouped int4 product mixes zero-packed and 8-byte parameters; it runs on "
                             "the register GEMV instead of the ring GEMV\n");
      noted = true;
      return false;
    }
  return true;
}

void launch_qgemv_ring(const QGemvSet& set, const void* x, bool y_f32, bool trigger, bool pdl, cudaStream_t st) {
  RingArgs a{set, static_cast<const bf16*>(x), 0, 0, 0, int(y_f32), int(trigger && pdl), 0};
  unsigned units = 0;
  for (int i = 0; i < set.count; ++i) {
    a.set.first[i] = units;
    units += unsigned((set.part[i].w.out + 15) / 16);
  }
  a.set.first[set.count] = units;
  a.units = int(units);
  launch_ring<false>(a, pdl, st);
}

void launch_qgemv_ring_act(const QGemvSet& set, const void* x, bool trigger, bool pdl, cudaStream_t st) {
  RingArgs a{set, static_cast<const bf16*>(x), int((set.part[0].w.out + 15) / 16), 0, 0, 0, int(trigger && pdl), 0};
  launch_ring<true>(a, pdl, st);
}

}  // namespace sala::cuda
