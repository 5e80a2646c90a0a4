// Exact rollback of lightning states for speculative decoding (spec §6.2), the CUDA twin of
// backend/cpu/cpu_rollback.cpp: per head h of one layer, from the snapshot, the keep accepted
// tokens' updates S ← γ·S + k_j ⊗ v_j one after the other, with the same fp32 operations as the
// recurrent decode kernel (gla.cu: fmaf(k, v, γ·S), γ = float(exp(g)) in double): the state
// after a rollback is bit for bit the state plain decoding reaches, so speculative greedy equals
// plain greedy on a batch-invariant backend. (The closed form exp(keep·g)·S + Σ exp((keep−1−j)·g)
// k_j ⊗ v_j of the CPU twin is the same state up to fp32 rounding, which can flip a near tie.)
//
// Cost per layer (9B: 32 heads × 128²): the snapshot read and the state written once, 2 · 2 MiB,
// plus keep · d² FMAs per head (keep ≤ 9 in practice) → bandwidth bound, ~1.3 µs per layer at
// 3.3 TB/s; 24 launches per rollback, once per speculative round.
// CTA = (16 state rows, head), 256 threads, each thread d/16 elements of the tile in registers;
// k and v rows and the decay weights go through shared memory in chunks of kJ tokens. Each element is read and written by the same thread, so slot == snapshot_slot works
// in place.
#include <cmath>

#include "backend/cuda/common.cuh"

namespace sala::cuda {

namespace {

constexpr int kRowsPerCta = 16;
constexpr int kThreads = 256;
constexpr int kJ = 32;  // tokens per shared-memory chunk

template <int D>
__global__ void __launch_bounds__(kThreads) rollback_kernel(RollbackArgs a) {
  constexpr int E = kRowsPerCta * D / kThreads;  // elements per thread
  static_assert(E >= 1 && kRowsPerCta * D % kThreads == 0, "head dim must be a multiple of 16");
  __shared__ float ks[kJ][kRowsPerCta];  // k of this CTA's 16 rows
  __shared__ float vs[kJ][D];
  const int tid = threadIdx.x;
  const int row0 = blockIdx.x * kRowsPerCta, h = blockIdx.y;
  const int kh = h / (a.heads / a.kv_heads);
  const int64_t head_off = (int64_t(a.layer) * a.heads + h) * int64_t(D) * D;
  const int64_t slot_stride = int64_t(a.layers) * a.heads * D * D;
  const float* S0 = a.states + int64_t(a.snapshot_slot) * slot_stride + head_off;
  float* S = a.states + int64_t(a.slot) * slot_stride + head_off;
  const float gamma = float(exp(double(a.log_decay[h])));  // as gla_recurrent_kernel

  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int idx = tid + e * kThreads;  // within the tile: row idx / D, column idx % D
    acc[e] = S0[int64_t(row0 + idx / D) * D + idx % D];
  }
  for (int j0 = 0; j0 < a.keep; j0 += kJ) {
    const int n = min(kJ, a.keep - j0);
    __syncthreads();  // previous chunk consumed
    for (int i = tid; i < n * kRowsPerCta; i += kThreads) {
      const int j = i / kRowsPerCta, r = i % kRowsPerCta;
      ks[j][r] = ldf(a.k, a.dt, int64_t(j0 + j) * a.ldk + int64_t(kh) * D + row0 + r);
    }
    for (int i = tid; i < n * D; i += kThreads) {
      const int j = i / D, c = i % D;
      vs[j][c] = ldf(a.v, a.dt, int64_t(j0 + j) * a.ldv + int64_t(kh) * D + c);
    }
    __syncthreads();
    for (int j = 0; j < n; ++j)
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int idx = tid + e * kThreads;
        acc[e] = fmaf(ks[j][idx / D], vs[j][idx % D], gamma * acc[e]);  // as gla_recurrent_kernel
      }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int idx = tid + e * kThreads;
    S[int64_t(row0 + idx / D) * D + idx % D] = acc[e];
  }
}

template <int D>
void launch(const RollbackArgs& a, cudaStream_t st) {
  rollback_kernel<D><<<dim3(D / kRowsPerCta, a.heads), kThreads, 0, st>>>(a);
  SALA_CUDA_LAUNCH("rollback_kernel");
}

}  // namespace

void launch_lightning_rollback(const RollbackArgs& a, cudaStream_t st) {
  SALA_CUDA_REQUIRE(a.keep > 0, "lightning rollback: keep must be positive (keep 0 is a state copy)");
  SALA_CUDA_REQUIRE(a.kv_heads > 0 && a.heads % a.kv_heads == 0, "lightning rollback: heads not a multiple of kv heads");
  switch (a.d) {
    case 16: launch<16>(a, st); break;
    case 32: launch<32>(a, st); break;
    case 64: launch<64>(a, st); break;
    case 128: launch<128>(a, st); break;
    default: SALA_CUDA_REQUIRE(false, "lightning rollback: head dim must be 16, 32, 64 or 128");
  }
}

}  // namespace sala::cuda
