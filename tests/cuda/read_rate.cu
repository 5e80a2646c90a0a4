// SALA_BENCH_ONLY=read-rate (sala_cuda_tests --bench, cuda_bench.cpp times it): how fast one
// decode product's bytes stream with nothing but loads, by schedule. In a 4K batch-1 step the
// packed fp8 gate/up GEMV (1024 CTAs of 128 KB, 4 per SM: 1.94 waves) moves ~2.85 TB/s where
// bf16's (8192 CTAs of 32 KB: 7.8 waves) moves ~3.07 (bench/results/2026-11-26-h100-decode-
// experiments.md); this separates the schedule from the decode work.
//
// A tile is 1 KB (each lane of a warp loads two 16-byte pieces, as the packed GEMV's two row
// blocks); a CTA of 8 warps owns tiles [c·T/C, (c+1)·T/C) of the T tiles, its warps take them in
// turn with STAGES tiles per warp in flight, the first STAGES requested before the dependency
// wait (griddepcontrol, as the GEMVs). The bytes are xor-ed so the loads stay.
#include <cstdint>

#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/quant_decode.cuh"

namespace sala::cuda {

namespace {

constexpr int kWarps = 8;

template <int STAGES>
__global__ void __launch_bounds__(kWarps * 32, 4) read_tiles_kernel(const uint4* __restrict__ buf, int64_t tiles,
                                                                   uint32_t* sink) {
  const int64_t C = gridDim.x, c = blockIdx.x;
  const int64_t t0 = tiles * c / C, t1 = tiles * (c + 1) / C;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  uint4 ring[STAGES][2];
  int64_t next = t0 + warp;
  auto load = [&](uint4 (&r)[2]) {
    if (next < t1) {
      r[0] = ld_stream(buf + next * 64 + lane);
      r[1] = ld_stream(buf + next * 64 + 32 + lane);
    }
    next += kWarps;
  };
#pragma unroll
  for (int s = 0; s < STAGES; ++s) load(ring[s]);
  grid_dep_wait();
  launch_dependents();
  uint32_t acc = 0;
  for (int64_t t = t0 + warp; t < t1; t += int64_t(kWarps) * STAGES) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      if (t + int64_t(kWarps) * s >= t1) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) acc ^= ring[s][h].x ^ ring[s][h].y ^ ring[s][h].z ^ ring[s][h].w;
      load(ring[s]);
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // practically never: keeps the loads
}

}  // namespace

// One read of `bytes` (a multiple of 1 KB) by `ctas` CTAs with `stages` (2 or 4) tiles per warp in flight.
void launch_read_tiles(const void* buf, int64_t bytes, int ctas, int stages, uint32_t* sink, cudaStream_t st) {
  const int64_t tiles = bytes / 1024;
  auto* p = static_cast<const uint4*>(buf);
  if (stages == 4) launch_pdl(true, read_tiles_kernel<4>, dim3(unsigned(ctas)), dim3(kWarps * 32), 0, st, p, tiles, sink);
  else launch_pdl(true, read_tiles_kernel<2>, dim3(unsigned(ctas)), dim3(kWarps * 32), 0, st, p, tiles, sink);
  SALA_CUDA_LAUNCH("read_tiles_kernel");
}

}  // namespace sala::cuda
