// Lightning (Simple GLA) kernels, spec §3.6–3.8. State S[h] ∈ R^{d×d} fp32 per (slot, layer, head).
//
// Recurrent kernel (decode, and any call with fewer than 64 new tokens — the reference dispatch):
//   per token and head: S = γS + k⊗v; o = s·qᵀS. Bytes per layer and sequence: the state read once
//   and written once, 2 · H·d²·4 = 2 · 32·128²·4 = 4 MiB (q, k, v, o are 32 KiB); FLOPs 4·H·d² =
//   2.1 MFLOP per token → bandwidth bound: 4 MiB / 3.35 TB/s ≈ 1.25 µs per layer and sequence.
//   CTA = (sequence, head, 32-column tile): 128 CTAs per sequence, each thread keeps a 4×4 piece of
//   the state in registers across all the call's tokens; one reduction over rows per token.
// Chunked kernel (prefill, ≥ 64 new tokens), C = 64, §3.7: per chunk and head
//   A = (QKᵀ ⊙ decay) (C²d), O = e·QS + AV (C·d² + C²d), S' = e·S + Kᵀ(e·V) (C·d²) → ~6 MFLOP per
//   chunk and head, 96 KFLOP per token and head (3 MFLOP per token and layer); fp32 FMA, no tensor
//   cores yet: an 8K-token prefill is ~25 GFLOP per layer (~0.5 ms at a realistic 50 TFLOP/s fp32).
//   CTA = (sequence, head, 32-column tile of S/V/O), state tile in shared memory for the whole call.
#include <cmath>

#include "backend/cuda/common.cuh"

namespace sala::cuda {

namespace {

template <int D, int TC>
__global__ void __launch_bounds__((TC / 4) * (D / 4)) gla_recurrent_kernel(GlaArgs a) {
  constexpr int CQ = TC / 4;  // column quads per tile
  constexpr int RG = D / 4;   // row groups
  const int tid = threadIdx.x;
  const int cq = tid % CQ, rg = tid / CQ;
  const int tile = blockIdx.x, h = blockIdx.y;
  const SeqMeta s = a.seqs[a.seq_list[blockIdx.z]];
  if (s.n_new <= 0) return;
  const int kh = h / (a.heads / a.kv_heads);
  float* S = a.states + ((int64_t(s.slot) * a.layers + a.layer) * a.heads + h) * int64_t(D) * D;
  const int col0 = tile * TC + 4 * cq;
  float st[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = *reinterpret_cast<const float4*>(S + int64_t(4 * rg + i) * D + col0);
    st[i][0] = v.x, st[i][1] = v.y, st[i][2] = v.z, st[i][3] = v.w;
  }
  const float gamma = float(exp(double(a.log_decay[h])));
  __shared__ float red[2][RG][TC];
  for (int t = 0; t < s.n_new; ++t) {
    const int64_t row = s.start + t;
    float q[4], k[4], v[4], p[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = ldf(a.q, a.dt, row * a.ldq + int64_t(h) * D + 4 * rg + i);
      k[i] = ldf(a.k, a.dt, row * a.ldk + int64_t(kh) * D + 4 * rg + i);
      v[i] = ldf(a.v, a.dt, row * a.ldv + int64_t(kh) * D + col0 + i);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        st[i][j] = gamma * st[i][j] + k[i] * v[j];
        p[j] += q[i] * st[i][j];
      }
#pragma unroll
    for (int j = 0; j < 4; ++j) red[t & 1][rg][4 * cq + j] = p[j];
    __syncthreads();
    if (tid < TC) {
      float sum = 0.f;
#pragma unroll 8
      for (int r = 0; r < RG; ++r) sum += red[t & 1][r][tid];
      stf(a.out, a.dt, row * a.ldo + int64_t(h) * D + tile * TC + tid, a.scale * sum);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
    *reinterpret_cast<float4*>(S + int64_t(4 * rg + i) * D + col0) = make_float4(st[i][0], st[i][1], st[i][2], st[i][3]);
}

constexpr int kC = 64;        // chunk length
constexpr int kThreads = 256;

template <int D, int TC>
constexpr size_t chunked_smem() {
  return sizeof(float) * (size_t(D) * TC + 2 * size_t(D) * kC + size_t(kC) * TC + size_t(kC) * kC + kC + 4);
}

template <int D, int TC>
__global__ void __launch_bounds__(kThreads) gla_chunked_kernel(GlaArgs a) {
  extern __shared__ float4 smem4[];
  float* S = reinterpret_cast<float*>(smem4);  // [D][TC]
  float* Qt = S + D * TC;                      // [D][C]  (transposed chunk of q)
  float* Kt = Qt + D * kC;                     // [D][C]
  float* Vc = Kt + D * kC;                     // [C][TC]
  float* At = Vc + kC * TC;                    // [C][C]  At[j][i] = decayed (q_i · k_j), j ≤ i
  float* ex = At + kC * kC;                    // [C+1]   exp(m·g)
  const int tid = threadIdx.x;
  const int tile = blockIdx.x, h = blockIdx.y;
  const SeqMeta s = a.seqs[a.seq_list[blockIdx.z]];
  const int n = s.n_new;
  if (n <= 0) return;
  const int kh = h / (a.heads / a.kv_heads);
  float* Sg = a.states + ((int64_t(s.slot) * a.layers + a.layer) * a.heads + h) * int64_t(D) * D;
  for (int idx = tid; idx < D * TC; idx += kThreads) S[idx] = Sg[int64_t(idx / TC) * D + tile * TC + idx % TC];
  const double g = double(a.log_decay[h]);
  for (int m = tid; m <= kC; m += kThreads) ex[m] = float(exp(double(m) * g));
  __syncthreads();

  for (int c0 = 0; c0 < n; c0 += kC) {
    const int L = min(kC, n - c0);
    for (int idx = tid; idx < kC * D; idx += kThreads) {
      const int t = idx / D, d = idx % D;
      float qv = 0.f, kv = 0.f;
      if (t < L) {
        const int64_t row = s.start + c0 + t;
        qv = ldf(a.q, a.dt, row * a.ldq + int64_t(h) * D + d);
        kv = ldf(a.k, a.dt, row * a.ldk + int64_t(kh) * D + d);
      }
      Qt[d * kC + t] = qv;
      Kt[d * kC + t] = kv;
    }
    for (int idx = tid; idx < kC * TC; idx += kThreads) {
      const int t = idx / TC, b = idx % TC;
      Vc[idx] = t < L ? ldf(a.v, a.dt, (s.start + c0 + t) * a.ldv + int64_t(kh) * D + tile * TC + b) : 0.f;
    }
    __syncthreads();

    // Intra-chunk attention matrix, 4×4 pieces.
    for (int mt = tid; mt < (kC / 4) * (kC / 4); mt += kThreads) {
      const int i4 = mt / (kC / 4), j4 = mt % (kC / 4);
      float acc[4][4] = {};
      if (j4 <= i4) {
        for (int d = 0; d < D; ++d) {
          const float4 qv = *reinterpret_cast<const float4*>(Qt + d * kC + 4 * i4);
          const float4 kv = *reinterpret_cast<const float4*>(Kt + d * kC + 4 * j4);
          const float qa[4] = {qv.x, qv.y, qv.z, qv.w}, ka[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
          for (int ii = 0; ii < 4; ++ii)
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) acc[ii][jj] = fmaf(qa[ii], ka[jj], acc[ii][jj]);
        }
      }
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int i = 4 * i4 + ii, j = 4 * j4 + jj;
          At[j * kC + i] = (j <= i && i < L) ? ex[i - j] * acc[ii][jj] : 0.f;
        }
    }
    __syncthreads();

    // Outputs: o_i = s·(ex[i+1]·q_iᵀS + Σ_{j≤i} A[i][j] v_j), 2×4 pieces.
    for (int mt = tid; mt < (kC / 2) * (TC / 4); mt += kThreads) {
      const int i0 = 2 * (mt / (TC / 4)), b0 = 4 * (mt % (TC / 4));
      if (i0 >= L) continue;
      float inter[2][4] = {}, intra[2][4] = {};
      for (int d = 0; d < D; ++d) {
        const float2 qv = *reinterpret_cast<const float2*>(Qt + d * kC + i0);
        const float4 sv = *reinterpret_cast<const float4*>(S + d * TC + b0);
        const float qa[2] = {qv.x, qv.y}, sa[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) inter[ii][jj] = fmaf(qa[ii], sa[jj], inter[ii][jj]);
      }
      for (int j = 0; j <= i0 + 1 && j < L; ++j) {
        const float2 av = *reinterpret_cast<const float2*>(At + j * kC + i0);
        const float4 vv = *reinterpret_cast<const float4*>(Vc + j * TC + b0);
        const float aa[2] = {av.x, av.y}, va[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) intra[ii][jj] = fmaf(aa[ii], va[jj], intra[ii][jj]);
      }
#pragma unroll
      for (int ii = 0; ii < 2; ++ii) {
        const int i = i0 + ii;
        if (i >= L) continue;
        const int64_t row = s.start + c0 + i;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
          stf(a.out, a.dt, row * a.ldo + int64_t(h) * D + tile * TC + b0 + jj,
              a.scale * (ex[i + 1] * inter[ii][jj] + intra[ii][jj]));
      }
    }
    __syncthreads();

    // State: S = ex[L]·S + Σ_j ex[L−1−j]·k_j ⊗ v_j, 4×4 pieces.
    for (int mt = tid; mt < (D / 4) * (TC / 4); mt += kThreads) {
      const int a0 = 4 * (mt / (TC / 4)), b0 = 4 * (mt % (TC / 4));
      float acc[4][4];
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) {
        const float4 sv = *reinterpret_cast<const float4*>(S + (a0 + ii) * TC + b0);
        acc[ii][0] = ex[L] * sv.x, acc[ii][1] = ex[L] * sv.y, acc[ii][2] = ex[L] * sv.z, acc[ii][3] = ex[L] * sv.w;
      }
      for (int j = 0; j < L; ++j) {
        const float e = ex[L - 1 - j];
        const float4 vv = *reinterpret_cast<const float4*>(Vc + j * TC + b0);
        const float va[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) {
          const float w = e * Kt[(a0 + ii) * kC + j];
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) acc[ii][jj] = fmaf(w, va[jj], acc[ii][jj]);
        }
      }
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
        *reinterpret_cast<float4*>(S + (a0 + ii) * TC + b0) = make_float4(acc[ii][0], acc[ii][1], acc[ii][2], acc[ii][3]);
    }
    __syncthreads();
  }
  for (int idx = tid; idx < D * TC; idx += kThreads) Sg[int64_t(idx / TC) * D + tile * TC + idx % TC] = S[idx];
}

template <int D>
constexpr int tile_cols() { return D < 32 ? D : 32; }

template <int D>
void recurrent_d(const GlaArgs& a, cudaStream_t st) {
  constexpr int TC = tile_cols<D>();
  dim3 grid(D / TC, a.heads, a.n_list);
  gla_recurrent_kernel<D, TC><<<grid, (TC / 4) * (D / 4), 0, st>>>(a);
  SALA_CUDA_LAUNCH("gla_recurrent kernel");
}

template <int D>
void chunked_d(const GlaArgs& a, cudaStream_t st) {
  constexpr int TC = tile_cols<D>();
  constexpr size_t smem = chunked_smem<D, TC>();
  static bool attr = false;
  if (!attr) {
    SALA_CUDA_CHECK(cudaFuncSetAttribute(gla_chunked_kernel<D, TC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem)));
    attr = true;
  }
  dim3 grid(D / TC, a.heads, a.n_list);
  gla_chunked_kernel<D, TC><<<grid, kThreads, smem, st>>>(a);
  SALA_CUDA_LAUNCH("gla_chunked kernel");
}

}  // namespace

void launch_gla_recurrent(const GlaArgs& a, cudaStream_t st) {
  if (a.n_list <= 0) return;
  switch (a.d) {
    case 16: return recurrent_d<16>(a, st);
    case 32: return recurrent_d<32>(a, st);
    case 64: return recurrent_d<64>(a, st);
    case 128: return recurrent_d<128>(a, st);
    default: cuda_fail_msg("lightning_attention: head dim must be 16, 32, 64 or 128 on CUDA", __FILE__, __LINE__);
  }
}

void launch_gla_chunked(const GlaArgs& a, cudaStream_t st) {
  if (a.n_list <= 0) return;
  switch (a.d) {
    case 16: return chunked_d<16>(a, st);
    case 32: return chunked_d<32>(a, st);
    case 64: return chunked_d<64>(a, st);
    case 128: return chunked_d<128>(a, st);
    default: cuda_fail_msg("lightning_attention: head dim must be 16, 32, 64 or 128 on CUDA", __FILE__, __LINE__);
  }
}

}  // namespace sala::cuda
