// Per-head q/k RMSNorm and RoPE by a half-warp: the arithmetic of the standalone decode kernel
// (elementwise.cu: qk_norm_rope_bf16) and of the fused GLA decode step's prologue (gla.cu), in one
// place so that both give the same bits.
#pragma once
#include "backend/cuda/common.cuh"

namespace sala::cuda {

// Per-head RMSNorm (+ rotate-half RoPE when inv_freq) of one head row by a half-warp, 8 values per
// lane (lane < head_dim / 8): qk_norm_rope_bf16's arithmetic, shared with it. x: the row's values
// as loaded (f[8], zeros for idle lanes); returns the normalised, rotated values rounded to bf16.
__device__ __forceinline__ void norm_rope_half_warp(float (&f)[8], const bf16* w, int head_dim, float eps, float pos,
                                                    const float* inv_freq, int lane, unsigned mask) {
  const int n8 = head_dim / 8;
  const bool has = lane < n8;
  float ss = 0.f;
  if (has)
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) ss += __shfl_xor_sync(mask, ss, o, 16);
  const float inv = 1.0f / sqrtf(ss / float(head_dim) + eps);
  if (has) {
    float g[8];
    unpack8(reinterpret_cast<const uint4*>(w)[lane], g);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = rbf(rbf(f[j] * inv) * g[j]);
  }
  if (inv_freq) {
    const int hl = n8 / 2;  // lanes per half of the head
    const int partner = lane < hl ? lane + hl : lane - hl;
    float pf[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) pf[j] = __shfl_sync(mask, f[j], partner, 16);
    if (has) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = (lane < hl ? lane : lane - hl) * 8 + j;  // index within the half
        float sn, cs;
        sincosf(pos * inv_freq[i], &sn, &cs);
        f[j] = lane < hl ? f[j] * cs - pf[j] * sn : f[j] * cs + pf[j] * sn;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = rbf(f[j]);  // as stored by pack8
}

}  // namespace sala::cuda
