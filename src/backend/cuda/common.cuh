// Device helpers shared by the kernels: dtype loads/stores with the reference's bf16 rounding,
// 16-byte vector access, warp reductions, and the mma.sync / ldmatrix / cp.async wrappers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace sala::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ldf(const void* p, int dt, int64_t i) {
  if (dt == kBF16) return __bfloat162float(static_cast<const bf16*>(p)[i]);
  if (dt == kF32) return static_cast<const float*>(p)[i];
  return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ void stf(void* p, int dt, int64_t i, float v) {
  if (dt == kBF16)
    static_cast<bf16*>(p)[i] = __float2bfloat16_rn(v);
  else if (dt == kF32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<__half*>(p)[i] = __float2half_rn(v);
}

// Rounds v to the storage precision of dtype dt (the reference's rounding points, spec §2.6);
// identity for f32 outputs.
__device__ __forceinline__ float rnd(int dt, float v) {
  if (dt == kBF16) return __bfloat162float(__float2bfloat16_rn(v));
  if (dt == kF16) return __half2float(__float2half_rn(v));
  return v;
}
__device__ __forceinline__ float rbf(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
// silu(a) = a·sigmoid(a), as every kernel computes it (silu_mul, the packed gate/up epilogue): one
// expression, so the fused and unfused paths give the same bits.
__device__ __forceinline__ float silu(float a) { return a / (1.0f + expf(-a)); }

// 8 bf16 in a uint4 <-> 8 floats.
__device__ __forceinline__ void unpack8(const uint4& u, float f[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ uint4 pack8(const float f[8]) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return u;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// ---- tensor-core and async-copy primitives (sm_80+) ----
// Builds for older targets (e.g. a default CMAKE_CUDA_ARCHITECTURES of 75) still compile; the
// backend refuses devices below sm_80 at construction, and these trap if ever reached there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define SALA_PRE_SM80 1
#endif
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#ifdef SALA_PRE_SM80
  __trap();
#else
  // Not volatile: a pure function of its operands, so the compiler may hoist loads above it.
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The same with f16 operands (x staged as f16: the packed GEMVs' XH paths).
__device__ __forceinline__ void mma16816_f16(float c[4], const uint32_t a[4], uint2 b) {
#ifdef SALA_PRE_SM80
  __trap();
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
#endif
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, uint32_t addr) {
#ifdef SALA_PRE_SM80
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
#endif
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t& r0, uint32_t& r1, uint32_t addr) {
#ifdef SALA_PRE_SM80
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
#endif
}
__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
#ifdef SALA_PRE_SM80
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
#endif
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
#ifdef SALA_PRE_SM80
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
#endif
}

// Weights are read once per token: they bypass L1 and are the first to leave L2, so that what the
// next kernels and tokens reuse (activations, norm weights, states, K/V) stays. The batch-1 bf16
// GEMV (gemv_kernel), H100, 4K: 6.65–6.66 → 6.59–6.62 ms per step against __ldg; at batch 8
// (gemv_mma_kernel) and in the packed GEMV's code loads it was neutral to slower, so they keep
// theirs (bench/results/2026-11-27-h100-evict-first.md). Non-volatile asm: the policy is made
// once per kernel (a common subexpression) and the loads are scheduled like __ldg.
#ifdef SALA_PRE_SM80
__device__ __forceinline__ uint4 ld_weight(const uint4* p) { return __ldg(p); }
#else
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint4 ld_weight(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(l2_evict_first()));
  return v;
}
#endif

// rint(v / s) with IEEE division (the CPU reference's rounding), exact zeros answered without
// dividing: the same result (±0 → 0), but a zero dividend takes the division's slow path, and the
// rows of int4 with integer zero points are 1/16 zeros (code = z). H100, int4 g64 + lm_head
// --int8-prefill at 4K: 29960 → 32212 tok/s (bench/results/2026-11-27-ring-pacing.md).
__device__ __forceinline__ int rint_div(float v, float s) { return v == 0.f ? 0 : __float2int_rn(__fdiv_rn(v, s)); }

// rint_div(v, s) for |v| ≤ 127·s, from the product v·r with r = __frcp_rn(s): the quantizers'
// division is most of their instructions (Nsight Compute: the SM pipes ~70% busy, DRAM 10–57%).
// The product lies within 2.3e-5 of the exact quotient v/s (three roundings of ≤ 2^-24 relative,
// |v/s| ≤ 127), and so does the rounded quotient; both round to the same integer unless the
// product is within that distance of a half-integer (a tie of the quotient included). There —
// about 1 value in 16000 — and for a product that is not finite (a subnormal s), the division
// decides. The same integers as rint_div, whose bits the CPU reference computes.
__device__ __forceinline__ int rint_div_recip(float v, float s, float r) {
  const float y = v * r, n = rintf(y);
  if (fabsf(y - n) < 0.5f - 3.1e-5f && fabsf(y) <= 128.f) return int(n);
  return rint_div(v, s);
}

// 16-byte global -> shared copy; src_bytes = 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
#ifdef SALA_PRE_SM80
  __trap();
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifndef SALA_PRE_SM80
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#ifndef SALA_PRE_SM80
  asm volatile("cp.async.wait_group 0;\n" ::);
#endif
}
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifndef SALA_PRE_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
// Programmatic dependent launch (sm_90): wait until the preceding kernel's memory is visible.
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Lets the next kernel in the stream (launched with programmatic serialization) start now: its
// CTAs can become resident and run their pre-wait part (weight loads) while this grid works;
// its griddepcontrol.wait still waits for this whole grid to complete and flush. Safe at any point
// of a kernel, since every kernel writes only after its own grid_dep_wait.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// The current device's SM count, asked once (launch sizing on the host).
inline int sm_count() {
  static const int n = [] {
    int dev = 0, count = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;  // an H100's
    return count;
  }();
  return n;
}

// Whether the small decode kernels (norms, elementwise, GLA recurrent) are launched with
// programmatic dependent launch (set by the backend with its PDL knob; one stream, host thread).
inline bool g_small_pdl = false;

// Launches kernel<<<grid, block, smem, st>>>(args...), with programmatic stream serialization
// when pdl: the kernel may start while the previous one drains, so it must call grid_dep_wait()
// before touching anything an earlier kernel writes or reads.
template <typename... KArgs, typename... Args>
void launch_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                Args... args) {
  if (!pdl) {
    kernel<<<grid, block, smem, st>>>(args...);
    return;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  SALA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

// Warp-wide integer sum (redux.sync on sm_80+).
__device__ __forceinline__ int warp_sum_int(int v) {
#ifdef SALA_PRE_SM80
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
#else
  return __reduce_add_sync(0xffffffffu, v);
#endif
}

// Number of 16-byte chunks in a row of D bf16 values, and the XOR swizzle mask that spreads the
// 8 rows of an ldmatrix over distinct bank groups (rows of ≥ 128 bytes; narrower rows conflict
// a little, which only the tiny test geometries see).
template <int D>
struct RowSwizzle {
  static constexpr int kChunks = D / 8;
  static constexpr int kMask = (kChunks < 8 ? kChunks : 8) - 1;
  __device__ __forceinline__ static int chunk(int row, int c) { return c ^ (row & kMask); }
  // Byte offset of chunk c of row `row` in a tile of rows × D bf16.
  __device__ __forceinline__ static uint32_t offset(int row, int c) {
    return uint32_t(row * D * 2 + chunk(row, c) * 16);
  }
};

__host__ __device__ inline int64_t n_chunks(int64_t T, int64_t window, int64_t stride) {
  return T < window ? 0 : (T - window) / stride + 1;
}

inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 16) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return unsigned(b);
}

}  // namespace sala::cuda
