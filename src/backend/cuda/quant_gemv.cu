// Packed weights on the GPU (docs/quantization.md): the decode GEMV that reads FP8/Q8/Q4 tiles
// directly, the dequantization of row blocks to bf16 for the cuBLAS prefill path, the tiling of
// canonical codes at load, and random packed weights for benchmarks. Layout: quant_layout.h.
//
// Speed of light (decode, N ≤ 32 rows per launch): the packed bytes once per call. Per weight:
//   Q4 group 64: 0.5 B codes + 4 B (s, b as f16) / 64 = 0.5625 B  (bf16: 2 B → 3.6× less)
//   Q8 / FP8 per row: 1 B + 8 B per row ≈ 1.0 B                     (2× less)
//   H200 (4.8 TB/s, 132 SMs at ~1.75 GHz): 20.8 B/clk/SM → one 512-byte code tile per ~25 clk
//   (8-bit) or per ~28 clk with its 64 bytes of Q4 group params. 4096×4096 Q4 is 9.4 MB →
//   2.2 µs, about twice the ~1 µs load latency under load: small matrices are latency bound, so
//   every byte should be requested at once (each SM owns ~80 KB of it).
//
// Kernel: a CTA owns R row blocks of 16 rows (R = 2 above 8192 rows or for N > 8); its W warps take the
// tiles in turn, U tiles per stage and two stages in flight (U, W and a minimum of CTAs per SM
// form the launch shape, chosen per format and size in qgemv_small from measured sweeps): the codes and params of stage s+1
// (and, before griddepcontrol.wait, of stages 0 and 1: weights never depend on the previous
// kernel) are in registers while stage s is decoded (~2·U·R·640 B per warp, ~80 KB per SM for
// Q4 at N ≤ 8). Per mma.sync.m16n8k16 a lane decodes its codes for rows g and g+8 into the
// bf16 A fragment (exact: every code value is a bf16), once for all NT = ⌈N/8⌉ n-tiles; x (bf16,
// the B fragments) is one 8-byte load per mma and n-tile, shared by the R row blocks, and the
// products of the integer codes accumulate in fp32 (cq). Scales and biases are applied in fp32
// when a group ends:  y += s·Σ x·q + b·Σ x,  Σ x from an mma with an all-ones A (cx; shared by
// the R row blocks, none for FP8). Q4 decodes 128 + q (one lop3 per two values): its bias becomes
// b − 128·s (the cancellation of 128·Σx costs ~3 bits of the fp32 sums: ~3e-6 relative, far under
// bf16 rounding). FP8 goes through the sm_89+ e4m3x2 → f16x2 conversion (exact; older targets
// shift the e4m3 bits into an f16, e4m3·2^-8, and scale by 256).
// Instructions are the limit, not bytes in flight: at full bandwidth an SM must retire a 512-byte
// tile every ~25–31 clk, i.e. ≤ ~120 warp instructions per tile at perfect issue and ~60 at the
// ~50% issue rate these dependent chains reach. Nsight Compute (int4 16384×4096) counted 153 per
// tile before the nibble decode became one lop3 per pair (nibbles_or) and full tiles lost their
// per-step bounds branches (each of which also put a WARPSYNC before the mma.sync); now per tile:
// 4 × (3 shifts + 4 lop3 + 2 mma) + 4 x loads + the flush (~15) ≈ 60 — int4 2.0 → 2.8 TB/s.
// Shared-memory code rings (more bytes in flight), an f16 Q4 path without the all-ones mma and
// one accumulator chain per tile were each measured slower here (bench/results/2026-11-25-h200-quant-r2.md);
// at N = 1 on sm_90 a separate kernel with a bulk-copy ring, one CTA per SM and 16 decoding warps
// is faster and takes int4 and 8-bit where it applies (quant_gemv_ring.cu, 2026-11-27).
// Two row blocks per CTA share the x loads and the Σx mma: the automatic shape above 8192 rows.
// N = 1, per-row FP8 and Q8 (XH, the automatic shapes): x is staged once per CTA in shared memory
// as f16·2^-4 and the mma runs in f16, so the A fragment costs one conversion per e4m3 pair
// (cvt.rn.f16x2.e4m3x2) or a prmt under an f16 exponent and a subtraction per int8 pair instead of
// four or five instructions: fp8 16384×4096 22.1 → 19.1 µs, int8 4096×16384 24.7 → 21.5 µs (H200).
// Grouped launch (QGemvSet: q/k/v/z, gate/up): the parts' CTAs one after another in one grid; a
// CTA finds its part and computes its row blocks as a launch of that part alone would (same shape:
// bit for bit). The automatic shape is that of one matrix of all the parts' rows.
// The launch lets the next PDL kernel start (griddepcontrol.launch_dependents) once every CTA is
// resident: its weights then stream in while this grid's last CTAs drain.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "core/rng.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/quant_gemv_ring.h"
#include "backend/quant_layout.h"

namespace sala::cuda {

// Tuning knobs for tests and benchmarks (not for production use): nt_variant picks the kernel for
// N > 8 (0: automatic, 1/2: the GEMV below with one/two row blocks per CTA, 3: the row-split
// batched kernel, 4/5/6: it with 2/4/8 row blocks per CTA, 7: it with the columns split — these
// must apply); trigger = false launches no dependent early. Declared where used (cuda_quant_parity.cpp, cuda_bench.cpp).
void set_qgemv_tuning(int nt_variant, bool trigger);
// N ≤ 8: the launch shape (0: automatic; 1..8: fixed shapes, see qgemv_f). Benchmarks only.
void set_qgemv_small_variant(int v);
// Whether the FP8 N = 1 GEMV of a 64 KB-per-CTA matrix copies it whole before its wait (PA; default on).
void set_qgemv_prefetch(bool on);

namespace {

using namespace qlayout;

int g_nt_variant = 0;
int g_small_variant = 0;
bool g_trigger = true;
// PA for FP8 where it fits (the 4096×4096 o_proj), unless SALA_CUDA_QGEMV_PREFETCH=0 or
// set_qgemv_prefetch(false) (A/B runs, tests). H100, 4K batch 1
// (bench/results/2026-11-26-h100-product-norm-fusion.md, runs 12–15): fp8 3.91 → 3.87 ms/step;
// int8 neutral (3.96 → 3.97); int4 (its SP shape) slower (2.95 → 2.99).
bool g_prefetch = [] {
  const char* e = std::getenv("SALA_CUDA_QGEMV_PREFETCH");
  return !(e && std::atoi(e) == 0);
}();

// Two f32 values with at most 8 significant bits (their low 16 bits are zero) as a bf16x2: exact.
__device__ __forceinline__ uint32_t pack_exact_bf16x2(float lo, float hi) {
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

// FP8: e4m3 bytes 2h, 2h+1 of a word as a bf16x2 of the exact values times kFp8Unit.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
constexpr float kFp8Unit = 1.f;
__device__ __forceinline__ uint32_t fp8x2_bf16x2(uint32_t word, int h) {
  uint32_t f16x2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(f16x2) : "h"(uint16_t(word >> (16 * h))));
  const float2 f = f16x2_to_float2(f16x2);
  return pack_exact_bf16x2(f.x, f.y);  // ≤ 4 significant bits
}
#else
constexpr float kFp8Unit = 1.f / 256.f;  // e4m3·2^-8 through f16 bits (quant_layout.h)
__device__ __forceinline__ uint32_t fp8x2_bf16x2(uint32_t word, int h) {
  const float2 f = f16x2_to_float2(fp8_f16x2(word, h));
  return pack_exact_bf16x2(f.x, f.y);
}
#endif

// The A fragment (a0: row g k0,k1; a1: row g+8 k0,k1; a2: row g k2,k3; a3: row g+8 k2,k3) of
// mma j from a lane's 16-byte piece.
template <int FMT>
__device__ __forceinline__ void decode_a(const uint4& c, int j, uint32_t a[4]) {
  if constexpr (FMT == kQ4) {
    const uint32_t w = word_of(c, j);
#pragma unroll
    for (int p = 0; p < 4; ++p) a[p] = nibbles_or(w >> (4 * p), 0x43004300u);  // = q4_bf16x2(w, p)
  } else if constexpr (FMT == kQ8 || FMT == kQ8S) {
    const uint32_t wg = word_of(c, 2 * j), wg8 = word_of(c, 2 * j + 1);
    auto q = [](uint32_t word, int i) { return q8_f32(word, i, FMT == kQ8S ? 128.f : 0.f); };
    a[0] = pack_exact_bf16x2(q(wg, 0), q(wg, 1));
    a[1] = pack_exact_bf16x2(q(wg8, 0), q(wg8, 1));
    a[2] = pack_exact_bf16x2(q(wg, 2), q(wg, 3));
    a[3] = pack_exact_bf16x2(q(wg8, 2), q(wg8, 3));
  } else {
    const uint32_t wg = word_of(c, 2 * j), wg8 = word_of(c, 2 * j + 1);
    a[0] = fp8x2_bf16x2(wg, 0);
    a[1] = fp8x2_bf16x2(wg8, 0);
    a[2] = fp8x2_bf16x2(wg, 1);
    a[3] = fp8x2_bf16x2(wg8, 1);
  }
}

// n 16-byte pieces from global to shared memory by a CTA of T threads (cp.async; the caller commits).
template <int T>
__device__ __forceinline__ void cp_async_pieces(uint4* dst, const uint4* src, int n) {
  for (int i = threadIdx.x; i < n; i += T) cp_async16(smem_addr(dst + i), src + i, 16);
}

// The part of a grouped launch that CTA b works on (parts are laid out one after another) and the
// first of b's R row blocks in it.
struct PartBlock {
  int part, rb0;
};
template <int R>
__device__ __forceinline__ PartBlock find_part(const QGemvSet& s, unsigned b) {
  // first[] ascends: p counts the parts that start at or before b. Branch-free (a search loop costs
  // the 64-register launch shapes a spill).
  int p = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxParts; ++i) p += i < s.count && b >= s.first[i];
  return {p, int(b - s.first[p]) * R};
}
// The CTA index read anew (volatile: not merged with earlier reads), so that a lookup from it is
// redone instead of kept in registers.
__device__ __forceinline__ unsigned cta_index_again() {
  unsigned b;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(b));
  return b;
}

// The A fragment and the mma of a launch: f16 when x is staged as f16 (XH), bf16 otherwise.
template <int FMT, bool XH>
__device__ __forceinline__ void decode_x(const uint4& c, int j, uint32_t a[4]) {
  if constexpr (XH) decode_a_f16<FMT>(c, j, a);
  else decode_a<FMT>(c, j, a);
}
template <bool XH>
__device__ __forceinline__ void mma_x(float d[4], const uint32_t a[4], uint2 b) {
  if constexpr (XH) mma16816_f16(d, a, b);
  else mma16816(d, a, b.x, b.y);
}

// x is staged as f16 times kXhScale: exact for 2^-13 ≤ |x| < 2^20 (bf16's 8 significant bits fit
// f16's normal and upper subnormal range there); smaller values round by ≤ 2^-21 absolute (far
// under the bf16 output's rounding), larger ones (|x| ≥ 2^20, no sane activation) overflow.
constexpr float kXhScale = 1.f / 16.f;
// 16-byte pieces of shared memory XH's staged x takes (in 2-byte values, rounded up so that what
// follows it — PA's codes — stays 16-byte aligned): the kernel's layout and the launch's size.
__host__ __device__ constexpr int xh_pieces(int64_t in) { return int((in + 7) / 8); }


// cf += s·cq + b·cx for one row block with the scales and biases (rows g, g + 8) already in the
// units the codes and x were decoded in; then cq = 0 (cx is the caller's: shared by row blocks).
template <int FMT, int NT>
__device__ __forceinline__ void flush_scaled(float (&cf)[NT][4], float (&cq)[NT][4], const float (&cx)[NT][4],
                                             float s0, float b0, float s1, float b1) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float* c = cf[nt];
    c[0] = fmaf(s0, cq[nt][0], c[0]);
    c[1] = fmaf(s0, cq[nt][1], c[1]);
    c[2] = fmaf(s1, cq[nt][2], c[2]);
    c[3] = fmaf(s1, cq[nt][3], c[3]);
    if constexpr (FMT != kFP8 && FMT != kQ8S) {  // FP8 has no bias; symmetric int8 decodes it away
      c[0] = fmaf(b0, cx[nt][0], c[0]);
      c[1] = fmaf(b0, cx[nt][1], c[1]);
      c[2] = fmaf(b1, cx[nt][2], c[2]);
      c[3] = fmaf(b1, cx[nt][3], c[3]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) cq[nt][i] = 0.f;
  }
}
// The same from the group's float4 {s, b, s, b}.
template <int FMT, bool XH, int NT>
__device__ __forceinline__ void flush_group(float (&cf)[NT][4], float (&cq)[NT][4], const float (&cx)[NT][4],
                                            float4 p) {
  float s0 = p.x, b0 = p.y, s1 = p.z, b1 = p.w;
  if constexpr (FMT == kFP8) s0 *= 1.f / kFp8Unit, s1 *= 1.f / kFp8Unit;
  if constexpr (FMT == kQ4) b0 = fmaf(-128.f, s0, b0), b1 = fmaf(-128.f, s1, b1);
  if constexpr (XH) s0 *= 1.f / kXhScale, s1 *= 1.f / kXhScale, b0 *= 1.f / kXhScale, b1 *= 1.f / kXhScale;
  flush_scaled<FMT, NT>(cf, cq, cx, s0, b0, s1, b1);
}
// The same from a grouped entry as loaded (ld_gparam): zero-packed (zp, Q4) {s|z, s|z} gives the
// decode's folded bias −s·(128 + z) directly (zparam_folded).
template <int FMT, bool XH, int NT>
__device__ __forceinline__ void flush_entry(float (&cf)[NT][4], float (&cq)[NT][4], const float (&cx)[NT][4],
                                            uint2 raw, bool zp) {
  if (FMT == kQ4 && !XH && zp) {
    const float4 p = zparam_folded<7, 7>(raw.x);
    return flush_scaled<FMT, NT>(cf, cq, cx, p.x, p.y, p.z, p.w);
  }
  flush_group<FMT, XH, NT>(cf, cq, cx, gparam_f32(raw));
}

// y[n, o] of a part, f32 or rounded to bf16.
__device__ __forceinline__ void store_y(const QGemvPart& part, int n, int64_t o, float v, int y_f32) {
  if (y_f32)
    static_cast<float*>(part.y)[size_t(n) * part.ldy + o] = v;
  else
    static_cast<bf16*>(part.y)[size_t(n) * part.ldy + o] = __float2bfloat16_rn(v);
}

// Tiles k = s·W·U + warp + W·u (u < U) form stage s of a warp; a CTA's warps read W·U
// consecutive tiles of each of its row blocks per stage.
// PR: the weight has one scale per row (group = in), known at compile time: no per-tile
// parameter registers (they decide whether a shape fits 64 registers without spills).
// LP: tile-group parameters are loaded when their tile is decoded, not a stage ahead (fewer
// registers for grouped formats; the load overlaps the tile's decode and mma).
// TG: how groups lie in tiles, known at compile time. 1: every tile inside one group (group %
// tile_k == 0; the sub-tile group path is compiled out); 2: two groups per tile (Q4 group 32:
// flushes after mma steps 1 and 3, no division per step); 0: any group, found at run time; 3: as
// 1, for Q4 with zero-packed parameters (QWeight::zpack) — with 1 the parameter form is known at
// compile time (a run-time choice of the two conversions cost batch-32 int4 decode 6%), with 0
// and 2 it is read from the weight.
// XH: N = 1, x staged once per CTA into shared memory as f16 (dynamic, in·2 bytes) and the mma
// in f16 (decode_a_f16): FP8 and Q8 only.
// SP: grouped formats; the CTA's group parameters (R row blocks × in/group × 64 bytes of f16) are
// copied into shared memory with cp.async before griddepcontrol.wait, so a tile's flush reads
// them from shared memory instead of waiting on a global load of its own (LP put one memory
// latency per tile on each warp's critical path).
// ACT: the MLP's gate and up projections with silu(gate)·up in the epilogue (launch_qgemv_act): CTA
// b computes row block b of part 0 (gate) as its first row block and of part 1 (up) as its second,
// and writes only bf16(bf16(silu(g))·u) of g, u rounded to bf16 — the values silu_mul computes
// from the bf16 outputs of the unfused launch (same launch shape: the same sums).
// PA: the CTA's whole code block (R row blocks, ≤ 64 KB) is copied into shared memory before the
// dependency wait, and the stages are read from there: a product that follows a long chain of
// small kernels (o_proj after the GLA step or the sparse attention) has all its bytes in flight
// while they run, instead of two stages. On sm_90 one bulk copy per row block (the copy engine,
// one mbarrier) rather than 16-byte cp.async pieces from every thread: H100, 4K batch 1, fp8 +
// lm_head fp8 3.85 → 3.83 ms/step over seven same-machine pairs, six of them faster
// (bench/results/2026-11-26-h100-read-rate.md).
template <int FMT, int NT, int R, int U, int W, int MINB = 1, bool PR = false, bool LP = false, int TG = 0,
          bool XH = false, bool SP = false, bool ACT = false, bool PA = false>
__global__ void __launch_bounds__(W * 32, MINB) qgemv_kernel(QGemvSet set, const bf16* __restrict__ x, int ldx,
                                                        int N, int y_f32, int trigger) {
  constexpr int KT = tile_k(FMT), MT = KT / 16;
  constexpr bool kBias = FMT != kFP8 && FMT != kQ8S;
  static_assert(FMT != kQ8S || PR, "qgemv: symmetric int8 decode of per-row weights only");
  static_assert(!XH || (NT == 1 && FMT != kQ4), "qgemv XH: one n-tile, FP8 or Q8");
  static_assert(!(SP && (PR || LP)), "qgemv SP: grouped formats, instead of LP");
  static_assert(!ACT || R == 2, "qgemv ACT: gate and up row blocks");
  static_assert(!PA || (XH && !SP), "qgemv PA: per-row formats with x staged");
  __shared__ float red[W][R * 16][NT * 8];
  extern __shared__ uint4 dyn_smem[];  // SP: the parameters, then XH: x, then PA: the codes
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const PartBlock pb = ACT ? PartBlock{0, int(blockIdx.x)} : find_part<R>(set, blockIdx.x);
  const QWeight& w = set.part[pb.part].w;
  // in and group are the same for every part: read from part 0 (constant-bank operands).
  const int in = int(set.part[0].w.in), G = int(set.part[0].w.group), ktiles = (in + KT - 1) / KT, groups = in / G;
  const int rbs = int((w.out + 15) / 16), rb0 = pb.rb0;
  const bool per_row = PR || G == in;               // one flush at the end
  constexpr int TGK = TG == 3 ? 1 : TG;             // TG 3: tile groups (1), zero-packed parameters
  static_assert(TG != 3 || FMT == kQ4, "qgemv TG 3: int4 only");
  const uint4* codes[R];
  const void* params[R];  // grouped: f16 or zero-packed tiles (quant_layout.h), entry pidx[r] + 8·gi
  int64_t pidx[R];
  bool zp[R];
  float4 prow[R];          // per row: the f32 tile, for good
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const QWeight& wr = ACT ? set.part[r].w : w;
    const int rb = ACT ? rb0 : min(rb0 + r, rbs - 1);  // a missing second row block re-reads the last one (not stored)
    codes[r] = static_cast<const uint4*>(wr.codes) + size_t(rb) * size_t(ktiles) * 32 + lane;
    params[r] = wr.params;
    pidx[r] = int64_t(rb) * groups * 8 + g;
    zp[r] = TG == 3 || (TG != 1 && wr.zpack);  // tile groups: the form known at compile time
    prow[r] = per_row ? ld_row_param(wr.params, rb, g) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const bool tile_group = TGK == 1 || (!per_row && G % KT == 0);  // every tile inside one group: flush per tile
  // Group of tile k: k / (G / KT) — a shift when that is a power of two (no division per tile).
  const uint32_t tpg = tile_group ? uint32_t(G / KT) : 1u, G32 = uint32_t(G);
  const int tpg_shift = (tpg & (tpg - 1)) == 0 ? __ffs(int(tpg)) - 1 : -1;
  const int step = W * U, stages = (ktiles + step - 1) / step;
  // SP: row block r's parameters of group gi and lane group g: entry gi·8 + g of sp_r(r).
  auto sp_r = [&](int r) { return reinterpret_cast<const uint8_t*>(dyn_smem) + size_t(r) * groups * 64; };
  uint2* xh = reinterpret_cast<uint2*>(dyn_smem + (SP ? R * groups * 4 : 0));  // XH: x[0, 4i..4i+3]·kXhScale as f16
  uint4* const pa = reinterpret_cast<uint4*>(xh) + xh_pieces(in);  // PA: row block r's tiles at pa[r·ktiles·32 ..]

  uint4 cwA[R][U], cwB[R][U];
  uint2 ptA[R][U], ptB[R][U];
  const uint4 zero4 = make_uint4(0, 0, 0, 0);
  const uint2 zero2 = make_uint2(0, 0);
  auto load = [&](int s, uint4 (&cw)[R][U], uint2 (&pt)[R][U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = s * step + warp + W * u;
      const bool ok = k < ktiles;
      const uint32_t gi = tpg_shift >= 0 ? uint32_t(k) >> tpg_shift : uint32_t(k) / tpg;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        cw[r][u] = !ok ? zero4 : PA ? pa[(r * ktiles + k) * 32 + lane] : ld_stream(codes[r] + k * 32);
        pt[r][u] = !LP && !SP && tile_group && ok ? ld_gparam(params[r], zp[r], pidx[r] + gi * 8) : zero2;
      }
    }
  };

  // Weights never depend on earlier kernels: the first two stages (PA: the whole code block) are
  // requested before the wait.
  if constexpr (SP) {
#pragma unroll
    for (int r = 0; r < R; ++r)  // the row block's entries: 64 bytes per group, zero-packed 32
      cp_async_pieces<W * 32>(reinterpret_cast<uint4*>(dyn_smem) + r * groups * 4,
                              static_cast<const uint4*>(params[r]) + (pidx[r] - g) / (zp[r] ? 4 : 2),
                              groups * (zp[r] ? 2 : 4));
    cp_async_commit();
  }
  __shared__ uint64_t pa_bar;  // PA (sm_90): completes when the code block has landed
  if constexpr (PA) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {  // one bulk copy per row block (each contiguous): no per-piece issue
      const uint32_t bar = smem_addr(&pa_bar);
      mbar_init(bar, 1);
      fence_proxy_async();
      mbar_arrive_expect_tx(bar, uint32_t(R * ktiles * 512));
#pragma unroll
      for (int r = 0; r < R; ++r) bulk_load(smem_addr(pa + r * ktiles * 32), codes[r] - lane, uint32_t(ktiles * 512), bar);
    }
#else
#pragma unroll
    for (int r = 0; r < R; ++r) cp_async_pieces<W * 32>(pa + r * ktiles * 32, codes[r] - lane, ktiles * 32);
    cp_async_commit();
#endif
  } else {
    load(0, cwA, ptA);
    if (stages > 1) load(1, cwB, ptB);
  }
  grid_dep_wait();
  if (trigger) launch_dependents();
  if constexpr (XH) {
    for (int i = threadIdx.x; i < in / 4; i += W * 32) {
      const uint2 v = reinterpret_cast<const uint2*>(x)[i];
      const float f0 = __uint_as_float(v.x << 16) * kXhScale, f1 = __uint_as_float(v.x & 0xffff0000u) * kXhScale;
      const float f2 = __uint_as_float(v.y << 16) * kXhScale, f3 = __uint_as_float(v.y & 0xffff0000u) * kXhScale;
      uint2 h;
      asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(h.x) : "f"(f1), "f"(f0));
      asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(h.y) : "f"(f3), "f"(f2));
      xh[i] = h;
    }
  }
  if constexpr (SP || PA) cp_async_wait_all();
  if constexpr (XH || SP) __syncthreads();
  if constexpr (PA) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    mbar_wait(smem_addr(&pa_bar), 0);  // after the barrier above: every thread sees its init
#endif
    load(0, cwA, ptA);
    if (stages > 1) load(1, cwB, ptB);
  }

  // 1.0 in the A type: Σx for the biases through the same mma.
  const uint32_t one2 = XH ? 0x3C003C00u : 0x3F803F80u;
  const uint32_t ones[4] = {one2, one2, one2, one2};
  float cf[R][NT][4], cq[R][NT][4], cx[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      cx[nt][i] = 0.f;
#pragma unroll
      for (int r = 0; r < R; ++r) cf[r][nt][i] = cq[r][nt][i] = 0.f;
    }
  // cf += s·cq + b·cx for row block r; clears cq (the caller clears cx).
  auto flush = [&](int r, float4 p) { flush_group<FMT, XH, NT>(cf[r], cq[r], cx, p); };
  auto flush_raw = [&](int r, uint2 raw) { flush_entry<FMT, XH, NT>(cf[r], cq[r], cx, raw, zp[r]); };
  auto clear_cx = [&]() {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) cx[nt][i] = 0.f;
  };

  auto compute = [&](int s, const uint4 (&cw)[R][U], const uint2 (&pt)[R][U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = s * step + warp + W * u;
      if (k >= ktiles) break;
      uint2 lp[R];
      if constexpr (LP || SP) {
        const uint32_t gi = tpg_shift >= 0 ? uint32_t(k) >> tpg_shift : uint32_t(k) / tpg;
#pragma unroll
        for (int r = 0; r < R; ++r)
          lp[r] = !tile_group ? zero2
                  : SP        ? gparam_smem(sp_r(r), zp[r], int(gi) * 8 + g)
                              : ld_gparam(params[r], zp[r], pidx[r] + gi * 8);
      }
      // A tile inside the matrix (always, for tile groups) loads x and runs its mma steps without
      // a bounds test per step: the tests' branches also put a WARPSYNC before every mma.sync.
      const bool full = TGK || (k + 1) * KT <= in;
      // B columns n ≥ N (XH: n ≥ 1) are never stored: they read x row min(n, N − 1) (XH: the staged
      // row) instead of a predicated zero, one select fewer per load.
      uint2 xf[NT][MT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const bf16* xr = x + size_t(min(nt * 8 + g, N - 1)) * ldx;
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          const int k0 = k * KT + 16 * j + 4 * t;
          const bool ok = full || k0 < in;
          xf[nt][j] = !ok ? make_uint2(0, 0) : XH ? xh[unsigned(k0) / 4] : *reinterpret_cast<const uint2*>(xr + k0);
        }
      }
      auto mma_step = [&](int j) {
        const int k0 = k * KT + 16 * j;
        if constexpr (kBias)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_x<XH>(cx[nt], ones, xf[nt][j]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          uint32_t a[4];
          decode_x<FMT, XH>(cw[r][u], j, a);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_x<XH>(cq[r][nt], a, xf[nt][j]);
        }
        // Groups smaller than a tile (group % 16 == 0): flush at each group end and tile end.
        const bool group_end = TGK == 2 ? (j & 1) == 1 : (uint32_t(k0) + 16) % G32 == 0 || j == MT - 1;
        if (!per_row && !tile_group && group_end) {
          const uint32_t gi = TGK == 2 ? 2u * uint32_t(k) + uint32_t(j >> 1) : uint32_t(k0) / G32;
#pragma unroll
          for (int r = 0; r < R; ++r)
            flush_raw(r, SP ? gparam_smem(sp_r(r), zp[r], int(gi) * 8 + g) : ld_gparam(params[r], zp[r], pidx[r] + gi * 8));
          clear_cx();
        }
      };
      if (full) {
#pragma unroll
        for (int j = 0; j < MT; ++j) mma_step(j);
      } else {
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          if (k * KT + 16 * j >= in) break;
          mma_step(j);
        }
      }
      if (tile_group) {
#pragma unroll
        for (int r = 0; r < R; ++r) flush_raw(r, LP || SP ? lp[r] : pt[r][u]);
        clear_cx();
      }
    }
  };

  for (int s = 0; s < stages; s += 2) {
    compute(s, cwA, ptA);
    if (s + 2 < stages) load(s + 2, cwA, ptA);
    if (s + 1 >= stages) break;
    compute(s + 1, cwB, ptB);
    if (s + 3 < stages) load(s + 3, cwB, ptB);
  }
  if (per_row)
#pragma unroll
    for (int r = 0; r < R; ++r) flush(r, prow[r]);

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      red[warp][r * 16 + g][nt * 8 + 2 * t] = cf[r][nt][0];
      red[warp][r * 16 + g][nt * 8 + 2 * t + 1] = cf[r][nt][1];
      red[warp][r * 16 + g + 8][nt * 8 + 2 * t] = cf[r][nt][2];
      red[warp][r * 16 + g + 8][nt * 8 + 2 * t + 1] = cf[r][nt][3];
    }
  __syncthreads();
  if constexpr (ACT) {
    const QGemvPart& part = set.part[0];  // y: the activation [N, ldy]
    for (int i = threadIdx.x; i < 16 * NT * 8; i += W * 32) {
      const int row = i / (NT * 8), n = i % (NT * 8);
      const int64_t o = int64_t(blockIdx.x) * 16 + row;
      if (n < N && o < part.w.out) {
        float gs = 0.f, us = 0.f;
#pragma unroll
        for (int wi = 0; wi < W; ++wi) gs += red[wi][row][n], us += red[wi][16 + row][n];
        // As silu_mul of the bf16 outputs: silu(g) rounded to bf16, times u.
        static_cast<bf16*>(part.y)[size_t(n) * part.ldy + o] = __float2bfloat16_rn(rbf(silu(rbf(gs))) * rbf(us));
      }
    }
    return;
  }
  // The part looked up again: nothing of the first lookup stays live through the main loop (the
  // 64-register launch shapes would spill).
  const PartBlock pe = find_part<R>(set, cta_index_again());
  const QGemvPart& part = set.part[pe.part];
  for (int i = threadIdx.x; i < R * 16 * NT * 8; i += W * 32) {
    const int row = i / (NT * 8), n = i % (NT * 8);
    const int64_t o = int64_t(pe.rb0) * 16 + row;
    if (n < N && o < part.w.out) {
      float v = 0.f;
#pragma unroll
      for (int wi = 0; wi < W; ++wi) v += red[wi][row][n];
      store_y(part, n, o, v, y_f32);
    }
  }
}

// Batched decode (9 to 32 rows: verification, batches): the row-split kernel, where the sweeps
// found it faster than the kernel above (qgemv_batch_pr: 16384+ rows; split columns for the
// 4096-row down projection). At N = 32 the kernel above re-reads x (N·in·2 bytes) from L2 in
// every CTA of 16–32 rows — 2–4× the CTA's weight bytes — and decodes each A fragment through
// f32. Here a CTA of 8 warps owns RB row blocks (RB = 8, 4 or 2), each row block's tiles
// split over KS = 8 / RB warps, and x goes through shared memory once per CTA in chunks of
// KC = 4·KS tile widths (double-buffered), as f16·2⁻⁴ for FP8/Q8 (one cvt per e4m3 pair, as XH)
// and bf16 for Q4. A warp keeps 4 tiles per stage and two stages of codes in flight; the KS
// partial sums of a row block meet in shared memory at the end. Per-row formats flush once,
// tile-group formats (group % tile_k == 0) per group. in % KC == 0 (the launcher checks).
// Matrices of few rows (4096: o_proj, down) would get few CTAs, each staging all of x: there the
// columns are split over gridDim.y CTAs as well (8 row blocks each, x traffic ÷ 4 against 2 row
// blocks), which write f32 partial sums to a workspace [splits][N][rows of the set] that
// qsplit_reduce_kernel adds in split order (deterministic) into y.
constexpr int kBatchWarps = 8, kBatchTiles = 4, kBatchSplits = kQSplitWays;

template <int FMT, int NT, int RB, bool PR, bool ZP = false>
__global__ void __launch_bounds__(kBatchWarps * 32, 2) qgemv_batch_kernel(QGemvSet set, const bf16* __restrict__ x,
                                                                      int ldx, int N, int y_f32, int trigger,
                                                                      float* __restrict__ split_ws) {
  constexpr int KT = tile_k(FMT), MT = KT / 16, KS = kBatchWarps / RB, KC = kBatchTiles * KS * KT;
  constexpr int XS = KC + 16;  // x row stride in 16-bit values: +32 bytes keeps the 8 rows a warp reads on distinct banks
  constexpr bool XH = FMT != kQ4, kBias = FMT != kFP8 && FMT != kQ8S;
  extern __shared__ uint4 dyn_smem[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(dyn_smem);  // [2][NT·8][XS]; after the loop: red[KS][RB·16][NT·8]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r = warp % RB, ks = warp / RB;
  const PartBlock pb = find_part<RB>(set, blockIdx.x);
  const QWeight& w = set.part[pb.part].w;
  const int in = int(set.part[0].w.in), G = int(set.part[0].w.group), ktiles = in / KT, groups = in / G;
  const int rbs = int((w.out + 15) / 16), rb = pb.rb0 + r;
  const int rbc = min(rb, rbs - 1);  // a warp past the last row block re-reads it (not stored)
  const uint4* codes = static_cast<const uint4*>(w.codes) + size_t(rbc) * size_t(ktiles) * 32 + lane;
  const int64_t pidx = int64_t(rbc) * groups * 8 + g;  // grouped: entry pidx + 8·gi (f16, or ZP zero-packed)
  constexpr bool zp = ZP;
  static_assert(!ZP || (FMT == kQ4 && !PR), "qgemv batch ZP: grouped int4 only");
  constexpr bool per_row = PR;  // one scale per row (G == in): one flush at the end
  const int tpg = per_row ? 1 : G / KT;  // tiles per group (tile groups)
  // This CTA's chunks: [c0, c0 + chunks) of the split blockIdx.y (the launcher divides exactly).
  const int chunks = in / KC / int(gridDim.y), c0 = int(blockIdx.y) * chunks;
  const int k_end = (c0 + chunks) * kBatchTiles * KS;  // first tile past the split

  // Tile i of a warp in chunk c: k = c·4·KS + ks + KS·i.
  uint4 cA[kBatchTiles], cB[kBatchTiles];
  uint2 pA[kBatchTiles], pB[kBatchTiles];
  auto load = [&](int c, uint4 (&cw)[kBatchTiles], uint2 (&pt)[kBatchTiles]) {
#pragma unroll
    for (int i = 0; i < kBatchTiles; ++i) {
      const int k = c * kBatchTiles * KS + ks + KS * i;
      cw[i] = ld_stream(codes + size_t(k) * 32);
      pt[i] = per_row ? make_uint2(0, 0) : ld_gparam(w.params, zp, pidx + (k / tpg) * 8);
    }
  };
  // x columns [c·KC, (c+1)·KC) of the N rows into buffer b (rows ≥ N: zeros, never stored).
  auto stage_x = [&](int c, int b) {
    uint16_t* dst = xs + size_t(b) * NT * 8 * XS;
    for (int i = threadIdx.x; i < NT * 8 * (KC / 4); i += kBatchWarps * 32) {
      const int n = i / (KC / 4), q = i % (KC / 4);
      uint2 v = n < N ? *reinterpret_cast<const uint2*>(x + size_t(n) * ldx + size_t(c) * KC + 4 * q) : make_uint2(0, 0);
      if constexpr (XH) {
        const float f0 = __uint_as_float(v.x << 16) * kXhScale, f1 = __uint_as_float(v.x & 0xffff0000u) * kXhScale;
        const float f2 = __uint_as_float(v.y << 16) * kXhScale, f3 = __uint_as_float(v.y & 0xffff0000u) * kXhScale;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(v.x) : "f"(f1), "f"(f0));
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(v.y) : "f"(f3), "f"(f2));
      }
      *reinterpret_cast<uint2*>(dst + n * XS + 4 * q) = v;
    }
  };

  load(c0, cA, pA);  // weights never depend on earlier kernels: requested before the wait
  const float4 prow = per_row ? ld_row_param(w.params, rbc, g) : make_float4(0.f, 0.f, 0.f, 0.f);
  grid_dep_wait();
  if (trigger) launch_dependents();
  stage_x(c0, 0);

  const uint32_t one2 = XH ? 0x3C003C00u : 0x3F803F80u;
  const uint32_t ones[4] = {one2, one2, one2, one2};
  float cf[NT][4], cq[NT][4], cx[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) cf[nt][i] = cq[nt][i] = cx[nt][i] = 0.f;
  auto clear_cx = [&]() {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) cx[nt][i] = 0.f;
  };
  auto flush = [&](float4 p) {  // the group's scales; both sums restart
    flush_group<FMT, XH, NT>(cf, cq, cx, p);
    clear_cx();
  };
  auto compute = [&](int c, int b, const uint4 (&cw)[kBatchTiles], const uint2 (&pt)[kBatchTiles]) {
    const uint16_t* xb = xs + size_t(b) * NT * 8 * XS;
#pragma unroll
    for (int i = 0; i < kBatchTiles; ++i) {
      const int k = c * kBatchTiles * KS + ks + KS * i, kc = (ks + KS * i) * KT;  // tile, its column in the chunk
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        uint2 xf[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          xf[nt] = *reinterpret_cast<const uint2*>(xb + (nt * 8 + g) * XS + kc + 16 * j + 4 * t);
        if constexpr (kBias)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_x<XH>(cx[nt], ones, xf[nt]);
        uint32_t a[4];
        decode_x<FMT, XH>(cw[i], j, a);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_x<XH>(cq[nt], a, xf[nt]);
      }
      // Tile groups: flush when this warp's next tile (k + KS) lies in another group or split (a
      // group's tiles may be spread over warps and splits: each flushes its own part with the
      // group's scales, which is linear in the sums).
      if (!per_row && (k / tpg != (k + KS) / tpg || k + KS >= k_end)) {
        flush_entry<FMT, XH, NT>(cf, cq, cx, pt[i], zp);
        clear_cx();
      }
    }
  };

  // Chunk c: its codes were requested one chunk earlier, its x staged one chunk earlier (the
  // barrier makes the staging of every thread visible; the other buffer is free once every
  // warp is past it).
  for (int lc = 0; lc < chunks; lc += 2) {  // lc: chunk within the split, even in buffer 0
    const int c = c0 + lc;
    if (lc + 1 < chunks) load(c + 1, cB, pB);
    __syncthreads();
    compute(c, 0, cA, pA);
    if (lc + 1 >= chunks) break;
    stage_x(c + 1, 1);
    if (lc + 2 < chunks) load(c + 2, cA, pA);
    __syncthreads();
    compute(c + 1, 1, cB, pB);
    if (lc + 2 < chunks) stage_x(c + 2, 0);
  }
  if (per_row) flush(prow);

  // The KS warps of a row block: partial sums through shared memory (x buffers reused).
  __syncthreads();
  float* red = reinterpret_cast<float*>(dyn_smem);  // [KS][RB·16][NT·8]
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float* rr = red + (size_t(ks) * RB * 16 + r * 16) * NT * 8 + nt * 8 + 2 * t;
    rr[g * NT * 8] = cf[nt][0];
    rr[g * NT * 8 + 1] = cf[nt][1];
    rr[(g + 8) * NT * 8] = cf[nt][2];
    rr[(g + 8) * NT * 8 + 1] = cf[nt][3];
  }
  __syncthreads();
  // The part looked up again (nothing of the first lookup stays live through the main loop).
  const PartBlock pe = find_part<RB>(set, cta_index_again());
  const QGemvPart& part = set.part[pe.part];
  // Split: the workspace holds the set's rows one after another, this part's after the previous parts'.
  int64_t row0 = 0, rows = 0;
  for (int p = 0; p < set.count; ++p) rows += set.part[p].w.out, row0 += p < pe.part ? set.part[p].w.out : 0;
  for (int i = threadIdx.x; i < RB * 16 * NT * 8; i += kBatchWarps * 32) {
    const int row = i / (NT * 8), n = i % (NT * 8);
    const int64_t o = int64_t(pe.rb0) * 16 + row;
    if (n < N && o < part.w.out) {
      float v = 0.f;
#pragma unroll
      for (int si = 0; si < KS; ++si) v += red[(size_t(si) * RB * 16 + row) * NT * 8 + n];
      if (gridDim.y == 1)
        store_y(part, n, o, v, y_f32);
      else
        split_ws[(size_t(blockIdx.y) * N + n) * rows + row0 + o] = v;
    }
  }
}

// y = Σ over splits of the split kernel's partial sums, in split order.
__global__ void qsplit_reduce_kernel(QGemvSet set, const float* __restrict__ split_ws, int splits, int N, int y_f32) {
  grid_dep_wait();
  launch_dependents();
  int64_t rows = 0;
  for (int p = 0; p < set.count; ++p) rows += set.part[p].w.out;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * rows; i += int64_t(gridDim.x) * blockDim.x) {
    const int n = int(i / rows);
    int64_t o = i % rows;
    float v = 0.f;
    for (int s = 0; s < splits; ++s) v += split_ws[(size_t(s) * N + n) * rows + o];
    int p = 0;
    while (o >= set.part[p].w.out) o -= set.part[p++].w.out;
    store_y(set.part[p], n, o, v, y_f32);
  }
}

// The 4 values of row g + 8·r8, columns k0 + 4t .. + 3 (k0 = the mma step j's first column) of a
// lane's 16-byte piece c, as f32 (s, b: the row's scale and bias of that step's group).
template <int FMT>
__device__ __forceinline__ void decode_piece(const uint4& c, int j, int r8, float s, float b, float v[4]) {
  if constexpr (FMT == kQ4) {
    const uint32_t word = word_of(c, j);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) v[cc] = fmaf(s, float((word >> (4 * (r8 + 2 * (cc >> 1) + 4 * (cc & 1)))) & 0xfu), b);
  } else if constexpr (FMT == kQ8) {
    const uint32_t word = word_of(c, 2 * j + r8);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) v[cc] = fmaf(s, float((word >> (8 * cc)) & 0xffu), b);
  } else {
    const uint32_t word = word_of(c, 2 * j + r8);
    const float2 f01 = f16x2_to_float2(fp8_f16x2(word, 0)), f23 = f16x2_to_float2(fp8_f16x2(word, 1));
    v[0] = s * (f01.x * 256.f), v[1] = s * (f01.y * 256.f), v[2] = s * (f23.x * 256.f), v[3] = s * (f23.y * 256.f);
  }
}

// The values of one lane piece (row block rb, k tile kt, lane): f(r8, k, v) with v the 4 values of
// row 16·rb + g + 8·r8, columns k .. k + 3, for each mma step of the tile (a step's 16 columns
// share one group: group % 16 == 0, or one per row).
template <int FMT, typename F>
__device__ __forceinline__ void piece_values(const QWeight& w, int64_t rb, uint32_t kt, int lane, uint32_t ktiles,
                                             F&& f) {
  constexpr int KT = tile_k(FMT), MT = KT / 16;
  const int g = lane / 4, t = lane % 4;
  const uint32_t G = uint32_t(w.group), groups = uint32_t(w.in / w.group);
  const uint4 c = __ldg(static_cast<const uint4*>(w.codes) + (rb * ktiles + kt) * 32 + lane);
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    const uint32_t k = kt * KT + 16 * j + 4 * t;
    if (k >= w.in) break;
    const float4 p = param_at(w.params, G < w.in, w.zpack, rb, groups, (k - 4 * t) / G, g);
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      float v[4];
      decode_piece<FMT>(c, j, r8, r8 ? p.z : p.x, r8 ? p.w : p.y, v);
      f(r8, k, v);
    }
  }
}

// One thread per lane piece of the row blocks [rb0, rb0 + nrb) (for_each_lane_piece): rows
// [row0, row0 + rows) of W.
template <int FMT>
__global__ void qdequant_kernel(QWeight w, int64_t rb0, uint32_t nrb, int64_t row0, int64_t rows, bf16* dst) {
  const uint32_t ktiles = uint32_t((w.in + tile_k(FMT) - 1) / tile_k(FMT));
  for_each_lane_piece(FMT, w.in, rb0, nrb, [&](int64_t rb, uint32_t kt, int lane) {
    piece_values<FMT>(w, rb, kt, lane, ktiles, [&](int r8, uint32_t k, const float v[4]) {
      const int64_t row = rb * 16 + lane / 4 + 8 * r8;
      if (row >= w.out || row >= row0 + rows) return;
      uint2 out;
      out.x = pack_bf16x2(v[0], v[1]);
      out.y = pack_bf16x2(v[2], v[3]);
      *reinterpret_cast<uint2*>(dst + (row - row0) * w.in + k) = out;
    });
  });
}

// --int8-prefill for Q4 / grouped Q8 (w8a8_prefill.cu's activation rule applied to weight rows):
// each row's values are the bf16 the dequantization above writes; the row's scale is
// s = max|w| / 127 and its codes q = rint(w / s) clamped to ±127. s is a constant of the weight,
// found once at load (qrow_int8_scales_kernel), so the requantization of each prompt chunk is
// one pass over the codes with one thread per lane piece, as qdequant_kernel — the two-pass form
// (one CTA per row block, the max first) ran at ~1/3 of the bandwidth: int4 g64, 4K prompt,
// 25.4 ms of requantization (bench/results/2026-11-27-w8a8-prefill-passes.md).

// One CTA per row block: scale[row] = max |bf16(w)| / 127 over the row (1 for a zero row).
template <int FMT>
__global__ void __launch_bounds__(256) qrow_int8_scales_kernel(QWeight w, float* __restrict__ scale) {
  constexpr int KT = tile_k(FMT);
  const int64_t rb = blockIdx.x;
  const uint32_t ktiles = uint32_t((w.in + KT - 1) / KT);
  __shared__ unsigned rowmax[16];  // |w| bits: non-negative floats order as unsigned integers
  if (threadIdx.x < 16) rowmax[threadIdx.x] = 0;
  __syncthreads();
  // The thread's pieces are 256 apart, so its lane, and with it its rows g and g + 8, stay the same.
  const int g = int(threadIdx.x % 32) / 4;
  float m[2] = {0.f, 0.f};
  for (uint32_t i = threadIdx.x; i < ktiles * 32; i += blockDim.x)
    piece_values<FMT>(w, rb, i / 32, int(i % 32), ktiles, [&](int r8, uint32_t, const float v[4]) {
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) m[r8] = fmaxf(m[r8], fabsf(__bfloat162float(__float2bfloat16_rn(v[cc]))));
    });
#pragma unroll
  for (int r8 = 0; r8 < 2; ++r8)
    if (m[r8] > 0.f) atomicMax(&rowmax[g + 8 * r8], __float_as_uint(m[r8]));
  __syncthreads();
  const int64_t row = rb * 16 + threadIdx.x;
  if (threadIdx.x < 16 && row < w.out) {
    const float amax = __uint_as_float(rowmax[threadIdx.x]);
    scale[row] = amax > 0.f ? __fdiv_rn(amax, 127.f) : 1.f;
  }
}

// Where the requantized int8 word of row r (of the block) and columns k .. k + 3 (k % 4 == 0) goes:
// row-major [rows, in] for cuBLASLt, or the 8-bit tile layout (quant_layout.h) for w8a8_gemm.cu —
// row block r / 16, 32-column tile k / 32, lane 4·(r % 8) + (k % 16) / 4, word 2·((k % 32) / 16) + (r % 16) / 8.
// (A Q4 lane piece's 64 columns are the same lane's pieces of two 8-bit tiles.)
__device__ __forceinline__ int64_t int8_word_offset(int64_t r, int64_t k, int64_t in, bool tiles) {
  if (!tiles) return r * in + k;
  const int64_t lane = 4 * (r % 8) + (k % 16) / 4, word = 2 * ((k % 32) / 16) + (r % 16) / 8;
  return (((r / 16) * (in / 32) + k / 32) * 32 + lane) * 16 + 4 * word;
}

// int4 whose 64-column tiles each lie in one group: a row's values in a tile are one of 16
// (code 0..15 → bf16(s·code + b)), so the 4 lanes of a quad requantize 4 codes each for rows g and
// g + 8 — the same function of the same value as below — share them by shuffles, and look each
// output byte up with byte permutes: ~4 instead of ~17 instructions per weight.
__device__ __forceinline__ void qrequant_int4_table_piece(const QWeight& w, int64_t rb, uint32_t kt, int lane,
                                                          uint32_t ktiles, const float (&s)[2], const float (&r)[2],
                                                          int64_t row0, int64_t rows, int8_t* __restrict__ dst,
                                                          bool tiles) {
  const int g = lane / 4, t = lane % 4;
  const uint4 c = __ldg(static_cast<const uint4*>(w.codes) + (rb * ktiles + kt) * 32 + lane);
  const uint32_t G = uint32_t(w.group), k0 = kt * 64;
  const float4 p = param_at(w.params, G < w.in, w.zpack, rb, uint32_t(w.in / w.group), k0 / G, g);
  uint32_t table[2][4];  // row g + 8·r8: byte e of table[r8][m] is the int8 of code 4m + e
#pragma unroll
  for (int r8 = 0; r8 < 2; ++r8) {
    uint32_t part = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float v = __bfloat162float(__float2bfloat16_rn(fmaf(r8 ? p.z : p.x, float(4 * t + e), r8 ? p.w : p.y)));
      part |= uint32_t(max(-127, min(127, rint_div_recip(v, s[r8], r[r8]))) & 0xff) << (8 * e);
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) table[r8][m] = __shfl_sync(0xffffffffu, part, (lane & ~3) | m);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const int64_t row = rb * 16 + g + 8 * r8;
      if (row >= w.out || row >= row0 + rows) continue;
      // Codes of columns 4t + cc are nibbles r8, r8 + 4, r8 + 2, r8 + 6 of word j (decode_piece):
      // shifted down, the low nibbles of bytes 0, 2, 1, 3; as bytes in column order, then as
      // 3-bit permute selectors and a mask of the codes ≥ 8.
      const uint32_t x = __byte_perm((word_of(c, j) >> (4 * r8)) & 0x0f0f0f0fu, 0u, 0x3120);
      const uint32_t y = x & 0x07070707u, y2 = (y | (y >> 4)) & 0x00ff00ffu;
      const uint32_t sel = (y2 | (y2 >> 8)) & 0xffffu;
      const uint32_t hi_mask = ((x >> 3) & 0x01010101u) * 0xffu;
      const uint32_t lo = __byte_perm(table[r8][0], table[r8][1], sel), hi = __byte_perm(table[r8][2], table[r8][3], sel);
      *reinterpret_cast<uint32_t*>(dst + int8_word_offset(row - row0, k0 + 16 * j + 4 * t, w.in, tiles)) =
          (lo & ~hi_mask) | (hi & hi_mask);
    }
}

// One thread per lane piece of the row blocks [rb0, rb0 + nrb) (for_each_lane_piece): rows
// [row0, row0 + rows) of W as int8 at dst (row-major, or tiles: int8_word_offset), their scales
// (and offsets 0) for the epilogue.
template <int FMT>
__global__ void qrequant_int8_kernel(QWeight w, int64_t rb0, uint32_t nrb, int64_t row0, int64_t rows,
                                     const float* __restrict__ row_scales, int8_t* __restrict__ dst,
                                     float* __restrict__ scales, float* __restrict__ offsets, bool table, bool tiles) {
  const uint32_t ktiles = uint32_t((w.in + tile_k(FMT) - 1) / tile_k(FMT));
  for_each_lane_piece(FMT, w.in, rb0, nrb, [&](int64_t rb, uint32_t kt, int lane) {
    const int64_t r0 = rb * 16 + lane / 4, r1 = r0 + 8;
    const float s[2] = {r0 < w.out ? row_scales[r0] : 1.f, r1 < w.out ? row_scales[r1] : 1.f};
    const float rs[2] = {__frcp_rn(s[0]), __frcp_rn(s[1])};
    if constexpr (FMT == kQ4)
      if (table && w.group % 64 == 0)  // whole warps: every lane takes this branch
        return qrequant_int4_table_piece(w, rb, kt, lane, ktiles, s, rs, row0, rows, dst, tiles);
    piece_values<FMT>(w, rb, kt, lane, ktiles, [&](int r8, uint32_t k, const float v[4]) {
      const int64_t row = r8 ? r1 : r0;
      if (row >= w.out || row >= row0 + rows) return;
      uint32_t packed = 0;
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        const float b = __bfloat162float(__float2bfloat16_rn(v[cc]));
        packed |= uint32_t(max(-127, min(127, rint_div_recip(b, s[r8], rs[r8]))) & 0xff) << (8 * cc);
      }
      *reinterpret_cast<uint32_t*>(dst + int8_word_offset(row - row0, k, w.in, tiles)) = packed;
    });
  });
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    scales[r] = row_scales[row0 + r];
    offsets[r] = 0.f;
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

__global__ void qrandom_params_kernel(QWeight w, void* params, float scale, float bias, uint64_t seed) {
  const int64_t groups = w.in / w.group, n = (w.out + 15) / 16 * groups * 8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int g = int(i % 8);
    const int64_t gi = (i / 8) % groups, rb = i / 8 / groups;
    float p[4];
    uint32_t packed = 0;  // zero-packed entry
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const int64_t row = rb * 16 + g + 8 * r8;
      const uint64_t at = uint64_t(row * groups + gi);
      const float f = 0.75f + 0.5f * uniform01(seed ^ 0x5ca1eull, at);
      p[2 * r8] = row < w.out ? scale * f : 0.f;
      p[2 * r8 + 1] = row < w.out ? bias * f : 0.f;
      if (w.fmt == kQ4 && w.group < w.in) {
        // As `sala quantize` writes int4 with zero points (its bias −s·z exact in f16): the scale
        // rounded up to 7 significant bits, z 7 or 8 (codes centred like the bias above).
        const float s7 = __uint_as_float((__float_as_uint(p[2 * r8]) + 0x1ffffu) & ~0x1ffffu);
        const uint32_t z = 7u + uint32_t(splitmix64(seed ^ 0x2e40ull ^ at) & 1u);
        p[2 * r8] = s7, p[2 * r8 + 1] = -s7 * float(z);
        packed |= (uint32_t(__half_as_ushort(__float2half_rn(s7))) | (row < w.out ? z : 0u)) << (16 * r8);
      }
    }
    if (w.zpack) {
      static_cast<uint32_t*>(params)[i] = packed;
    } else if (w.group < w.in) {  // f16 tiles (quant_layout.h)
      const __half2 a = __floats2half2_rn(p[0], p[1]), b = __floats2half2_rn(p[2], p[3]);
      static_cast<uint2*>(params)[i] =
          make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
    } else {
      static_cast<float4*>(params)[i] = make_float4(p[0], p[1], p[2], p[3]);
    }
  }
}


// One launch's arguments; the launch shape is picked by the templates below.
struct QArgs {
  QGemvSet set;
  int64_t rows;  // of all parts: the automatic launch shape treats the set as one matrix
  const void* x;
  int64_t ldx;
  Dt dty;
  int N;
  bool pdl;
  cudaStream_t st;
  float* split_ws = nullptr;  // batched products of few rows: the column split's partial sums
  size_t split_ws_floats = 0;
};

// Shared memory per CTA (static and dynamic) without an opt-in attribute.
constexpr size_t kDefaultSmemLimit = 48 << 10;
// PA: the largest code block a CTA copies whole before its dependency wait (two CTAs per SM).
constexpr size_t kPrefetchMaxBytes = 64 << 10;
// SP: the most group parameters a CTA stages (f16: two row blocks of in = 16384 in groups of 32
// take 64 KB), with the reduction's static shared memory within the SM's 227 KB.
constexpr size_t kSpMaxBytes = 128 << 10;

// The XH path (x staged as f16 in shared memory): one row of x, in · 2 bytes within 48 KB.
bool xh_fits(const QArgs& a) { return a.N == 1 && a.set.part[0].w.in <= 24576; }

// Group parameters of the N ≤ 8 decode GEMV in shared memory (SP), unless SALA_CUDA_QGEMV_SP=0
// (A/B runs against the late loads, LP).
bool params_in_smem() {
  static const bool on = [] {
    const char* e = std::getenv("SALA_CUDA_QGEMV_SP");
    return !(e && std::atoi(e) == 0);
  }();
  return on;
}

template <int FMT, int NT, int R, int U, int W, int MINB = 1, bool PR = false, bool LP = false, int TG = 0,
          bool XH = false, bool SP = false, bool ACT = false, bool PA = false>
void qgemv_cfg(const QArgs& a) {
  if constexpr (FMT == kQ8 && PR) {  // symmetric int8: the decode without Σx (kQ8S)
    if (symmetric_q8(a.set)) return qgemv_cfg<kQ8S, NT, R, U, W, MINB, PR, LP, TG, XH, SP, ACT, PA>(a);
  }
  const size_t param_smem = SP ? size_t(R) * size_t(a.set.part[0].w.in / a.set.part[0].w.group) * 64 : 0;
  const size_t ktiles = size_t((a.set.part[0].w.in + tile_k(FMT) - 1) / tile_k(FMT));
  const size_t pa_bytes = PA ? size_t(R) * ktiles * 512 : 0;
  const size_t smem = param_smem + (XH ? size_t(xh_pieces(a.set.part[0].w.in)) * 16 : 0) + pa_bytes;
  if constexpr (PA) {  // beyond 48 KB; as many CTAs per SM as the shape asks (the largest carveout)
    static const bool attr =
        cudaFuncSetAttribute(qgemv_kernel<FMT, NT, R, U, W, MINB, PR, LP, TG, XH, SP, ACT, PA>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(kPrefetchMaxBytes + 48 * 1024)) ==
            cudaSuccess &&
        cudaFuncSetAttribute(qgemv_kernel<FMT, NT, R, U, W, MINB, PR, LP, TG, XH, SP, ACT, PA>,
                             cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) == cudaSuccess;
    SALA_CUDA_REQUIRE(attr, "qgemv prefetch: shared memory attributes refused");
  }
  if constexpr (SP) {
    // Parameters beyond kSpMaxBytes (R · in / group > 2048 groups): late loads instead. Past
    // 48 KB with the reduction's static shared memory (group 32 at in = 16384, or N > 16), the
    // opt-in attribute — only there: a larger shared-memory carveout leaves less L1 for x.
    if (smem > kSpMaxBytes) return qgemv_cfg<FMT, NT, R, U, W, MINB, PR, true, TG, XH, false, ACT>(a);
    auto* kernel = qgemv_kernel<FMT, NT, R, U, W, MINB, PR, LP, TG, XH, SP, ACT, PA>;
    static const size_t static_smem = [kernel] {  // the reduction's red[] and PA's barrier
      cudaFuncAttributes fa{};
      SALA_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
      return fa.sharedSizeBytes;
    }();
    if (smem + static_smem > kDefaultSmemLimit) {
      static const bool attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    int(kSpMaxBytes)) == cudaSuccess;
      SALA_CUDA_REQUIRE(attr, "qgemv group parameters in shared memory: attribute refused");
    }
  }
  QGemvSet set = a.set;
  unsigned blocks = 0;  // each part's CTAs after the previous part's
  for (int i = 0; i < set.count; ++i) {
    set.first[i] = blocks;
    blocks += unsigned(((set.part[i].w.out + 15) / 16 + R - 1) / R);
  }
  set.first[set.count] = blocks;
  if constexpr (ACT) blocks = unsigned((set.part[0].w.out + 15) / 16);  // one CTA per gate/up row block pair
  launch_pdl(a.pdl, qgemv_kernel<FMT, NT, R, U, W, MINB, PR, LP, TG, XH, SP, ACT, PA>, dim3(blocks), dim3(W * 32), smem, a.st, set,
             static_cast<const bf16*>(a.x), int(a.ldx), a.N, int(a.dty == kF32), int(g_trigger && a.pdl));
}

// Grouped weights whose groups hold whole tiles (int4 in groups of 64 or more, int8 in groups of 32
// or more: MLX 8-bit) or halves of one (int4 group 32), at N ≤ 8 with the parameters in shared
// memory: the shapes of the int4 sweeps; grouped int8 stages x as f16 at N = 1 (XH) as the per-row
// formats do. H100, 4K batch 1, 9B shape, int8 g64 with lm_head: 4.61 ms/step with the generic
// grouped shapes below, 4.31–4.34 with these, 4.23–4.28 with XH as well
// (bench/results/2026-11-26-h100-int4-groups.md).
template <int FMT, int TG>
constexpr bool kTileGroupShapes = (FMT == kQ4 && TG != 0) || (FMT == kQ8 && TG == 1);
template <int FMT, int TG, bool ACT = false, bool XH = false>
void qgemv_tile_groups(const QArgs& a) {
  if constexpr (FMT == kQ8 && !XH) {
    if (xh_fits(a)) return qgemv_tile_groups<FMT, TG, ACT, true>(a);
  }
  if constexpr (ACT) {  // the shape the unfused pair takes (2 × 16384 rows): the same sums
    qgemv_cfg<FMT, 1, 2, 2, 4, 4, false, false, TG, XH, true, true>(a);
  } else {
    if (a.rows <= 8192) return qgemv_cfg<FMT, 1, 1, 2, 16, 2, false, false, TG, XH, true>(a);
    // Two row blocks per CTA up to 32768 rows: 16384×4096 15.7 → 14.3 µs (lm_head: one).
    if (a.rows <= 32768) return qgemv_cfg<FMT, 1, 2, 2, 4, 4, false, false, TG, XH, true>(a);
    qgemv_cfg<FMT, 1, 1, 2, 4, 8, false, false, TG, XH, true>(a);
  }
}

// N ≤ 8: one n-tile, one row block per CTA; the launch shape by format and size.
template <int FMT, bool PR, int TG>
void qgemv_small(const QArgs& a, int warps) {
  switch (g_small_variant) {  // benchmarks: launch shapes (tiles per stage U, warps W, min CTAs per SM)
    case 1: return qgemv_cfg<FMT, 1, 1, 4, 4, 1, PR, false, TG>(a);
    case 2: return qgemv_cfg<FMT, 1, 1, 2, 4, 8, PR, false, TG>(a);
    case 3: return qgemv_cfg<FMT, 1, 1, 4, 4, 8, PR, false, TG>(a);
    case 4: return qgemv_cfg<FMT, 1, 1, 2, 8, 4, PR, false, TG>(a);
    case 5: return qgemv_cfg<FMT, 1, 1, 4, 8, 1, PR, false, TG>(a);
    case 6: return qgemv_cfg<FMT, 1, 1, 2, 16, 2, PR, false, TG>(a);
    case 7: return qgemv_cfg<FMT, 1, 1, 1, 8, 6, PR, false, TG>(a);
    case 8: return qgemv_cfg<FMT, 1, 1, 2, 16, 1, PR, false, TG>(a);
    case 9: return qgemv_cfg<FMT, 1, 1, 2, 4, 8, PR, true, TG>(a);
    case 10: return qgemv_cfg<FMT, 1, 1, 2, 16, 2, PR, true, TG>(a);
    case 11: return qgemv_cfg<FMT, 1, 1, 4, 8, 1, PR, true, TG>(a);
    case 12: return qgemv_cfg<FMT, 1, 1, 2, 8, 4, PR, true, TG>(a);
    case 13: return qgemv_cfg<FMT, 1, 1, 4, 4, 8, PR, true, TG>(a);
    // 9, 10, 5 with the parameters in shared memory (SP; per-row formats have none: as 2, 6, 5).
    case 14: return qgemv_cfg<FMT, 1, 1, 2, 4, 8, PR, false, TG, false, !PR>(a);
    case 15: return qgemv_cfg<FMT, 1, 1, 2, 16, 2, PR, false, TG, false, !PR>(a);
    case 16: return qgemv_cfg<FMT, 1, 1, 4, 8, 1, PR, false, TG, false, !PR>(a);
    // Two row blocks per CTA (the x fragments and the Σx mma shared by both; SP for grouped formats).
    case 17: return qgemv_cfg<FMT, 1, 2, 1, 8, 4, PR, false, TG, false, !PR>(a);
    case 18: return qgemv_cfg<FMT, 1, 2, 1, 16, 2, PR, false, TG, false, !PR>(a);
    case 19: return qgemv_cfg<FMT, 1, 2, 2, 4, 4, PR, false, TG, false, !PR>(a);
    case 20: return qgemv_cfg<FMT, 1, 2, 1, 4, 8, PR, false, TG, false, !PR>(a);
    case 21:  // 17 with x as f16 (XH) for per-row FP8/Q8 at N = 1 (otherwise as 17)
      if constexpr (PR && FMT != kQ4) {
        if (xh_fits(a)) return qgemv_cfg<FMT, 1, 2, 1, 8, 4, PR, false, TG, true>(a);
      }
      return qgemv_cfg<FMT, 1, 2, 1, 8, 4, PR, false, TG, false, !PR>(a);
    default: break;
  }
  switch (warps) {  // fixed warp counts (tests, benchmarks)
    case 16: return qgemv_cfg<FMT, 1, 1, 4, 16, 1, PR, false, TG>(a);
    case 8: return qgemv_cfg<FMT, 1, 1, 4, 8, 1, PR, false, TG>(a);
    case 4: return qgemv_cfg<FMT, 1, 1, 4, 4, 1, PR, false, TG>(a);
    default: break;
  }
  // Automatic, from the launch-shape sweeps (H200, 2026-11-25, bench/results/2026-11-25-h200-qgemv-sweep.md).
  // Per-row FP8/Q8 fit 64 registers with 2 tiles per stage (no spills): 8 CTAs of 4 warps per SM
  // put a 1024-row-block matrix in one wave (fp8 16384×4096: 34.6 → 25.3 µs; at N = 1 4 tiles per
  // stage still fit, 22.2 µs), few row blocks take 16 warps per CTA (fp8 4096×16384: 33.0 →
  // 23.1 µs). Grouped formats (Q4, MLX Q8) spill at 64 registers: 8 warps of 4 tiles per stage.
  // The lm_head (73448 rows): 4 warps of 4 tiles.
  if constexpr (PR && (FMT == kFP8 || FMT == kQ8)) {
    // Above 8192 rows, two row blocks per CTA (sweep of b305d9c+1: fp8 16384×4096 19.2 → 18.5 µs
    // at N = 1, 23.7 → 19.0 at N = 8; int8 24.3 → 20.5; int8 lm_head 88.9 → 81.8).
    if (a.rows > 8192 && (a.rows <= 32768 || FMT == kQ8 || a.N > 1)) {
      if (xh_fits(a)) return qgemv_cfg<FMT, 1, 2, 1, 8, 4, PR, false, TG, true>(a);
      return qgemv_cfg<FMT, 1, 2, 1, 8, 4, PR, false, TG>(a);
    }
    // N = 1: x as f16 in shared memory (≤ 48 KB), the lean f16 decode (XH).
    if (xh_fits(a)) {
      if (a.rows <= 8192) {
        if constexpr (FMT == kFP8) {
          if (g_prefetch && size_t(a.set.part[0].w.in) * 16 <= kPrefetchMaxBytes)
            return qgemv_cfg<FMT, 1, 1, 2, 16, 2, PR, false, TG, true, false, false, true>(a);
        }
        return qgemv_cfg<FMT, 1, 1, 2, 16, 2, PR, false, TG, true>(a);
      }
      if (a.rows <= 32768) {
        if constexpr (FMT == kFP8) return qgemv_cfg<FMT, 1, 1, 4, 4, 8, PR, false, TG, true>(a);
        return qgemv_cfg<FMT, 1, 1, 2, 4, 8, PR, false, TG, true>(a);
      }
      return qgemv_cfg<FMT, 1, 1, 4, 4, 1, PR, false, TG, true>(a);
    }
    // Q8 took v8 (one CTA per SM) until the grouped launch: v8 then measured 11.5 / 36.2 µs
    // (4096² / 4096×16384) against v6's 8.3 / 24.7 (sweep of commit e29901f, H200).
    if (a.rows <= 8192) return qgemv_cfg<FMT, 1, 1, 2, 16, 2, PR, false, TG>(a);
    if (a.rows <= 32768) {
      if (FMT == kFP8 && a.N == 1) return qgemv_cfg<FMT, 1, 1, 4, 4, 8, PR, false, TG>(a);
      return qgemv_cfg<FMT, 1, 1, 2, 4, 8, PR, false, TG>(a);
    }
    return qgemv_cfg<FMT, 1, 1, 4, 4, 1, PR, false, TG>(a);
  }
  // Grouped formats: the group parameters in shared memory (SP) unless SALA_CUDA_QGEMV_SP=0.
  if constexpr (!PR) {
    if (params_in_smem()) {
      if constexpr (kTileGroupShapes<FMT, TG>) return qgemv_tile_groups<FMT, TG>(a);
      if (a.rows > 16384) return qgemv_cfg<FMT, 1, 1, 4, 4, 1, PR, false, TG, false, true>(a);
      return qgemv_cfg<FMT, 1, 1, 4, 8, 1, PR, false, TG, false, true>(a);
    }
  }
  // Q4 in tile groups (group 64 or 128): late group parameters fit 64 registers (16 bytes of
  // spills), third sweep: 16384×4096 22.3 → 19.8 µs, 4096×16384 22.1 → 18.8, lm_head 91.4 → 72.4.
  if constexpr (FMT == kQ4 && (TG == 1 || TG == 3)) {
    if (a.rows <= 8192) return qgemv_cfg<FMT, 1, 1, 2, 16, 2, PR, true, TG>(a);
    return qgemv_cfg<FMT, 1, 1, 2, 4, 8, PR, true, TG>(a);
  }
  if (a.rows > 16384) return qgemv_cfg<FMT, 1, 1, 4, 4, 1, PR, false, TG>(a);
  return qgemv_cfg<FMT, 1, 1, 4, 8, 1, PR, false, TG>(a);
}

// ACT (gate/up + silu·mul, N ≤ 8): the two-row-block shapes the automatic choice takes for the
// unfused pair above 8192 rows (the 9B MLP's 2 × 16384), so that the sums are the same.
template <int FMT, bool PR, int TG>
void qgemv_act_f(const QArgs& a) {
  if constexpr (PR && FMT != kQ4) {
    if (xh_fits(a)) return qgemv_cfg<FMT, 1, 2, 1, 8, 4, PR, false, TG, true, false, true>(a);
    return qgemv_cfg<FMT, 1, 2, 1, 8, 4, PR, false, TG, false, false, true>(a);
  } else if constexpr (!PR && kTileGroupShapes<FMT, TG>) {
    if (params_in_smem()) return qgemv_tile_groups<FMT, TG, true>(a);
  }
  return qgemv_cfg<FMT, 1, 2, 1, 8, 4, PR, false, TG, false, !PR, true>(a);
}

// The set's parameter form: 1 every part zero-packed, 0 none, −1 mixed (not from one quantizer;
// the kernels then read each part's form at run time: TG 0).
int set_zpack(const QGemvSet& set) {
  int n = 0;
  for (int i = 0; i < set.count; ++i) n += set.part[i].w.zpack != 0;
  return n == 0 ? 0 : n == set.count ? 1 : -1;
}

// Calls f(PR, TG) with the set's grouping as compile-time constants: per row (PR), or how its
// groups lie in tiles (tile_groups; int4's two groups per tile only for Q4; TG 3 for int4 tile
// groups with zero-packed parameters).
template <int FMT, class F>
void with_grouping(const QGemvSet& set, F&& f) {
  using PR = std::true_type;
  using Grouped = std::false_type;
  const QWeight& w = set.part[0].w;
  if (w.group == w.in) return f(PR{}, std::integral_constant<int, 0>{});
  const int tg = tile_groups(FMT, w.group), zp = set_zpack(set);
  if (zp < 0) return f(Grouped{}, std::integral_constant<int, 0>{});
  if constexpr (FMT == kQ4) {
    if (tg == 1 && zp) return f(Grouped{}, std::integral_constant<int, 3>{});
  }
  if (tg == 1) return f(Grouped{}, std::integral_constant<int, 1>{});
  if constexpr (FMT == kQ4) {
    if (tg == 2) return f(Grouped{}, std::integral_constant<int, 2>{});
  }
  f(Grouped{}, std::integral_constant<int, 0>{});
}

template <int FMT>
void qgemv_act(const QArgs& a) {
  with_grouping<FMT>(a.set, [&](auto pr, auto tg) { qgemv_act_f<FMT, pr(), tg()>(a); });
}

// The row-split batched kernel (qgemv_batch_kernel) for 9–32 rows: per-row formats or tile groups,
// in a multiple of its chunk. Row blocks per CTA: about two CTAs per SM for the launch's rows.
template <int FMT, int NT, int RB, bool PR, bool ZP>
void qgemv_batch_cfg(const QArgs& a, int splits = 1) {
  if constexpr (FMT == kQ8 && PR) {  // symmetric int8 (as qgemv_cfg)
    if (symmetric_q8(a.set)) return qgemv_batch_cfg<kQ8S, NT, RB, PR, ZP>(a, splits);
  }
  constexpr int KS = kBatchWarps / RB, KC = kBatchTiles * KS * tile_k(FMT);
  const size_t smem = std::max(size_t(2) * NT * 8 * (KC + 16) * 2, size_t(KS) * RB * 16 * NT * 8 * 4);
  static const bool attr = [smem] {  // once per instantiation: shared memory beyond 48 KB
    return cudaFuncSetAttribute(qgemv_batch_kernel<FMT, NT, RB, PR, ZP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(smem)) == cudaSuccess;
  }();
  SALA_CUDA_REQUIRE(attr, "qgemv batch: shared memory attribute refused");
  QGemvSet set = a.set;
  unsigned blocks = 0;
  for (int i = 0; i < set.count; ++i) {
    set.first[i] = blocks;
    blocks += unsigned(((set.part[i].w.out + 15) / 16 + RB - 1) / RB);
  }
  set.first[set.count] = blocks;
  launch_pdl(a.pdl, qgemv_batch_kernel<FMT, NT, RB, PR, ZP>, dim3(blocks, unsigned(splits)), dim3(kBatchWarps * 32), smem,
             a.st, set, static_cast<const bf16*>(a.x), int(a.ldx), a.N, int(a.dty == kF32), int(g_trigger && a.pdl),
             a.split_ws);
  if (splits > 1)
    launch_pdl(a.pdl, qsplit_reduce_kernel, dim3(grid_for(a.N * a.rows, 256, 132 * 4)), dim3(256), 0, a.st, set,
               static_cast<const float*>(a.split_ws), splits, a.N, int(a.dty == kF32));
}

template <int FMT, int NT, bool PR, bool ZP = false>
bool qgemv_batch_pr(const QArgs& a) {
  const QWeight& w = a.set.part[0].w;
  const int64_t rbs = (a.rows + 15) / 16;
  const bool fit8 = w.in % (kBatchTiles * 1 * tile_k(FMT)) == 0, fit4 = w.in % (kBatchTiles * 2 * tile_k(FMT)) == 0,
             fit2 = w.in % (kBatchTiles * 4 * tile_k(FMT)) == 0;
  // The column split: 8 row blocks per CTA, kBatchSplits CTAs per row group (a workspace given,
  // the chunks divide evenly).
  const bool split_fits = a.split_ws && fit8 && (w.in / (kBatchTiles * tile_k(FMT))) % kBatchSplits == 0 &&
                          size_t(kBatchSplits) * size_t(a.N) * size_t(a.rows) <= a.split_ws_floats;
  // Benchmarks: 4, 5, 6 force 2, 4, 8 row blocks per CTA, 7 the column split.
  if (g_nt_variant >= 4) {
    const int rb = g_nt_variant == 4 ? 2 : g_nt_variant == 5 ? 4 : 8;
    if (g_nt_variant == 7) return split_fits && (qgemv_batch_cfg<FMT, NT, 8, PR, ZP>(a, kBatchSplits), true);
    if (rb == 8 && fit8) return qgemv_batch_cfg<FMT, NT, 8, PR, ZP>(a), true;
    if (rb == 4 && fit4) return qgemv_batch_cfg<FMT, NT, 4, PR, ZP>(a), true;
    if (rb == 2 && fit2) return qgemv_batch_cfg<FMT, NT, 2, PR, ZP>(a), true;
    return false;
  }
  // Automatic, from the qgemv-batch sweep (H200, bench/results/2026-11-25-h200-qgemv-batch.md):
  // ~2 CTAs per SM — 8 row blocks per CTA from 2048 row blocks, 4 from 1024 (fp8 16384×4096 at
  // N = 32: 72.2 → 40.6 µs, 32768×4096 141 → 66 µs); fewer rows (4096: o_proj, down) stay on the
  // GEMV above, which is faster there, as is int4 at 17–32 rows below 2048 row blocks.
  if (rbs >= 2048 && fit8) return qgemv_batch_cfg<FMT, NT, 8, PR, ZP>(a), true;
  if (rbs >= 1024 && fit4 && (FMT != kQ4 || NT == 2)) return qgemv_batch_cfg<FMT, NT, 4, PR, ZP>(a), true;
  // Fewer rows, the column split where the sweep of 06665e4 (same file) found it faster: 4096×16384
  // (down) at 9–32 rows for 8-bit, 9–16 for int4 (fp8 at 32 rows 67.6 → 45.6 µs), 4096×4096 at
  // 9–16 rows for 8-bit; at 17–32 rows the 4096×4096 products are faster on the GEMV above.
  const bool split_wins = FMT == kQ4 ? NT == 2 && w.in >= 16384 : NT == 2 || w.in >= 16384;
  if (rbs < 1024 && split_fits && split_wins) return qgemv_batch_cfg<FMT, NT, 8, PR, ZP>(a, kBatchSplits), true;
  if (g_nt_variant == 3 && fit2) return qgemv_batch_cfg<FMT, NT, 2, PR, ZP>(a), true;  // forced: any rows
  return false;
}
template <int FMT, int NT>
bool qgemv_batch(const QArgs& a) {
  const QWeight& w = a.set.part[0].w;
  if (w.group == w.in) return qgemv_batch_pr<FMT, NT, true>(a);
  if (w.group % tile_k(FMT) != 0) return false;
  const int zp = set_zpack(a.set);
  if (zp < 0) return false;  // mixed parameter forms: the GEMV below reads each part's
  if constexpr (FMT == kQ4) {
    if (zp) return qgemv_batch_pr<FMT, NT, false, true>(a);
  }
  return qgemv_batch_pr<FMT, NT, false>(a);
}

template <int FMT>
void qgemv_f(const QArgs& a, int warps) {
  if (a.N <= 8) {
    // format, in and group: the same for every part
    return with_grouping<FMT>(a.set, [&](auto pr, auto tg) { qgemv_small<FMT, pr(), tg()>(a, warps); });
  }
  // N > 8: one decode of each A fragment feeds 2 or 4 n-tiles. Two row blocks per CTA share the
  // x fragments (x bytes per code byte: 2·N / (16·R) for Q4's 4 mmas per 16-byte piece).
  // Automatic: the row-split kernel where it applies (g_nt_variant 1/2 force the one above).
  if (g_nt_variant == 0 || g_nt_variant >= 3) {
    if (a.N <= 16 ? qgemv_batch<FMT, 2>(a) : qgemv_batch<FMT, 4>(a)) return;
    SALA_CUDA_REQUIRE(g_nt_variant == 0, "qgemv: the batched kernel does not take this shape");
  }
  // Two row blocks per CTA wherever this GEMV is the automatic choice: in the sweeps of 161d351 and
  // 06665e4 (bench/results/2026-11-25-h200-qgemv-batch.md) one row block per CTA lost at every
  // shape left to it — 4096×4096 at N = 32: fp8 20.1 → 19.0 µs, int8 34.3 → 17.3, int4 22.9 →
  // 16.5; int4 4096×16384 at N = 32 74.1 → 54.4 and 4096×4096 at N = 16 16.1 → 10.9.
  const bool two = g_nt_variant == 2 || g_nt_variant == 0;
  // Grouped int4 and int8 (MLX): the group parameters in shared memory (SP) rather than a stage
  // ahead in registers. H100, 4K, 9B shape with lm_head int4 g64: batch 32 9.13–9.29 instead of
  // 10.44–10.49 ms of device time per step, batch 16 5.66–5.76 instead of 5.93–6.02
  // (bench/results/2026-11-26-h100-int4-groups.md).
  if constexpr (FMT == kQ4 || FMT == kQ8) {
    const QWeight& w = a.set.part[0].w;
    const int tg = tile_groups(FMT, w.group);
    if (two && w.group != w.in && params_in_smem()) {
      if constexpr (FMT == kQ4) {
        if (tg == 2) {  // group 32: two groups per tile
          if (a.N <= 16) return qgemv_cfg<FMT, 2, 2, 2, 8, 1, false, false, 2, false, true>(a);
          return qgemv_cfg<FMT, 4, 2, 1, 8, 1, false, false, 2, false, true>(a);
        }
      }
      const int zp = set_zpack(a.set);
      if constexpr (FMT == kQ4) {
        if (tg == 1 && zp > 0) {
          if (a.N <= 16) return qgemv_cfg<FMT, 2, 2, 2, 8, 1, false, false, 3, false, true>(a);
          return qgemv_cfg<FMT, 4, 2, 1, 8, 1, false, false, 3, false, true>(a);
        }
      }
      if (tg == 1 && zp == 0) {
        if (a.N <= 16) return qgemv_cfg<FMT, 2, 2, 2, 8, 1, false, false, 1, false, true>(a);
        return qgemv_cfg<FMT, 4, 2, 1, 8, 1, false, false, 1, false, true>(a);
      }
    }
  }
  if (a.N <= 16) {
    if (two) return qgemv_cfg<FMT, 2, 2, 2, 8>(a);
    return qgemv_cfg<FMT, 2, 1, 4, 8>(a);
  }
  if (two) return qgemv_cfg<FMT, 4, 2, 1, 8>(a);
  return qgemv_cfg<FMT, 4, 1, 2, 8>(a);
}

bool al8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7) == 0; }

}  // namespace

void set_qgemv_tuning(int nt_variant, bool trigger) {
  g_nt_variant = nt_variant;
  g_trigger = trigger;
}

void set_qgemv_small_variant(int v) { g_small_variant = v; }

void set_qgemv_prefetch(bool on) { g_prefetch = on; }

void launch_qgemv_set(const QGemvSet& set, const void* x, int64_t ldx, Dt dty, int N, int warps, bool pdl,
                      cudaStream_t st, float* split_ws, size_t split_ws_floats) {
  SALA_CUDA_REQUIRE(set.count >= 1 && set.count <= kGemvMaxParts, "qgemv: 1 to 4 parts");
  const QWeight& w = set.part[0].w;
  int64_t rows = 0;
  for (int i = 0; i < set.count; ++i) {
    const QGemvPart& p = set.part[i];
    SALA_CUDA_REQUIRE(p.w.fmt == w.fmt && p.w.in == w.in && p.w.group == w.group,
                      "qgemv: the parts of a grouped launch must share format, input size and group size");
    SALA_CUDA_REQUIRE(p.ldy < (int64_t(1) << 31), "qgemv: dimensions too large");
    rows += p.w.out;
  }
  if (N <= 0 || rows <= 0) return;
  SALA_CUDA_REQUIRE(N <= 32, "qgemv: at most 32 rows");
  SALA_CUDA_REQUIRE(dty == kBF16 || dty == kF32, "qgemv: y must be bf16 or f32");
  SALA_CUDA_REQUIRE(al8(x) && ldx % 4 == 0 && w.in % 4 == 0, "qgemv: x rows must be 8-byte aligned");
  SALA_CUDA_REQUIRE(w.group == w.in || w.group % 16 == 0, "qgemv: group size must be a multiple of 16");
  SALA_CUDA_REQUIRE(w.in < (int64_t(1) << 30) && ldx < (int64_t(1) << 31), "qgemv: dimensions too large");
  if (warps != 4 && warps != 8 && warps != 16) warps = 0;  // automatic launch shape (qgemv_f)
  // One row: the bulk-copy ring GEMV (quant_gemv_ring.cu) where it applies, unless a shape is forced.
  if (warps == 0 && g_small_variant == 0 && g_nt_variant == 0 && qgemv_ring_applies(set, N)) {
    launch_qgemv_ring(set, x, dty == kF32, g_trigger, pdl, st);
    SALA_CUDA_LAUNCH("qgemv ring kernel");
    return;
  }
  const QArgs a{set, rows, x, ldx, dty, N, pdl, st, split_ws, split_ws_floats};
  switch (w.fmt) {
    case kFP8: qgemv_f<kFP8>(a, warps); break;
    case kQ8: qgemv_f<kQ8>(a, warps); break;
    case kQ4: qgemv_f<kQ4>(a, warps); break;
    default: SALA_CUDA_REQUIRE(false, "qgemv: unknown packed format");
  }
  SALA_CUDA_LAUNCH("qgemv kernel");
}

void launch_qgemv(const QWeight& w, const void* x, int64_t ldx, void* y, Dt dty, int64_t ldy, int N, int warps,
                  bool pdl, cudaStream_t st, float* split_ws, size_t split_ws_floats) {
  QGemvSet set{};
  set.part[0] = {w, y, ldy};
  set.count = 1;
  launch_qgemv_set(set, x, ldx, dty, N, warps, pdl, st, split_ws, split_ws_floats);
}

void launch_qgemv_act(const QWeight& gate, const QWeight& up, const void* x, int64_t ldx, void* act, int64_t ldact,
                      int N, bool pdl, cudaStream_t st) {
  SALA_CUDA_REQUIRE(gate.fmt == up.fmt && gate.in == up.in && gate.group == up.group && gate.out == up.out,
                    "qgemv act: gate and up must share format, shape and group size");
  SALA_CUDA_REQUIRE(N >= 1 && N <= 8, "qgemv act: 1 to 8 rows");
  SALA_CUDA_REQUIRE(al8(x) && ldx % 4 == 0 && gate.in % 4 == 0, "qgemv act: x rows must be 8-byte aligned");
  SALA_CUDA_REQUIRE(gate.group == gate.in || gate.group % 16 == 0, "qgemv act: group size must be a multiple of 16");
  SALA_CUDA_REQUIRE(gate.in < (int64_t(1) << 30) && ldx < (int64_t(1) << 31) && ldact < (int64_t(1) << 31),
                    "qgemv act: dimensions too large");
  QGemvSet set{};
  set.part[0] = {gate, act, ldact};
  set.part[1] = {up, nullptr, 0};
  set.count = 2;
  if (g_small_variant == 0 && qgemv_ring_applies(set, N)) {  // as launch_qgemv_set: the same sums
    launch_qgemv_ring_act(set, x, g_trigger, pdl, st);
    SALA_CUDA_LAUNCH("qgemv ring act kernel");
    return;
  }
  const QArgs a{set, gate.out + up.out, x, ldx, kBF16, N, pdl, st};
  switch (gate.fmt) {
    case kFP8: qgemv_act<kFP8>(a); break;
    case kQ8: qgemv_act<kQ8>(a); break;
    case kQ4: qgemv_act<kQ4>(a); break;
    default: SALA_CUDA_REQUIRE(false, "qgemv act: unknown packed format");
  }
  SALA_CUDA_LAUNCH("qgemv act kernel");
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

void launch_qrow_int8_scales(const QWeight& w, float* scales, cudaStream_t st) {
  SALA_CUDA_REQUIRE(w.fmt == kQ4 || w.fmt == kQ8, "qrow_int8_scales: Q4 or Q8 weights only");
  const int64_t nrb = (w.out + 15) / 16;
  SALA_CUDA_REQUIRE(nrb < (int64_t(1) << 31), "qrow_int8_scales: too many rows");
  if (w.fmt == kQ4) qrow_int8_scales_kernel<kQ4><<<unsigned(nrb), 256, 0, st>>>(w, scales);
  else qrow_int8_scales_kernel<kQ8><<<unsigned(nrb), 256, 0, st>>>(w, scales);
  SALA_CUDA_LAUNCH("qrow_int8_scales kernel");
}

void launch_qrequant_int8(const QWeight& w, const float* row_scales, int64_t row0, int64_t rows, void* codes,
                          float* scales, float* offsets, bool tiles, cudaStream_t st) {
  if (rows <= 0) return;
  SALA_CUDA_REQUIRE(w.fmt == kQ4 || w.fmt == kQ8, "qrequant_int8: Q4 or Q8 weights only");
  SALA_CUDA_REQUIRE(row_scales != nullptr, "qrequant_int8: the weight has no row scales (launch_qrow_int8_scales)");
  SALA_CUDA_REQUIRE(row0 % 16 == 0 && w.in % 4 == 0, "qrequant_int8: first row must start a row block");
  SALA_CUDA_REQUIRE(!tiles || w.in % 32 == 0, "qrequant_int8: the tile layout takes multiples of 32 columns");
  const int64_t rb0 = row0 / 16, nrb = (rows + 15) / 16;
  const int64_t n = nrb * ((w.in + tile_k(w.fmt) - 1) / tile_k(w.fmt)) * 32;
  SALA_CUDA_REQUIRE(n < (int64_t(1) << 31), "qrequant_int8: too many rows per call");
  const unsigned blocks = grid_for(n, 256, 132 * 16);
  auto* d = static_cast<int8_t*>(codes);
  // SALA_CUDA_QREQUANT_TABLE=0: int4 value by value, as grouped int8 (A/B runs; the same bits).
  static const bool table = [] {
    const char* e = std::getenv("SALA_CUDA_QREQUANT_TABLE");
    return !(e && std::string(e) == "0");
  }();
  if (w.fmt == kQ4)
    qrequant_int8_kernel<kQ4><<<blocks, 256, 0, st>>>(w, rb0, uint32_t(nrb), row0, rows, row_scales, d, scales, offsets,
                                                      table, tiles);
  else
    qrequant_int8_kernel<kQ8><<<blocks, 256, 0, st>>>(w, rb0, uint32_t(nrb), row0, rows, row_scales, d, scales, offsets,
                                                      table, tiles);
  SALA_CUDA_LAUNCH("qrequant_int8 kernel");
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

void launch_qrandom(const QWeight& w, void* codes, void* params, float scale, float bias, uint64_t seed,
                    cudaStream_t st) {
  const TileGeom geo{w.fmt, w.out, w.in, w.group, bool(w.zpack)};
  const int64_t words = geo.code_bytes() / 4, np = geo.row_blocks() * geo.groups() * 8;
  qrandom_codes_kernel<<<grid_for(words, 256, 132 * 16), 256, 0, st>>>(static_cast<uint32_t*>(codes), words,
                                                                       w.fmt == kFP8, seed);
  SALA_CUDA_LAUNCH("qrandom codes kernel");
  qrandom_params_kernel<<<grid_for(np, 256, 132 * 16), 256, 0, st>>>(w, params, scale, bias, seed);
  SALA_CUDA_LAUNCH("qrandom params kernel");
}

}  // namespace sala::cuda
