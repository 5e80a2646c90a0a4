// Sparse-layer cache maintenance: append the call's k/v rows to their pages, then build the K1/K2
// compressed keys completed by the call (spec §4.4: mean over the window in fp32, stored bf16).
//
// Speed of light: append moves 2 · N · kv_heads·d · 2 bytes (N = new tokens): 1 KiB per token per
// layer for the 9B geometry — trivial. Compression reads ks (K1) or 4ks (K2) rows per new chunk:
// per token on average 2 K1 rows + 2 K2 rows read (L2-resident, just written) — also trivial.
// Both kernels are launch-latency bound in decode (~2-3 µs each).
// Not timed separately: included in the sparse-layer numbers of attention.cu / docs/cuda-backend.md.
#include "backend/cuda/common.cuh"

namespace sala::cuda {

namespace {

__global__ void append_bf16x8(uint4* kpool, uint4* vpool, const uint4* k, const uint4* v, int64_t ldk8, int64_t ldv8,
                              const int64_t* row_dst, int64_t n_rows, int row8, int64_t layer_rows) {
  launch_dependents();  // the next kernel may start loading its weights (common.cuh)
  const int64_t total = n_rows * row8, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  auto dst_of = [&](int64_t idx) { return (layer_rows + row_dst[idx / row8]) * row8 + idx % row8; };
  const int64_t dst_first = first < total ? dst_of(first) : 0;  // batch metadata: before the wait
  grid_dep_wait();  // launched with PDL in decode (g_small_pdl)
  for (int64_t idx = first; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / row8, e = idx % row8;
    const int64_t dst = idx == first ? dst_first : dst_of(idx);
    kpool[dst] = k[r * ldk8 + e];
    vpool[dst] = v[r * ldv8 + e];
  }
}

__global__ void append_generic(bf16* kpool, bf16* vpool, const void* k, const void* v, int dt, int64_t ldk,
                               int64_t ldv, const int64_t* row_dst, int64_t n_rows, int row, int64_t layer_rows) {
  const int64_t total = n_rows * row;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / row, e = idx % row;
    const int64_t dst = (layer_rows + row_dst[r]) * row + e;
    kpool[dst] = __float2bfloat16_rn(ldf(k, dt, r * ldk + e));
    vpool[dst] = __float2bfloat16_rn(ldf(v, dt, r * ldv + e));
  }
}

// One CTA (256 threads) per job. The row's kv_heads·d values are 16-byte groups; the threads are
// (token lane, group) pairs, each token lane summing every TL-th token of the window with all its
// loads independent, then the token lanes are added in a fixed order (deterministic).
constexpr int kCompressThreads = 256;

__global__ void __launch_bounds__(kCompressThreads) compress_kernel(PoolGeom pool, int layer, const CompressJob* jobs,
                                                                    const SeqMeta* seqs, const int32_t* pages) {
  __shared__ float part[kCompressThreads * 8];
  launch_dependents();  // the next kernel may start loading its weights (common.cuh)
  grid_dep_wait();  // launched with PDL in decode (g_small_pdl)
  const CompressJob job = jobs[blockIdx.x];
  const SeqMeta s = seqs[job.seq];
  const int row = pool.kvh * pool.d;
  const int groups = row / 8;
  const int TL = groups >= kCompressThreads ? 1 : kCompressThreads / groups;
  const int tid = threadIdx.x;
  const int tl = tid / groups, grp = tid % groups;  // (for groups ≥ 256: tl = 0 and a group loop)
  const bf16* kp = static_cast<const bf16*>(pool.k);
  const int64_t layer_rows = int64_t(layer) * pool.max_pages * pool.bs;
  const int pp = job.level == 1 ? pool.k1pp : pool.k2pp;
  bf16* dst = static_cast<bf16*>(job.level == 1 ? pool.k1 : pool.k2) +
              (int64_t(layer) * pool.max_pages * pp + job.dst_row) * row;
  for (int g0 = 0; g0 < groups; g0 += kCompressThreads) {
    const int gg = TL == 1 ? g0 + tid : grp;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (tl < TL && gg < groups) {
#pragma unroll 4
      for (int j = job.first + tl; j < job.first + job.window; j += TL) {
        const int64_t prow = layer_rows + int64_t(pages[s.page_off + j / pool.bs]) * pool.bs + j % pool.bs;
        float f[8];
        unpack8(*reinterpret_cast<const uint4*>(kp + prow * row + gg * 8), f);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += f[e];
      }
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < 8; ++e) part[tid * 8 + e] = acc[e];
    __syncthreads();
    // Thread (group, element) adds the token lanes in order.
    for (int idx = tid; idx < (TL == 1 ? kCompressThreads : groups) * 8; idx += kCompressThreads) {
      const int g = idx / 8, e = idx % 8;
      const int og = TL == 1 ? g0 + g : g;
      if (og >= groups) continue;
      float sum = 0.f;
      for (int t = 0; t < TL; ++t) sum += part[(TL == 1 ? g : t * groups + g) * 8 + e];
      dst[og * 8 + e] = __float2bfloat16_rn(sum / float(job.window));
    }
  }
}

}  // namespace

void launch_append_kv(const PoolGeom& pool, int layer, const void* k, const void* v, Dt dt, int64_t ldk, int64_t ldv,
                      const int64_t* row_dst, int64_t n_rows, cudaStream_t st) {
  if (n_rows <= 0) return;
  const int row = pool.kvh * pool.d;
  const int64_t layer_rows = int64_t(layer) * pool.max_pages * pool.bs;
  const auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  if (dt == kBF16 && row % 8 == 0 && ldk % 8 == 0 && ldv % 8 == 0 && al(k) && al(v)) {
    launch_pdl(g_small_pdl, append_bf16x8, dim3(grid_for(n_rows * row / 8, 256)), dim3(256), 0, st,
        static_cast<uint4*>(pool.k), static_cast<uint4*>(pool.v), static_cast<const uint4*>(k),
        static_cast<const uint4*>(v), ldk / 8, ldv / 8, row_dst, n_rows, row / 8, layer_rows);
  } else {
    append_generic<<<grid_for(n_rows * row, 256), 256, 0, st>>>(static_cast<bf16*>(pool.k), static_cast<bf16*>(pool.v),
                                                                k, v, dt, ldk, ldv, row_dst, n_rows, row, layer_rows);
  }
  SALA_CUDA_LAUNCH("append_kv kernel");
}

void launch_compress(const PoolGeom& pool, int layer, const CompressJob* jobs, int n_jobs, const SeqMeta* seqs,
                     const int32_t* pages, cudaStream_t st) {
  if (n_jobs <= 0) return;
  SALA_CUDA_REQUIRE((pool.kvh * pool.d) % 8 == 0, "compress: kv_heads·head_dim must be a multiple of 8");
  launch_pdl(g_small_pdl, compress_kernel, dim3(unsigned(n_jobs)), dim3(kCompressThreads), 0, st, pool, layer, jobs,
             seqs, pages);
  SALA_CUDA_LAUNCH("compress kernel");
}

}  // namespace sala::cuda
