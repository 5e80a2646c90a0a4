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
//   This fp32 FMA kernel now only serves d = 16, 32 (and non-bf16 inputs); d = 64, 128 use the
//   tensor-core kernel below.
// Measured (H200, 2026-11-22, 32 heads × 128): recurrent decode B=1 4.6 µs (22% of copy
//   bandwidth, latency bound), B=8..64 ~65%; chunked prefill L=4096: tensor cores 320 µs
//   (34 TFLOP/s effective), fp32 FMA 2.86 ms. States match the CPU to 2.4e-6 (tensor cores) and
//   1.3e-7 (FMA) relative.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/head_norm.cuh"

namespace sala::cuda {

namespace {

// NORM (launch_gla_recurrent_normed; bf16, D ≥ 64): each token's q and k enter un-normalised and
// warp 0 applies the per-head RMSNorm + RoPE first (lanes 0–15: q of head h, 16–31: k of head
// kh; norm_rope_half_warp, qk_norm_rope_bf16's arithmetic), into shared memory — the same bits as
// the qk_norm_rope launch before the plain kernel. Its latency then overlaps this kernel's state
// loads (issued before the dependency wait) instead of being a kernel between the projections and
// this one: batch-1 decode at 4K +1.3% (bf16) / +2.2% (fp8) on an H100 (run 2 of
// bench/results/2026-11-26-h100-mixer-fusion.md). The 4 column tiles of a head each repeat it
// (256 bytes of q/k, 16 shuffles).
template <int D, int TC, bool NORM = false>
__global__ void __launch_bounds__((TC / 4) * (D / 4)) gla_recurrent_kernel(GlaArgs a, GlaQkNorms n) {
  static_assert(!NORM || D >= 64, "the q/k prologue takes a warp: 64 or 128 dims");
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
  // The state was last written by this layer's previous step (long finished): it is read before
  // grid_dep_wait, overlapping the previous kernel's tail when launched with PDL (g_small_pdl).
  // NORM: warp 0's norm weights and first token's rotation, also before the wait (head_norm.cuh).
  const int lane = tid % 16;
  const bool is_k = tid >= 16;
  HeadNormLane hn;
  if (NORM && tid < 32)
    hn = head_norm_lane(static_cast<const bf16*>(is_k ? n.k_norm : n.q_norm), D,
                        n.positions ? float(n.positions[s.start]) : 0.f, n.positions ? n.inv_freq : nullptr, lane);
  const float gamma = float(exp(double(a.log_decay[h])));  // a model constant: before the wait too
  launch_dependents();  // the next kernel may start loading its weights (common.cuh)
  grid_dep_wait();  // q, k, v come from the kernels just before
  __shared__ float red[2][RG][TC];
  __shared__ float qk[NORM ? 2 : 1][2][NORM ? D : 1];  // NORM: token t's normalised q, k in qk[t & 1]
  for (int t = 0; t < s.n_new; ++t) {
    const int64_t row = s.start + t;
    // v first: its loads are in flight while warp 0 normalises q and k (NORM), not after.
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = ldf(a.v, a.dt, row * a.ldv + int64_t(kh) * D + col0 + i);
    if constexpr (NORM) {
      if (tid < 32) {
        const bf16* src = is_k ? static_cast<const bf16*>(a.k) + row * a.ldk + int64_t(kh) * D
                               : static_cast<const bf16*>(a.q) + row * a.ldq + int64_t(h) * D;
        float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (lane < D / 8) unpack8(reinterpret_cast<const uint4*>(src)[lane], f);
        if (t > 0 && n.positions && lane < D / 8) head_norm_angles(hn, D, float(n.positions[row]), n.inv_freq, lane);
        norm_rope_half_warp(f, hn, D, n.eps, n.positions != nullptr, lane, 0xffffu << (is_k ? 16 : 0));
        if (lane < D / 8)
#pragma unroll
          for (int j = 0; j < 8; ++j) qk[t & 1][is_k][8 * lane + j] = f[j];
      }
      __syncthreads();
    }
    float q[4], k[4], p[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = NORM ? qk[t & 1][0][4 * rg + i] : ldf(a.q, a.dt, row * a.ldq + int64_t(h) * D + 4 * rg + i);
      k[i] = NORM ? qk[t & 1][1][4 * rg + i] : ldf(a.k, a.dt, row * a.ldk + int64_t(kh) * D + 4 * rg + i);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        st[i][j] = fmaf(k[i], v[j], gamma * st[i][j]);  // spelled out: rollback.cu repeats it exactly
        p[j] += q[i] * st[i][j];
      }
#pragma unroll
    for (int j = 0; j < 4; ++j) red[t & 1][rg][4 * cq + j] = p[j];
    // The final state is stored here, its writes in flight during the reduction rather than after
    // it (H100, 4K batch 1: int4 g128 + lm_head −0.01 ms per step over seven interleaved rounds,
    // bf16 unchanged; bench/results/2026-11-27-zero-packed-int4.md).
    if (t == s.n_new - 1)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<float4*>(S + int64_t(4 * rg + i) * D + col0) = make_float4(st[i][0], st[i][1], st[i][2], st[i][3]);
    __syncthreads();
    if (tid < TC) {
      float sum = 0.f;
#pragma unroll 8
      for (int r = 0; r < RG; ++r) sum += red[t & 1][r][tid];
      stf(a.out, a.dt, row * a.ldo + int64_t(h) * D + tile * TC + tid, a.scale * sum);
    }
  }
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

// ---- chunked prefill on tensor cores (d = 64, 128; bf16 q/k/v) ----
// CTA = (sequence, head, 32-column tile of S/V/O), 4 warps. Per chunk of 64 tokens:
//   A   = (Q Kᵀ ⊙ decay)        warp w: rows 16w..16w+15 (tokens), keys ≤ its rows
//   O   = ex[i+1]·Q S_in + A V   S_in and A enter as bf16 hi + lo pairs (fp32-accurate products,
//                                 the other operand is exact bf16)
//   S  ← ex[L]·S + Kᵀ (ex[L-1-j]·V)   S lives in the warps' accumulators for the whole call
//                                 (warp w: key rows 16·MT·w ...), W = decayed V as hi + lo.
// FLOPs per chunk and CTA ≈ 2·(64·64·d/2 + 2·64·d·32 + 2·64·64·32/2 + 2·d·64·32) → ~4 MFLOP
// (d = 128), ~0.4 µs of mma.sync per chunk; the fp32 FMA kernel above stays for d = 16, 32.
constexpr int kTC = 32;

__device__ __forceinline__ void split_bf16(float x, float& hi, float& lo) {
  hi = __bfloat162float(__float2bfloat16_rn(x));
  lo = x - hi;
}

template <int D>
constexpr size_t chunked_mma_smem() {
  return size_t(2) * kC * D * 2 + size_t(kC) * kTC * 2 + size_t(2) * D * kTC * 2 + size_t(2) * kC * kTC * 2 +
         (kC + 4) * 4;
}

template <int D>
__global__ void __launch_bounds__(128) gla_chunked_mma_kernel(GlaArgs a) {
  constexpr int MT = D / 64;  // 16-row tiles of S per warp
  extern __shared__ float4 smem4[];
  char* sm = reinterpret_cast<char*>(smem4);
  constexpr uint32_t oQ = 0, oK = oQ + kC * D * 2, oV = oK + kC * D * 2, oSh = oV + kC * kTC * 2,
                     oSl = oSh + D * kTC * 2, oWh = oSl + D * kTC * 2, oWl = oWh + kC * kTC * 2,
                     oEx = oWl + kC * kTC * 2;
  const uint32_t base = smem_addr(sm);
  float* ex = reinterpret_cast<float*>(sm + oEx);
  using SwD = RowSwizzle<D>;
  using SwT = RowSwizzle<kTC>;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int tile = blockIdx.x, h = blockIdx.y;
  const SeqMeta s = a.seqs[a.seq_list[blockIdx.z]];
  const int n = s.n_new;
  if (n <= 0) return;
  const int kh = h / (a.heads / a.kv_heads);
  const bf16* qg = static_cast<const bf16*>(a.q);
  const bf16* kg = static_cast<const bf16*>(a.k);
  const bf16* vg = static_cast<const bf16*>(a.v);
  float* Sg = a.states + ((int64_t(s.slot) * a.layers + a.layer) * a.heads + h) * int64_t(D) * D;
  const double gd = double(a.log_decay[h]);
  for (int m = tid; m <= kC; m += 128) ex[m] = float(exp(double(m) * gd));

  // S accumulators: (mt, nt, e) ↔ row 16·MT·warp + 16·mt + g + 8·(e ≥ 2), column 8·nt + 2·t4 + (e & 1).
  float S[MT][4][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * MT * warp + 16 * mt + g + 8 * (e >> 1), c = 8 * nt + 2 * t4 + (e & 1);
        S[mt][nt][e] = Sg[int64_t(r) * D + tile * kTC + c];
      }

  for (int c0 = 0; c0 < n; c0 += kC) {
    const int L = min(kC, n - c0);
    // Q, K chunks [64][D] and the V tile [64][32] (rows ≥ L zero-filled).
    for (int idx = tid; idx < kC * (D / 8); idx += 128) {
      const int r = idx / (D / 8), c = idx % (D / 8);
      const bool ok = r < L;
      const int64_t row = s.start + c0 + (ok ? r : 0);
      cp_async16(base + oQ + SwD::offset(r, c), qg + row * a.ldq + int64_t(h) * D + c * 8, ok ? 16 : 0);
      cp_async16(base + oK + SwD::offset(r, c), kg + row * a.ldk + int64_t(kh) * D + c * 8, ok ? 16 : 0);
    }
    for (int idx = tid; idx < kC * (kTC / 8); idx += 128) {
      const int r = idx / (kTC / 8), c = idx % (kTC / 8);
      const bool ok = r < L;
      const int64_t row = s.start + c0 + (ok ? r : 0);
      cp_async16(base + oV + SwT::offset(r, c), vg + row * a.ldv + int64_t(kh) * D + tile * kTC + c * 8, ok ? 16 : 0);
    }
    cp_async_commit();
    // S_in as bf16 hi + lo, rows = key dim, for the B operand of Q·S.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = 16 * MT * warp + 16 * mt + g + 8 * hr, c = 8 * nt + 2 * t4;
          float h0, l0, h1, l1;
          split_bf16(S[mt][nt][2 * hr], h0, l0);
          split_bf16(S[mt][nt][2 * hr + 1], h1, l1);
          const uint32_t off = SwT::offset(r, c / 8) + (c % 8) * 2;
          *reinterpret_cast<uint32_t*>(sm + oSh + off) = pack_bf16x2(h0, h1);
          *reinterpret_cast<uint32_t*>(sm + oSl + off) = pack_bf16x2(l0, l1);
        }
    cp_async_wait<0>();
    __syncthreads();

    // Q fragments of this warp's 16 token rows.
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      ldsm_x4(qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3],
              base + oQ + SwD::offset(16 * warp + (lane & 15), 2 * ks + (lane >> 4)));
    // A = Q Kᵀ for keys j ≤ 16·warp + 15, then the causal decay.
    float A[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      A[nt][0] = A[nt][1] = A[nt][2] = A[nt][3] = 0.f;
      if (nt <= 2 * warp + 1) {
#pragma unroll
        for (int ks = 0; ks < D / 16; ks += 2) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4(b0, b1, b2, b3, base + oK + SwD::offset(8 * nt + (lane & 7), 2 * ks + (lane >> 3)));
          mma16816(A[nt], qf[ks], b0, b1);
          mma16816(A[nt], qf[ks + 1], b2, b3);
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * warp + g + 8 * (e >> 1), j = 8 * nt + 2 * t4 + (e & 1);
        A[nt][e] = (j <= i && i < L) ? ex[i - j] * A[nt][e] : 0.f;
      }
    }
    // O = ex[i+1]·(Q S_in) + A V.
    float O[4][4];
#pragma unroll
    for (int nd = 0; nd < 4; ++nd) O[nd][0] = O[nd][1] = O[nd][2] = O[nd][3] = 0.f;
    const int mi = lane >> 3;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
      for (int nd = 0; nd < 4; nd += 2) {
        const int r = 16 * ks + (mi & 1) * 8 + (lane & 7), c = nd + (mi >> 1);
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(b0, b1, b2, b3, base + oSh + SwT::offset(r, c));
        mma16816(O[nd], qf[ks], b0, b1);
        mma16816(O[nd + 1], qf[ks], b2, b3);
        ldsm_x4_t(b0, b1, b2, b3, base + oSl + SwT::offset(r, c));
        mma16816(O[nd], qf[ks], b0, b1);
        mma16816(O[nd + 1], qf[ks], b2, b3);
      }
    {
      const float f0 = ex[min(16 * warp + g + 1, kC)], f1 = ex[min(16 * warp + g + 9, kC)];
#pragma unroll
      for (int nd = 0; nd < 4; ++nd) O[nd][0] *= f0, O[nd][1] *= f0, O[nd][2] *= f1, O[nd][3] *= f1;
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (kk > warp) break;
      uint32_t ah[4], al[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float* src = A[2 * kk + (q >> 1)] + 2 * (q & 1);
        float h0, l0, h1, l1;
        split_bf16(src[0], h0, l0);
        split_bf16(src[1], h1, l1);
        ah[q] = pack_bf16x2(h0, h1);
        al[q] = pack_bf16x2(l0, l1);
      }
#pragma unroll
      for (int nd = 0; nd < 4; nd += 2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(b0, b1, b2, b3, base + oV + SwT::offset(16 * kk + (mi & 1) * 8 + (lane & 7), nd + (mi >> 1)));
        mma16816(O[nd], ah, b0, b1);
        mma16816(O[nd + 1], ah, b2, b3);
        mma16816(O[nd], al, b0, b1);
        mma16816(O[nd + 1], al, b2, b3);
      }
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int i = 16 * warp + g + 8 * hr;
      if (i >= L) continue;
      const int64_t row = s.start + c0 + i;
#pragma unroll
      for (int nd = 0; nd < 4; ++nd)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          stf(a.out, a.dt, row * a.ldo + int64_t(h) * D + tile * kTC + 8 * nd + 2 * t4 + e,
              a.scale * O[nd][2 * hr + e]);
    }
    // W = ex[L-1-j]·V[j] as bf16 hi + lo (rows j ≥ L are zero).
    for (int idx = tid; idx < kC * (kTC / 2); idx += 128) {
      const int j = idx / (kTC / 2), c = 2 * (idx % (kTC / 2));
      const uint32_t off = SwT::offset(j, c / 8) + (c % 8) * 2;
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(sm + oV + off));
      const float f = j < L ? ex[L - 1 - j] : 0.f;
      float h0, l0, h1, l1;
      split_bf16(f * v.x, h0, l0);
      split_bf16(f * v.y, h1, l1);
      *reinterpret_cast<uint32_t*>(sm + oWh + off) = pack_bf16x2(h0, h1);
      *reinterpret_cast<uint32_t*>(sm + oWl + off) = pack_bf16x2(l0, l1);
    }
    __syncthreads();
    // S = ex[L]·S + Kᵀ W.
    const float fl = ex[L];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[mt][nt][e] *= fl;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int a0 = 16 * MT * warp + 16 * mt;
        uint32_t kf[4];
        ldsm_x4_t(kf[0], kf[1], kf[2], kf[3],
                  base + oK + SwD::offset(16 * kk + (mi >> 1) * 8 + (lane & 7), a0 / 8 + (mi & 1)));
#pragma unroll
        for (int nd = 0; nd < 4; nd += 2) {
          const int r = 16 * kk + (mi & 1) * 8 + (lane & 7), c = nd + (mi >> 1);
          uint32_t b0, b1, b2, b3;
          ldsm_x4_t(b0, b1, b2, b3, base + oWh + SwT::offset(r, c));
          mma16816(S[mt][nd], kf, b0, b1);
          mma16816(S[mt][nd + 1], kf, b2, b3);
          ldsm_x4_t(b0, b1, b2, b3, base + oWl + SwT::offset(r, c));
          mma16816(S[mt][nd], kf, b0, b1);
          mma16816(S[mt][nd + 1], kf, b2, b3);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * MT * warp + 16 * mt + g + 8 * (e >> 1), c = 8 * nt + 2 * t4 + (e & 1);
        Sg[int64_t(r) * D + tile * kTC + c] = S[mt][nt][e];
      }
}

template <int D>
void chunked_mma_d(const GlaArgs& a, cudaStream_t st) {
  constexpr size_t smem = chunked_mma_smem<D>();
  static bool attr = false;
  if (!attr) {
    SALA_CUDA_CHECK(cudaFuncSetAttribute(gla_chunked_mma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem)));
    attr = true;
  }
  dim3 grid(D / kTC, a.heads, a.n_list);
  gla_chunked_mma_kernel<D><<<grid, 128, smem, st>>>(a);
  SALA_CUDA_LAUNCH("gla_chunked_mma kernel");
}

template <int D>
constexpr int tile_cols() { return D < 32 ? D : 32; }

template <int D>
void recurrent_d(const GlaArgs& a, cudaStream_t st) {
  constexpr int TC = tile_cols<D>();
  dim3 grid(D / TC, a.heads, a.n_list);
  launch_pdl(g_small_pdl, gla_recurrent_kernel<D, TC>, grid, dim3((TC / 4) * (D / 4)), 0, st, a, GlaQkNorms{});
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

bool launch_gla_recurrent_normed(const GlaArgs& a, const GlaQkNorms& n, cudaStream_t st) {
  auto al16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  const bool ok = a.dt == kBF16 && (a.d == 64 || a.d == 128) && a.ldq % 8 == 0 && a.ldk % 8 == 0 && al16(a.q) &&
                  al16(a.k) && n.q_norm && n.k_norm && al16(n.q_norm) && al16(n.k_norm) && (!n.positions || n.inv_freq);
  if (!ok) return false;
  if (a.n_list <= 0) return true;
  if (a.d == 64)
    launch_pdl(g_small_pdl, gla_recurrent_kernel<64, 32, true>, dim3(2, a.heads, a.n_list), dim3(8 * 16), 0, st, a, n);
  else
    launch_pdl(g_small_pdl, gla_recurrent_kernel<128, 32, true>, dim3(4, a.heads, a.n_list), dim3(8 * 32), 0, st, a, n);
  SALA_CUDA_LAUNCH("gla_recurrent kernel (q/k norms)");
  return true;
}

void launch_gla_chunked(const GlaArgs& a, cudaStream_t st) {
  if (a.n_list <= 0) return;
  const bool vec = a.dt == kBF16 && a.ldq % 8 == 0 && a.ldk % 8 == 0 && a.ldv % 8 == 0 &&
                   (reinterpret_cast<uintptr_t>(a.q) & 15) == 0 && (reinterpret_cast<uintptr_t>(a.k) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(a.v) & 15) == 0;
  if (vec && !a.force_fma && (a.d == 64 || a.d == 128))
    return a.d == 64 ? chunked_mma_d<64>(a, st) : chunked_mma_d<128>(a, st);
  switch (a.d) {
    case 16: return chunked_d<16>(a, st);
    case 32: return chunked_d<32>(a, st);
    case 64: return chunked_d<64>(a, st);
    case 128: return chunked_d<128>(a, st);
    default: cuda_fail_msg("lightning_attention: head dim must be 16, 32, 64 or 128 on CUDA", __FILE__, __LINE__);
  }
}

}  // namespace sala::cuda
