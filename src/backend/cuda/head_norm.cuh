// Per-head q/k RMSNorm and RoPE by a half-warp: the arithmetic of the standalone decode kernel
// (elementwise.cu: qk_norm_rope_bf16) and of the recurrent GLA kernel's prologue (gla.cu), in one
// place so that both give the same bits.
#pragma once
#include "backend/cuda/common.cuh"

namespace sala::cuda {

// What a lane needs besides its 8 values: its piece of the norm weight and, for RoPE, the
// rotation at the token's position. None of it is written by earlier kernels (weights, batch
// metadata), so kernels compute it before their dependency wait: the loads and sincos overlap
// the previous kernel instead of following the reduction.
struct HeadNormLane {
  float w[8];
  float cs[8], sn[8];
};

// Lane `lane` (< head_dim / 8: 8 values each; half the lanes hold each half of the head).
__device__ __forceinline__ void head_norm_angles(HeadNormLane& c, int head_dim, float pos, const float* inv_freq,
                                                 int lane) {
  const int hl = head_dim / 16;  // lanes per half of the head
#pragma unroll
  for (int j = 0; j < 8; ++j) sincosf(pos * inv_freq[(lane < hl ? lane : lane - hl) * 8 + j], &c.sn[j], &c.cs[j]);
}
__device__ __forceinline__ HeadNormLane head_norm_lane(const bf16* w, int head_dim, float pos, const float* inv_freq,
                                                       int lane) {
  HeadNormLane c;
  const bool has = lane < head_dim / 8;
  if (has) unpack8(reinterpret_cast<const uint4*>(w)[lane], c.w);
  if (has && inv_freq) head_norm_angles(c, head_dim, pos, inv_freq, lane);
  return c;
}

// Per-head RMSNorm (+ rotate-half RoPE when rope) of one head row by a half-warp. f: the lane's
// values as loaded (zeros for idle lanes); returns them normalised, rotated and rounded to bf16.
__device__ __forceinline__ void norm_rope_half_warp(float (&f)[8], const HeadNormLane& c, int head_dim, float eps,
                                                    bool rope, int lane, unsigned mask) {
  const int n8 = head_dim / 8;
  const bool has = lane < n8;
  float ss = 0.f;
  if (has)
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) ss += __shfl_xor_sync(mask, ss, o, 16);
  const float inv = 1.0f / sqrtf(ss / float(head_dim) + eps);
  if (has)
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = rbf(rbf(f[j] * inv) * c.w[j]);
  if (rope) {
    const int hl = n8 / 2;  // lanes per half of the head
    const int partner = lane < hl ? lane + hl : lane - hl;
    float pf[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) pf[j] = __shfl_sync(mask, f[j], partner, 16);
    if (has)
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = lane < hl ? f[j] * c.cs[j] - pf[j] * c.sn[j] : f[j] * c.cs[j] + pf[j] * c.sn[j];
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = rbf(f[j]);  // as stored by pack8
}

}  // namespace sala::cuda
