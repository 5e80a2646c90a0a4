// Device helpers of the packed-weight kernels (quant_gemv.cu, quant_gemv_ring.cu, quant_gemm.cu): the loads of the
// tile layout (quant_layout.h), the exact conversions of its codes, and the mbarriers and bulk
// copies that bring whole code blocks into shared memory.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/quant_layout.h"

namespace sala::cuda {

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ float2 f16x2_to_float2(uint32_t h) {
  return make_float2(__half2float(__ushort_as_half(uint16_t(h & 0xffffu))), __half2float(__ushort_as_half(uint16_t(h >> 16))));
}

// (w & 0x000F000F) | bits in one lop3: C++ spelling of it compiled to two (a lop3 encodes one
// immediate, and ptxas kept both constants immediate), which with the shifts made the Q4 decode
// three instructions per pair instead of two (Nsight Compute: ~150 instructions per tile).
// nibbles_or(w >> 4p, 0x43004300) is q4_bf16x2(w, p): bf16 128 + q of a Q4 A-fragment register.
__device__ __forceinline__ uint32_t nibbles_or(uint32_t w, uint32_t bits) {
  uint32_t r;
  asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xea;\n" : "=r"(r) : "r"(w), "r"(bits));  // (a & b) | c
  return r;
}

// Weights are read once: 16-byte loads that bypass L1 (x, which every row block re-reads, stays).
// volatile keeps the loads issued before griddepcontrol.wait where the code puts them.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// mbarriers and bulk copies into shared memory (the qgemm pipelines, the GEMV's whole-block
// prefetch); shared addresses as from smem_addr. The try_wait and the bulk copy are sm_90.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Orders this thread's generic-proxy shared-memory writes (an mbarrier's init, cp.async data)
// before the async proxy's accesses (bulk copies, wgmma).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Waits for the completion of the barrier's phase of this parity.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred P1;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#else
  __trap();
#endif
}
// A contiguous bulk copy (16-byte multiples) into shared memory, completing bytes on the barrier.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#else
  __trap();
#endif
}

// Parameter tiles (quant_layout.h): {s(row g), b(row g), s(row g + 8), b(row g + 8)} at
// (rb·groups + gi)·8 + g — a float4 for per-row weights, four f16 (a uint2) for grouped ones.
__device__ __forceinline__ float4 ld_param(const float4* p) {
  float4 v;
  asm volatile("ld.global.nc.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_gparam(const uint2* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
// A per-row weight's f32 parameters of (row block rb, lane group g).
__device__ __forceinline__ float4 ld_row_param(const void* params, int64_t rb, int g) {
  return ld_param(static_cast<const float4*>(params) + rb * 8 + g);
}
// A grouped weight's four f16 parameters as f32 (exact).
__device__ __forceinline__ float4 gparam_f32(uint2 h) {
  const float2 a = f16x2_to_float2(h.x), b = f16x2_to_float2(h.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
// A zero-packed entry {s|z (row g), s|z (row g + 8)} (QWeight::zpack) as {s, −s·z, s, −s·z}: the
// values of the 8-byte form exactly (s has 7 significant bits, z 4).
__device__ __forceinline__ float4 zparam_f32(uint32_t e) {
  const float2 s = f16x2_to_float2(e & 0xFFF0FFF0u);
  return make_float4(s.x, -s.x * float(e & 15u), s.y, -s.y * float((e >> 16) & 15u));
}
// A zero-packed entry with a decode offset folded into its biases: {s, −s·(2^L0 + z), s,
// −s·(2^L1 + z)} for rows g and g + 8 (2^L + z built from z's bits: exact, 7 × ≤ 11 significant
// bits; the same values as fma(−2^L, s, −s·z) from the 8-byte form). The GEMVs decode int4 codes
// as 2^L + q (quant_gemv.cu: 128 + q; the ring: 1024 + q and 64 + q, in its units).
template <int L0, int L1>
__device__ __forceinline__ float4 zparam_folded(uint32_t e) {
  static_assert(L0 >= 4 && L0 <= 23 && L1 >= 4 && L1 <= 23, "zparam_folded: 2^L above z's 4 bits");
  const float2 s = f16x2_to_float2(e & 0xFFF0FFF0u);
  const float o0 = __uint_as_float((uint32_t(127 + L0) << 23) | ((e & 15u) << (23 - L0)));
  const float o1 = __uint_as_float((uint32_t(127 + L1) << 23) | (((e >> 16) & 15u) << (23 - L1)));
  return make_float4(s.x, -s.x * o0, s.y, -s.y * o1);
}
// A grouped entry as loaded: the 8-byte form, or (zp) the zero-packed word in x.
__device__ __forceinline__ float4 gparam_f32(uint2 raw, bool zp) { return zp ? zparam_f32(raw.x) : gparam_f32(raw); }
__device__ __forceinline__ uint32_t ld_nc_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}
// Entry i ((rb·groups + gi)·8 + g) of a grouped weight's parameter tiles, whichever the form.
__device__ __forceinline__ uint2 ld_gparam(const void* params, bool zp, int64_t i) {
  return zp ? make_uint2(ld_nc_u32(static_cast<const uint32_t*>(params) + i), 0u)
            : ld_gparam(static_cast<const uint2*>(params) + i);
}
// The same from parameter tiles staged in shared memory.
__device__ __forceinline__ uint2 gparam_smem(const void* params, bool zp, int i) {
  return zp ? make_uint2(static_cast<const uint32_t*>(params)[i], 0u) : static_cast<const uint2*>(params)[i];
}
// f(rb, kt, lane) once for every 16-byte lane piece of row blocks [rb0, rb0 + nrb) of a tiled
// weight (tiles of tile_k(fmt) columns), one thread each, grid-stride: the row-block passes
// (dequantize, requantize, copy to row-major). Whole warps run the same iterations (a warp's 32
// pieces are one tile's), so f may shuffle. 32-bit piece index (≤ 2^31 pieces: the launchers check).
template <typename F>
__device__ __forceinline__ void for_each_lane_piece(int fmt, int64_t in, int64_t rb0, uint32_t nrb, F&& f) {
  const uint32_t ktiles = uint32_t((in + qlayout::tile_k(fmt) - 1) / qlayout::tile_k(fmt)), total = nrb * ktiles * 32;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x)
    f(rb0 + (i / 32) / ktiles, (i / 32) % ktiles, int(i % 32));
}
// The parameters of (row block rb, group gi, lane group g), whichever the layout.
__device__ __forceinline__ float4 param_at(const void* params, bool grouped, bool zp, int64_t rb, int64_t groups,
                                           int64_t gi, int g) {
  return grouped ? gparam_f32(ld_gparam(params, zp, (rb * groups + gi) * 8 + g), zp)
                 : ld_row_param(params, rb, g);  // per row: groups = 1, gi = 0
}

// Decode mode of symmetric int8 (QWeight::sym: every bias −128·scale) in the per-row GEMVs (≤ 8
// rows and the batched 9–32-row kernel): the codes q + 128 decode to q (f16 1024 + c minus 1152
// with x staged, f32 2²³ + c minus 2²³ + 128 otherwise: exact) and y = s·Σ q·x, so the Σx mma and
// the bias terms go. Not a storage format: the weight is qlayout::kQ8.
constexpr int kQ8S = 4;

// XH (x as f16 in shared memory, N = 1): the A fragment as f16 pairs, one or two instructions per
// pair instead of four (FP8: the hardware e4m3x2 → f16x2 conversion, exact; Q8: the bytes under an
// f16 exponent, 1024 + q, minus 1024: exact). Q4 keeps the bf16 path (one lop3 per pair already)
// in quant_gemv.cu; the ring GEMV decodes Q4 in f16 itself (quant_gemv_ring.cu).
template <int FMT>
__device__ __forceinline__ void decode_a_f16(const uint4& c, int j, uint32_t a[4]) {
  static_assert(FMT != qlayout::kQ4, "decode_a_f16: FP8 and Q8 only");
  const uint32_t wg = word_of(c, 2 * j), wg8 = word_of(c, 2 * j + 1);
  if constexpr (FMT == qlayout::kQ8 || FMT == kQ8S) {
    auto q8x2 = [](uint32_t word, uint32_t sel) {
      constexpr uint32_t kOffset = FMT == kQ8S ? 0x64806480u : 0x64006400u;  // 1152 (c − 128) or 1024 (c)
      uint32_t h = __byte_perm(word, 0x64646464u, sel), r;
      asm("sub.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(h), "r"(kOffset));
      return r;
    };
    a[0] = q8x2(wg, 0x4140u), a[1] = q8x2(wg8, 0x4140u), a[2] = q8x2(wg, 0x4342u), a[3] = q8x2(wg8, 0x4342u);
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    auto f8x2 = [](uint32_t word, int h) {
      uint32_t r;
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(uint16_t(word >> (16 * h))));
      return r;
    };
#else
    auto f8x2 = [](uint32_t word, int h) { return qlayout::fp8_f16x2(word, h); };  // e4m3·2^-8 (quant_gemv.cu kFp8Unit)
#endif
    a[0] = f8x2(wg, 0), a[1] = f8x2(wg8, 0), a[2] = f8x2(wg, 1), a[3] = f8x2(wg8, 1);
  }
}

// FP8: e4m3 bytes 2h, 2h+1 of a word as their exact values (sm_89+: one conversion of the pair).
__device__ __forceinline__ float2 fp8x2_float2(uint32_t word, int h) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t f16x2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(f16x2) : "h"(uint16_t(word >> (16 * h))));
  return f16x2_to_float2(f16x2);
#else
  const float2 f = f16x2_to_float2(qlayout::fp8_f16x2(word, h));  // e4m3·2^-8 (quant_layout.h)
  return make_float2(f.x * 256.f, f.y * 256.f);
#endif
}

}  // namespace sala::cuda
