// Small-N matrix product for decode: y[n, o] = Σ_i x[n, i] · W[o, i], N ≤ 8 rows, W bf16 [out, in].
//
// Speed of light: the weight is read once, 2·out·in bytes; x (N·in) and y (N·out) are noise.
//   FLOPs 2·N·out·in → ≤ 8 FLOP/byte, far under the H100's ~300 FLOP/byte ridge: bandwidth bound.
//   4096×4096 (q_proj): 33.5 MB → 10 µs at 3.35 TB/s; 16384×4096 (gate/up): 134 MB → 40 µs;
//   lm_head 73448×4096: 602 MB → 180 µs. Whole 9B decode step ≈ 19 GB of weights → ~5.7 ms.
// Main path (x bf16, in % 32 == 0): tensor cores. A warp owns 16 output rows and one quarter of
// `in`; per 32-wide k block each lane loads one 16-byte piece of two W rows (rows g and g+8) and one
// of x row g (N ≤ 8 rows, zeros beyond), and two m16n8k16 products consume them — the k order
// inside a block is permuted identically for W and x, so no shuffles are needed. 8 blocks (16
// W pieces per lane) are in flight per iteration. The 4 warps of a CTA add their partial 16×8
// tiles in shared memory. ~4× fewer instructions per W byte than the FMA path at N = 8.
// FMA kernel (N ≤ 2, x f32, or in % 32 != 0): a CTA of 4 warps owns 4 output rows; its 128
// threads stride the `in` dimension in 16-byte pieces (8 bf16), so every load of W is a full 16-byte, coalesced access, 2 pieces in flight per
// row and thread; x pieces are shared by the 4 rows (x traffic N/4 per W byte, L1 resident).
// Partial sums: warp shuffle, then the 4 warps through shared memory.
// Both are launched with programmatic dependent launch on sm_90: the first stage of weights is
// loaded into registers before griddepcontrol.wait, overlapping the previous kernel (+4-5%
// end-to-end decode with L2 prefetches; registers since 2026-11-25), and the next kernel is let
// in (launch_dependents) as soon as this one may compute.
// Measured (H200, 2026-11-22, fraction of the 4.22 TB/s device copy, automatic variant):
//   N=1: 4096×4096 68%, 16384×4096 88%, 4096×16384 92%, 73448×4096 (lm_head) 99%
//   N=8: 4096×4096 54%, 16384×4096 81%, 4096×16384 78%, 73448×4096 90%
//   The 32 MB matrices lose to launch/ramp time (~3 µs of 11.6 µs).
#include <cstdlib>

#include "backend/cuda/common.cuh"

namespace sala::cuda {

namespace {

constexpr int kRows = 4;   // output rows per CTA
constexpr int kWarps = 4;  // warps per CTA splitting `in`

// Which part of a grouped launch CTA `b` works on (parts are laid out one after another).
__device__ __forceinline__ int find_part(const GemvSet& s, unsigned b) {
  int p = 0;
  while (p + 1 < s.count && b >= s.first[p + 1]) ++p;
  return p;
}

template <typename XT>
__device__ __forceinline__ void load_x8(const XT* p, float f[8]);
template <>
__device__ __forceinline__ void load_x8<bf16>(const bf16* p, float f[8]) {
  unpack8(*reinterpret_cast<const uint4*>(p), f);
}
template <>
__device__ __forceinline__ void load_x8<float>(const float* p, float f[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

template <typename YT>
__device__ __forceinline__ void store_y(YT* p, float v);
template <>
__device__ __forceinline__ void store_y<bf16>(bf16* p, float v) { *p = __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ void store_y<float>(float* p, float v) { *p = v; }

// P: 16-byte pieces per row and stage. P = 2 keeps 2·kRows loads in flight per thread (~95
// registers: 5 CTAs per SM); P = 1 fits 64 registers, 8 CTAs per SM, so a 4096-row matrix
// (1024 CTAs) runs in one wave instead of 1.55 (4K decode +3%, see one_piece_per_stage). The pieces are
// summed in the same order either way: the results are the same bits.
template <int N, typename XT, typename YT, int P = 2>
__global__ void __launch_bounds__(kWarps * 32, P == 1 ? 8 : 1) gemv_kernel(const XT* __restrict__ x, int64_t ldx,
                                                                           GemvSet set, int64_t in) {
  const int tid = threadIdx.x;
  const int part = find_part(set, blockIdx.x);
  const bf16* __restrict__ w = static_cast<const bf16*>(set.part[part].w);
  const int64_t out = set.part[part].out, ldy = set.part[part].ldy;
  YT* __restrict__ y = static_cast<YT*>(set.part[part].y);
  const int64_t o0 = int64_t(blockIdx.x - set.first[part]) * kRows;
  const bf16* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) wr[r] = w + (o0 + r < out ? o0 + r : out - 1) * in;
  float acc[N][kRows];
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[n][r] = 0.f;

  const int64_t pieces = in / 8;
  constexpr int kStride = kWarps * 32;
  // P pieces per stage: P·kRows independent 16-byte weight loads in flight per thread, the next
  // stage's loads issued before this stage's FMAs. Weights never depend on earlier kernels: the
  // first stage is loaded before the dependency wait, overlapping the previous kernel (with PDL).
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 wv[P][kRows];
  auto load = [&](int64_t p) {
#pragma unroll
    for (int u = 0; u < P; ++u)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        wv[u][r] = p + u * kStride < pieces ? ld_weight(reinterpret_cast<const uint4*>(wr[r]) + p + u * kStride) : zero;
  };
  load(tid);
  grid_dep_wait();
  launch_dependents();
  for (int64_t p = tid; p < pieces; p += P * kStride) {
    uint4 cur[P][kRows];
#pragma unroll
    for (int u = 0; u < P; ++u)
#pragma unroll
      for (int r = 0; r < kRows; ++r) cur[u][r] = wv[u][r];
    if (p + P * kStride < pieces) load(p + P * kStride);
#pragma unroll
    for (int u = 0; u < P; ++u) {
      if (p + u * kStride >= pieces) break;
      float wf[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) unpack8(cur[u][r], wf[r]);
#pragma unroll
      for (int n = 0; n < N; ++n) {
        float xf[8];
        load_x8<XT>(x + n * ldx + (p + u * kStride) * 8, xf);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[n][r] = fmaf(xf[j], wf[r][j], acc[n][r]);
      }
    }
  }

  __shared__ float red[kWarps][N * kRows];
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float v = warp_sum(acc[n][r]);
      if (lane == 0) red[warp][n * kRows + r] = v;
    }
  __syncthreads();
  if (tid < N * kRows) {
    const int n = tid / kRows, r = tid % kRows;
    float s = 0.f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) s += red[wi][tid];
    if (o0 + r < out) store_y<YT>(y + n * ldy + o0 + r, s);
  }
}

constexpr int kMmaU = 8;  // k blocks of 32 in flight per lane and iteration

template <typename YT, int W>
__global__ void __launch_bounds__(W * 32) gemv_mma_kernel(const bf16* __restrict__ x, int64_t ldx, GemvSet set,
                                                       int64_t in, int N) {
  __shared__ float red[W][16][8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int part = find_part(set, blockIdx.x);
  const bf16* __restrict__ w = static_cast<const bf16*>(set.part[part].w);
  const int64_t out = set.part[part].out, ldy = set.part[part].ldy;
  YT* __restrict__ y = static_cast<YT*>(set.part[part].y);
  const int64_t r0 = int64_t(blockIdx.x - set.first[part]) * 16;
  const int64_t ra = min(r0 + g, out - 1), rb = min(r0 + g + 8, out - 1);
  const uint4* wa = reinterpret_cast<const uint4*>(w + ra * in) + t;
  const uint4* wb = reinterpret_cast<const uint4*>(w + rb * in) + t;
  const bool xv = g < N;
  const uint4* xr = reinterpret_cast<const uint4*>(x + (xv ? g : 0) * ldx) + t;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  const int nblk = int(in / 32);
  int b = warp;
  // Weights never depend on earlier kernels: the first stage is loaded before the dependency wait.
  uint4 A[kMmaU], B[kMmaU], X[kMmaU];
  bool loaded = b + W * (kMmaU - 1) < nblk;
  if (loaded)
#pragma unroll
    for (int u = 0; u < kMmaU; ++u) {
      A[u] = __ldg(wa + 4 * (b + W * u));
      B[u] = __ldg(wb + 4 * (b + W * u));
    }
  grid_dep_wait();
  launch_dependents();
  for (; b + W * (kMmaU - 1) < nblk; b += W * kMmaU) {
#pragma unroll
    for (int u = 0; u < kMmaU; ++u) {
      if (!loaded) {
        A[u] = __ldg(wa + 4 * (b + W * u));
        B[u] = __ldg(wb + 4 * (b + W * u));
      }
      X[u] = xv ? xr[4 * (b + W * u)] : zero;
    }
    loaded = false;
#pragma unroll
    for (int u = 0; u < kMmaU; ++u) {
      const uint32_t a0[4] = {A[u].x, B[u].x, A[u].y, B[u].y};
      const uint32_t a1[4] = {A[u].z, B[u].z, A[u].w, B[u].w};
      mma16816(c, a0, X[u].x, X[u].y);
      mma16816(c, a1, X[u].z, X[u].w);
    }
  }
  for (; b < nblk; b += W) {
    const uint4 wa1 = __ldg(wa + 4 * b), wb1 = __ldg(wb + 4 * b), x1 = xv ? xr[4 * b] : zero;
    const uint32_t a0[4] = {wa1.x, wb1.x, wa1.y, wb1.y};
    const uint32_t a1[4] = {wa1.z, wb1.z, wa1.w, wb1.w};
    mma16816(c, a0, x1.x, x1.y);
    mma16816(c, a1, x1.z, x1.w);
  }
  red[warp][g][2 * t] = c[0];
  red[warp][g][2 * t + 1] = c[1];
  red[warp][g + 8][2 * t] = c[2];
  red[warp][g + 8][2 * t + 1] = c[3];
  __syncthreads();
  if (threadIdx.x < 128) {
    const int row = threadIdx.x / 8, n = threadIdx.x % 8;
    if (n < N && r0 + row < out) {
      float v = 0.f;
#pragma unroll
      for (int i = 0; i < W; ++i) v += red[i][row][n];
      store_y<YT>(y + n * ldy + r0 + row, v);
    }
  }
}

// Any shape / alignment / dtype: one warp per (output row), scalar loads.
__global__ void gemv_generic(const void* x, int dtx, int64_t ldx, const bf16* w, int64_t out, int64_t in, void* y,
                             int dty, int64_t ldy, int N) {
  const int64_t o = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (o >= out) return;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = lane; i < in; i += 32) {
    const float wv = __bfloat162float(w[o * in + i]);
    for (int n = 0; n < N; ++n) acc[n] += ldf(x, dtx, n * ldx + i) * wv;
  }
  for (int n = 0; n < N; ++n) {
    const float s = warp_sum(acc[n]);
    if (lane == 0) stf(y, dty, n * ldy + o, s);
  }
}

bool al16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

bool g_pdl = false;  // set per launch_gemv call (single stream, host thread)

// Launch with programmatic stream serialization when g_pdl (the kernel waits in grid_dep_wait).
template <typename... KArgs, typename... Args>
void launch_k(void (*kernel)(KArgs...), unsigned blocks, unsigned threads, cudaStream_t st, Args... args) {
  launch_pdl(g_pdl, kernel, dim3(blocks), dim3(threads), 0, st, args...);
}

// Fills set.first for CTAs of `rows` output rows; returns the total CTA count.
unsigned lay_out(GemvSet& set, int64_t rows) {
  unsigned b = 0;
  for (int i = 0; i < set.count; ++i) {
    set.first[i] = b;
    b += unsigned((set.part[i].out + rows - 1) / rows);
  }
  set.first[set.count] = b;
  return b;
}

// Pieces per stage of the FMA kernel at N = 1 (N > 1 keeps two): one, unless SALA_CUDA_GEMV_STAGE=2
// (A/B runs). Same-machine A/B on the H200 (4K decode, 3 runs each): two everywhere 188.4–189.2
// tok/s; one for grids ≤ 1024 CTAs (the 4096-row o_proj in one wave) 193.5–194.8; one for every
// N = 1 launch 194.1–195.2 (the larger grids also run in fewer waves).
bool one_piece_per_stage() {
  static const bool one = [] {
    const char* e = std::getenv("SALA_CUDA_GEMV_STAGE");
    return !(e && std::atoi(e) == 2);
  }();
  return one;
}

template <int N, typename XT, typename YT>
void launch_n(const void* x, int64_t ldx, GemvSet set, int64_t in, cudaStream_t st) {
  const unsigned blocks = lay_out(set, kRows);
  if (N == 1 && one_piece_per_stage())
    launch_k(gemv_kernel<1, XT, YT, 1>, blocks, kWarps * 32, st, static_cast<const XT*>(x), ldx, set, in);
  else
    launch_k(gemv_kernel<N, XT, YT>, blocks, kWarps * 32, st, static_cast<const XT*>(x), ldx, set, in);
}

template <typename XT, typename YT>
void launch_t(int N, const void* x, int64_t ldx, const GemvSet& set, int64_t in, cudaStream_t st) {
  switch (N) {
    case 1: return launch_n<1, XT, YT>(x, ldx, set, in, st);
    case 2: return launch_n<2, XT, YT>(x, ldx, set, in, st);
    case 3: return launch_n<3, XT, YT>(x, ldx, set, in, st);
    case 4: return launch_n<4, XT, YT>(x, ldx, set, in, st);
    case 5: return launch_n<5, XT, YT>(x, ldx, set, in, st);
    case 6: return launch_n<6, XT, YT>(x, ldx, set, in, st);
    case 7: return launch_n<7, XT, YT>(x, ldx, set, in, st);
    default: return launch_n<8, XT, YT>(x, ldx, set, in, st);
  }
}

}  // namespace

void launch_gemv_set(const void* x, Dt dtx, int64_t ldx, GemvSet set, int64_t in, Dt dty, int N, int mode, bool pdl,
                     cudaStream_t st) {
  g_pdl = pdl;
  SALA_CUDA_REQUIRE(set.count >= 1 && set.count <= kGemvMaxParts, "gemv: 1 to 4 parts");
  int64_t max_out = 0;
  bool aligned = al16(x);
  for (int i = 0; i < set.count; ++i) {
    max_out = std::max(max_out, set.part[i].out);
    aligned = aligned && al16(set.part[i].w);
  }
  if (N <= 0 || max_out <= 0) return;
  SALA_CUDA_REQUIRE(N <= 8, "gemv: at most 8 rows");
  const size_t xes = dtx == kF32 ? 4 : 2;
  const bool fast = (dtx == kBF16 || dtx == kF32) && (dty == kBF16 || dty == kF32) && in % 8 == 0 && aligned &&
                    (ldx * int64_t(xes)) % 16 == 0;
  // Mode (set_gemv_mode): 0 auto, 1 FMA kernel, 2 tensor cores with 4 warps, 3 with 16 warps.
  const bool mma_ok = fast && dtx == kBF16 && in % 32 == 0 && (ldx * 2) % 16 == 0;
  int m = mode;
  // Measured on H200 (docs/cuda-backend.md): FMA best at N ≤ 2 (69-100% of copy bandwidth); tensor
  // cores at N ≥ 3, 16 warps per CTA when there are few 16-row CTAs (out ≤ 8192), else 4.
  int64_t total_out = 0;
  for (int i = 0; i < set.count; ++i) total_out += set.part[i].out;
  if (m == 0) m = N <= 2 ? 1 : total_out <= 8192 ? 3 : 2;
  if (mma_ok && m >= 2) {
    const unsigned blocks = lay_out(set, 16);
    auto xb = static_cast<const bf16*>(x);
    if (m == 3) {
      if (dty == kBF16) launch_k(gemv_mma_kernel<bf16, 16>, blocks, 512, st, xb, ldx, set, in, N);
      else launch_k(gemv_mma_kernel<float, 16>, blocks, 512, st, xb, ldx, set, in, N);
    } else {
      if (dty == kBF16) launch_k(gemv_mma_kernel<bf16, 4>, blocks, 128, st, xb, ldx, set, in, N);
      else launch_k(gemv_mma_kernel<float, 4>, blocks, 128, st, xb, ldx, set, in, N);
    }
  } else if (fast) {
    if (dtx == kBF16 && dty == kBF16) launch_t<bf16, bf16>(N, x, ldx, set, in, st);
    else if (dtx == kBF16) launch_t<bf16, float>(N, x, ldx, set, in, st);
    else if (dty == kBF16) launch_t<float, bf16>(N, x, ldx, set, in, st);
    else launch_t<float, float>(N, x, ldx, set, in, st);
  } else {
    for (int i = 0; i < set.count; ++i) {
      const GemvPart& p = set.part[i];
      gemv_generic<<<unsigned((p.out + 7) / 8), 256, 0, st>>>(x, dtx, ldx, static_cast<const bf16*>(p.w), p.out, in, p.y, dty, p.ldy, N);
    }
  }
  SALA_CUDA_LAUNCH("gemv kernel");
}

void launch_gemv(const void* x, Dt dtx, int64_t ldx, const void* w, int64_t out, int64_t in, void* y, Dt dty,
                 int64_t ldy, int N, int mode, bool pdl, cudaStream_t st) {
  GemvSet set{};
  set.part[0] = {w, y, out, ldy};
  set.count = 1;
  launch_gemv_set(x, dtx, ldx, set, in, dty, N, mode, pdl, st);
}

}  // namespace sala::cuda
