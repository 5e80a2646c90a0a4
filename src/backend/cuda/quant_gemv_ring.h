// The one-row decode GEMV of packed weights fed through a shared-memory ring by the bulk copy
// engine (quant_gemv_ring.cu); launch_qgemv_set and launch_qgemv_act take it where it applies.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace sala::cuda {

// Whether the ring GEMV takes this launch: sm_90, N = 1, in ≤ 16384, 16-byte aligned codes and
// parameters, and int4 in groups of 64..2048 that divide 2048 with in a multiple of 2048, or
// fp8 / int8 per row or int8 in groups of 32..1024 that divide 1024 (MLX 8-bit) with in a
// multiple of 1024; not switched off (SALA_CUDA_QGEMV_RING=0,
// SALA_CUDA_QGEMV_RING_FORMATS: bit 0 int4, bit 1 8-bit; set_qgemv_ring(0, ...)).
bool qgemv_ring_applies(const QGemvSet& set, int N);
// y = x·Wᵀ for each part (one row x; y bf16 or f32).
void launch_qgemv_ring(const QGemvSet& set, const void* x, bool y_f32, bool trigger, bool pdl, cudaStream_t st);
// The MLP pair as launch_qgemv_act lays it out (part 0 gate, its y the activation; part 1 up):
// act = bf16(silu(bf16(x·gateᵀ)))·bf16(x·upᵀ) rounded to bf16, as the unfused ring GEMV + silu_mul.
void launch_qgemv_ring_act(const QGemvSet& set, const void* x, bool trigger, bool pdl, cudaStream_t st);
// The residual update and RMSNorm a ring launch can take before its product (bf16 rows of `in`
// values): h' = h + bf16(α·a), x = rmsnorm(h')·w — add_rmsnorm's values bit for bit — with h' and
// x stored (by CTA `writer`, after every CTA has read h; the launcher picks it) and the product
// taken of x. counter: a device int, 0 between launches (each launch leaves it 0).
struct RingNorm {
  void* h;
  const void* a;
  float alpha;
  const void* w;
  void* x;
  float eps;
  int* counter;
  int writer = 0;
};
// Whether launch_qgemv_ring_norm / _norm_act take the set with a norm of `in` columns: the ring
// applies and in lies in add_rmsnorm's wide range (1024..16384), unless SALA_CUDA_RING_NORM=0.
bool qgemv_ring_norm_applies(const QGemvSet& set, int N);
// launch_qgemv_ring / launch_qgemv_ring_act of x = the norm's output, computed in the launch.
void launch_qgemv_ring_norm(const QGemvSet& set, const RingNorm& norm, bool y_f32, bool trigger, bool pdl,
                            cudaStream_t st);
void launch_qgemv_ring_norm_act(const QGemvSet& set, const RingNorm& norm, bool trigger, bool pdl, cudaStream_t st);
// Tests and benchmarks: the norm's fusion on or off (SALA_CUDA_RING_NORM sets the start value), and
// how many fused launches have been issued (recorded into graphs included).
void set_qgemv_ring_norm(bool on);
int64_t qgemv_ring_norm_launches();
// Tests and benchmarks: mode 0 off, 1 on, 2 loads only (wrong outputs: what the ring moves without
// the decode); pre ≥ 0 chunks requested before the dependency wait, < 0 the format's default
// (SALA_CUDA_QGEMV_RING_PRE sets the start value).
void set_qgemv_ring(int mode, int pre);

}  // namespace sala::cuda
