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
// Tests and benchmarks: mode 0 off, 1 on, 2 loads only (wrong outputs: what the ring moves without
// the decode); pre ≥ 0 chunks requested before the dependency wait, < 0 the format's default
// (SALA_CUDA_QGEMV_RING_PRE sets the start value); pace ≥ 0 SM cycles between those chunks (with
// programmatic dependent launch), < 0 the format's default (SALA_CUDA_QGEMV_RING_PACE).
void set_qgemv_ring(int mode, int pre, int pace = -1);

}  // namespace sala::cuda
