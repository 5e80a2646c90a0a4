// --int8-prefill's GEMM: y = (x quantized per row to int8) · (W as int8)ᵀ, scaled in the epilogue —
// what cuBLASLt's int8 GEMM and the int32 epilogue pass compute (w8a8_prefill.cu), bit for bit,
// without their traffic: cuBLASLt writes int32 products (its int8 GEMM has no float output:
// bench/results/2026-11-27-cublaslt-int8-probe.md) that the epilogue reads back, 4 + 4 bytes per
// output (~15.5 ms of a 4K prompt on an H100), and wants the weights row-major, copied out of the
// tile layout first (~6.7 ms). W: a per-row Q8 weight's own tiles (code − 128), or int4 / grouped
// int8 rows that launch_qrequant_int8 requantized into the same tile layout (signed codes).
//
// Why it can read the tile layout directly: a lane's 16-byte piece of an 8-bit tile (quant_layout.h:
// rows g and g+8, columns 4t..4t+3 and 16+4t..16+4t+3 of a 32-column tile) is exactly its A
// fragment of an int8 k32 mma. So the weight is wgmma's A operand from registers, one ld.shared.v4
// per lane and k32 step, top bits flipped (code − 128); x is the B operand from shared memory.
//
// Kernel (sm_90a): a CTA owns 128 weight rows × 256 tokens. Warp 8 (of a third warpgroup, whose
// registers go to the others) is the producer: per 128-k stage it issues one TMA copy of x (256
// tokens × 128 bytes, 128-byte swizzle, rows past N zero) and one bulk copy per row block of its
// four 512-byte tiles, all completing the stage's "full" mbarrier. Warps 0–7 (two warpgroups) each
// own a 16-row block: per stage four wgmma.m64n256k32.s32.s8.s8 with int32 accumulators; the
// "empty" mbarrier hands a stage's buffers back. The epilogue applies y = fma(c_w, s_x·Σq_x,
// (acc·s_w)·s_x) in f32 with the epilogue pass's operations and rounding, so the values are the
// same bits.
//
// Speed of light: the int8 tensor cores, 2·N·out·in operations (cuBLASLt's int8 GEMM reaches
// 1.1–1.4 POP/s on the 9B shapes at N = 4096, H100). Measured (H100, 4K prompt; bench/results/
// 2026-11-27-w8a8-gemm.md): 16384-row products at ~1.2 POP/s, ~88% of cuBLASLt's GEMM alone, once
// bf16 outputs went out through shared memory as whole rows (2-byte stores spread over four tokens
// per instruction: ~1.0 POP/s). Without the round trips: int8 + lm_head prefill 1.43–1.45× bf16,
// int4 1.28× (through cuBLASLt 1.23–1.26× and 1.22–1.23×). Not kept: x shared by two-CTA clusters
// (TMA multicast; slower: 0.96–0.99×).
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/hopper.cuh"
#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/w8a8_gemm.h"
#include "backend/quant_layout.h"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SALA_W8A8_WGMMA 1
#endif

namespace sala::cuda {

namespace {

using namespace qlayout;

constexpr int kRows = 128;                                // weight rows per CTA: 8 consumer warps × 16
constexpr int kTokens = 256;                              // tokens per CTA (wgmma n)
constexpr int kK = 128;                                   // k per stage: one 128-byte swizzle row of x
constexpr int kStages = 4;                                // stages in shared memory
constexpr int kThreads = 384;                             // two consumer warpgroups + the producer's
constexpr int kXBytes = kTokens * kK;                     // 32 KiB
constexpr int kRbBytes = (kK / 32) * kTileBytes;          // one row block's 4 tiles of a stage: 2 KiB
constexpr int kStageBytes = kXBytes + kRows / 16 * kRbBytes;  // + 16 KiB of codes
constexpr int kSmemBytes = kStages * kStageBytes + 1024 + 16 * kStages;  // + alignment, 2 barriers a stage
static_assert(kSmemBytes <= 227 * 1024, "the stages must fit an SM's shared memory");

int g_mode = -1;  // SALA_CUDA_W8A8_GEMM (1 default, 0 off); -1: not read yet
bool gemm_on() {
  if (g_mode < 0) {
    const char* e = std::getenv("SALA_CUDA_W8A8_GEMM");
    g_mode = e && *e ? (std::atoi(e) != 0) : 1;
  }
  return g_mode != 0;
}

#ifdef SALA_W8A8_WGMMA
#define SALA_IACC8(i) "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3]), "+r"(d[i + 4]), "+r"(d[i + 5]), \
                      "+r"(d[i + 6]), "+r"(d[i + 7])
#define SALA_IACC32(i) SALA_IACC8(i), SALA_IACC8(i + 8), SALA_IACC8(i + 16), SALA_IACC8(i + 24)
// d += A·B, A (64 × 32 int8) from registers, B (32 × 256 int8, K-major, 128-byte swizzle) from
// shared memory: int32 accumulators, exact.
__device__ __forceinline__ void wgmma_s8(int32_t (&d)[128], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
      "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, "
      "%85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, "
      "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, "
      "%122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p;\n}\n"
      : SALA_IACC32(0), SALA_IACC32(32), SALA_IACC32(64), SALA_IACC32(96)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
#undef SALA_IACC32
#undef SALA_IACC8

__device__ __forceinline__ void keep(int32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
#endif

// codes: the 8-bit tile layout; q8_params: a per-row Q8 weight's {s, b} float4 tiles, or null and
// scales: requantized rows' (W8A8Weight).
__global__ void __launch_bounds__(kThreads, 1)
    w8a8_gemm_kernel(const uint8_t* __restrict__ codes, const float4* __restrict__ q8_params,
                     const float* __restrict__ scales, int64_t out, int64_t in,
                     const __grid_constant__ CUtensorMap xmap, const float* __restrict__ sx,
                     const float* __restrict__ sxsum, void* __restrict__ y, int ydt, int64_t ldy, int N,
                     bool staged) {
#ifdef SALA_W8A8_WGMMA
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sbase = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t full = sbase + uint32_t(kStages * kStageBytes), empty = full + 8 * kStages;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int n0 = int(blockIdx.x) * kTokens;
  const int64_t rb0 = int64_t(blockIdx.y) * (kRows / 16), row_blocks = (out + 15) / 16;
  const int stages = int(in / kK);
  const int64_t ktiles = in / 32;
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(full + 8 * i, 1), mbar_init(empty + 8 * i, 8);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the async proxy (TMA)
  }
  __syncthreads();

  // Registers: 12 warps take at most 168 each (three to an SM quadrant's 16384); the consumers' 128
  // accumulators and 16 fragment registers want more, so the producer warpgroup gives its own up.
  if (warp >= 8) {  // ---- producer: warp 8's lane 0 copies x by TMA, the live row blocks' codes by bulk copies ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp != 8 || lane != 0) return;
    const int live = int(std::min<int64_t>(kRows / 16, row_blocks - rb0));
    const uint32_t bytes = uint32_t(kXBytes + live * kRbBytes);
    for (int s = 0; s < stages; ++s) {
      const uint32_t b = uint32_t(s % kStages), stage = sbase + b * uint32_t(kStageBytes);
      if (s >= kStages) mbar_wait(empty + 8 * b, uint32_t(s / kStages - 1) & 1u);  // consumers done with it
      mbar_arrive_expect_tx(full + 8 * b, bytes);
      tma_load_2d(stage, &xmap, s * kK, n0, full + 8 * b);
      for (int r = 0; r < live; ++r)
        bulk_load(stage + uint32_t(kXBytes + r * kRbBytes), codes + ((rb0 + r) * ktiles + int64_t(s) * (kK / 32)) * kTileBytes,
                  kRbBytes, full + 8 * b);
    }
    return;
  }

  // ---- consumers: warp w multiplies row block rb0 + w (rows past the matrix: stale codes, no stores) ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int64_t rb = rb0 + warp;
  const uint32_t flip = q8_params ? 0x80808080u : 0u;  // Q8 codes − 128 as int8; requantized codes are signed
  int32_t acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0;
#pragma unroll
  for (int i = 0; i < 128; ++i) keep(acc[i]);
  // Each warp waits for its own wgmmas before the next stage's A fragments are written: written
  // while wgmmas are in flight, ptxas serializes them (C7513); the other warpgroup's wgmmas keep the
  // tensor cores busy meanwhile.
  for (int s = 0; s < stages; ++s) {
    const uint32_t b = uint32_t(s % kStages), stage = sbase + b * uint32_t(kStageBytes);
    mbar_wait(full + 8 * b, uint32_t(s / kStages) & 1u);
    const uint32_t slot = stage + uint32_t(kXBytes + warp * kRbBytes + 16 * lane);
    uint32_t a[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint4 c = ld_shared_v4(slot + uint32_t(kk * kTileBytes));
      a[kk][0] = c.x ^ flip, a[kk][1] = c.y ^ flip, a[kk][2] = c.z ^ flip, a[kk][3] = c.w ^ flip;
    }
    const uint64_t desc = sw128_desc(stage);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_s8(acc, a[kk], desc + uint64_t(2 * kk));  // +32 B per k32
    wgmma_commit();
    wgmma_wait<0>();
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * b);  // this warp is done with the stage's buffers
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) keep(acc[i]);

  // Epilogue: accumulator 4j + i is row g + 8·(i >> 1), token 8j + 2t + (i & 1); the operations of
  // int8_epilogue_kernel (w8a8_prefill.cu) in its order.
  const int g = lane >> 2, t = lane & 3;
  const bool live = rb < row_blocks;
  const int64_t o0 = rb * 16 + g;
  const bool row_ok[2] = {o0 < out, o0 + 8 < out};
  float sw[2] = {0.f, 0.f}, cw[2] = {0.f, 0.f};
  if (q8_params && live) {
    const float4 pr = q8_params[rb * 8 + g];  // {s, b} of rows g and g + 8
    sw[0] = pr.x, sw[1] = pr.z, cw[0] = __fmaf_rn(128.f, pr.x, pr.y), cw[1] = __fmaf_rn(128.f, pr.z, pr.w);
  } else if (!q8_params) {
    sw[0] = row_ok[0] ? scales[o0] : 0.f, sw[1] = row_ok[1] ? scales[o0 + 8] : 0.f;
  }
  auto value = [&](int j, int h, int r8, int n) {
    return __fmaf_rn(cw[r8], sxsum[n], __fmul_rn(__fmul_rn(float(acc[4 * j + 2 * r8 + h]), sw[r8]), sx[n]));
  };
  if (!staged) {  // f32, or rows not in 16-byte pieces: each value to its place
    if (!live) return;
#pragma unroll
    for (int j = 0; j < 32; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n0 + 8 * j + 2 * t + h;
        if (n >= N) continue;
#pragma unroll
        for (int r8 = 0; r8 < 2; ++r8) {
          if (!row_ok[r8]) continue;
          const float v = value(j, h, r8, n);
          const int64_t at = int64_t(n) * ldy + o0 + 8 * r8;
          if (ydt == kBF16) static_cast<bf16*>(y)[at] = __float2bfloat16_rn(v);
          else static_cast<float*>(y)[at] = v;
        }
      }
    return;
  }
  // bf16: through shared memory (the stages are free once every consumer warp is past its last
  // wgmma), [token][128 rows] with rows of 272 bytes (16 of padding: the quad's four tokens land in
  // different banks), then written out as whole 256-byte output rows, 16 bytes a lane.
  constexpr int kRowBytes = kRows * 2 + 16;
  static_assert(kTokens * kRowBytes <= kStages * kStageBytes, "the staged tile must fit the stages");
  asm volatile("bar.sync 1, 256;\n" ::: "memory");  // the consumer warps: every wgmma done
  if (live) {
#pragma unroll
    for (int j = 0; j < 32; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int nl = 8 * j + 2 * t + h, n = n0 + nl;
#pragma unroll
        for (int r8 = 0; r8 < 2; ++r8) {
          const float v = n < N ? value(j, h, r8, n) : 0.f;
          const uint32_t at = sbase + uint32_t(nl * kRowBytes + (16 * warp + g + 8 * r8) * 2);
          asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(at), "h"(__bfloat16_as_ushort(__float2bfloat16_rn(v))) : "memory");
        }
      }
  }
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  const int64_t row0 = rb0 * 16 + 8 * (lane & 15);  // this lane's 8 rows
#pragma unroll 4
  for (int it = 0; it < kTokens / 8 / 2; ++it) {  // warp w: tokens 32w .. 32w + 31, two per pass
    const int nl = 32 * warp + 2 * it + (lane >> 4), n = n0 + nl;
    if (n >= N || row0 >= out) continue;
    // (out % 8 == 0 here: a lane's 8 rows are all in or all out)
    *reinterpret_cast<uint4*>(static_cast<bf16*>(y) + int64_t(n) * ldy + row0) =
        ld_shared_v4(sbase + uint32_t(nl * kRowBytes + (lane & 15) * 16));
  }
#else
  __trap();  // not built for sm_90a: w8a8_gemm_unfit says so and nothing launches this
#endif
}

// The kernel runs where quant_gemm.cu's do: an sm_90a build on an sm_90 GPU whose driver has the
// tensor-map encoder (qgemm_available probes the loaded code).
bool available() {
  static const bool ok = [] {
    if (!qgemm_available()) return false;
    SALA_CUDA_CHECK(cudaFuncSetAttribute(w8a8_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  return ok;
}

// xq [N][in] int8 (rows of `in` bytes) as a TMA tensor in boxes of 128 k × 256 tokens with the
// 128-byte swizzle the B descriptor expects; rows past N read as zeros.
CUtensorMap xq_tensor_map(const void* xq, int64_t in, int64_t N) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(in), cuuint64_t(N)}, strides[1] = {cuuint64_t(in)};
  const cuuint32_t box[2] = {cuuint32_t(kK), cuuint32_t(kTokens)}, unit[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(xq), dims, strides,
                                          box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    const std::string why = "w8a8 gemm: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")";
    SALA_CUDA_REQUIRE(false, why.c_str());
  }
  return map;
}

}  // namespace

W8A8Weight w8a8_weight(const QWeight& q8) {
  SALA_CUDA_REQUIRE(q8.fmt == kQ8 && q8.group == q8.in, "w8a8 gemm: not a per-row int8 weight");
  return {q8.codes, q8.out, q8.in, q8.params, nullptr};
}

std::string w8a8_gemm_unfit(int64_t in, const void* xq, int64_t N) {
  if (!gemm_on()) return "SALA_CUDA_W8A8_GEMM=0";
  if (!available())
    return "this build has no sm_90a code for this GPU, or its driver no cuTensorMapEncodeTiled";
  if (in % kK != 0) return "the input width " + std::to_string(in) + " is not a multiple of 128";
  if ((reinterpret_cast<uintptr_t>(xq) & 15) != 0) return "activation rows that are not 16-byte aligned";
  if (N < 1 || N > (int64_t(1) << 31) - kTokens) return "a row count out of range";
  return {};
}

void set_w8a8_gemm(bool on) { g_mode = on ? 1 : 0; }

void launch_w8a8_gemm(const W8A8Weight& w, const void* xq, int64_t N, const float* sx, const float* sxsum, void* y,
                      Dt dty, int64_t ldy, cudaStream_t st) {
  SALA_CUDA_REQUIRE(w8a8_gemm_unfit(w.in, xq, N).empty(), "w8a8 gemm: product not supported (check w8a8_gemm_unfit)");
  SALA_CUDA_REQUIRE(dty == kBF16 || dty == kF32, "w8a8 gemm: y must be bf16 or f32");
  SALA_CUDA_REQUIRE((w.q8_params != nullptr) != (w.scales != nullptr), "w8a8 gemm: give Q8 parameters or row scales");
  const int64_t row_tiles = ((w.out + 15) / 16 + kRows / 16 - 1) / (kRows / 16);
  SALA_CUDA_REQUIRE(row_tiles <= 65535, "w8a8 gemm: too many weight rows");
  const dim3 grid(unsigned((N + kTokens - 1) / kTokens), unsigned(row_tiles));
  // bf16 rows written 16 bytes at a time from shared memory (the kernel's epilogue) where aligned.
  const bool staged = dty == kBF16 && ldy % 8 == 0 && w.out % 8 == 0 && (reinterpret_cast<uintptr_t>(y) & 15) == 0;
  w8a8_gemm_kernel<<<grid, kThreads, kSmemBytes, st>>>(static_cast<const uint8_t*>(w.codes),
                                                      static_cast<const float4*>(w.q8_params), w.scales, w.out, w.in,
                                                      xq_tensor_map(xq, w.in, N), sx, sxsum, y, int(dty), ldy, int(N),
                                                      staged);
  SALA_CUDA_LAUNCH("w8a8 gemm kernel");
}

}  // namespace sala::cuda
