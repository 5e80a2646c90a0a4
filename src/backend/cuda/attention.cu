// Sparse-layer attention (spec §4.3 dense causal GQA, §4.8 InfLLM-v2 stage 2) over the paged bf16
// K/V cache, flash-attention style: fp32 online softmax (log2 domain), bf16 tensor-core products.
//
// Work: one CTA (4 warps) per item = 16 query rows (G heads × tokens of one KV head, so the
// group's heads share every K/V load) × one split of the item's key chunks. Each warp streams its
// share of 32-key tiles through its own shared-memory slice; the 4 warps merge in shared memory;
// split items (decode) write unnormalised partials merged by attn_combine.
// Prefill (dense_items): one CTA of 4 warps per 4 consecutive token groups of one KV head; the
// CTA loads each 32-key K/V tile once (double-buffered, all 128 threads copy) and every warp uses
// it for its own 16 rows, so K/V traffic is a quarter of the per-warp scheme. Dense: tiles of
// [0, p_max]. InfLLM-v2 (one token per warp): the union of the 4 tokens' selected blocks, each
// warp skipping the blocks it did not select.
// Speed of light:
//   decode, dense, context T, 9B geometry: K+V bytes 2·T·kv_heads·d·2 = 1 KiB per token per layer
//   (T = 32K: 32 MiB → 10 µs at 3.35 TB/s); FLOPs 4·T·H·d = 16 KFLOP/token — bandwidth bound.
//   decode, sparse: ≤ 96 blocks × 64 keys per KV head: ≤ 6 MiB per layer → ~2 µs.
//   prefill, dense, L tokens: FLOPs 2·L²·H·d (causal) = 0.55 TFLOP per layer at L = 8K → tensor
//   cores (mma.sync, ~60% of the 990 TFLOP/s dense peak at best); K/V tiles are re-read per
//   16-row item from L2 in the per-warp kernel; the shared-tile kernel (above) divides that by 4.
// Measured (H200, 2026-11-22, 9B geometry, one layer, including append/compress/select):
//   decode B=1: T=8K dense 17.6 µs, T=32K dense 28.6 µs (28% of copy bandwidth on K/V: launch and
//   split-combine overheads dominate), T=32K InfLLM-v2 66 µs; decode B=8 T=4K 38 µs.
//   prefill chunk of 512: @512 dense 101 µs; @8K InfLLM-v2 0.80 ms; @32K 1.1-1.3 ms.
#include <cmath>

#include "backend/cuda/attn_common.cuh"
#include "backend/decode_splits.h"

namespace sala::cuda {

namespace {

constexpr int kWarps = 4;

// out[i] = v, times sigmoid(gate[i]) when the gate is fused in (SparseArgs::gate): the rounding of
// sigmoid_mul applied to the stored output — the same bits as the separate launch it replaces.
__device__ __forceinline__ void store_out(const SparseArgs& a, int64_t i, float v) {
  if (a.gate) v = rnd(a.dto, v) * rnd(a.dto, 1.0f / (1.0f + expf(-ldf(a.gate, a.dtg, i))));
  stf(a.out, a.dto, i, v);
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32, 1) attention_kernel(SparseArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ float s_m[kWarps][16], s_l[kWarps][16];
  constexpr uint32_t kTile = 32 * D * 2;  // bytes of one 32-row bf16 tile
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The batch metadata (uploaded before the forward) is read before the wait: its dependent loads
  // overlap the previous kernel. q, the selection and the newest keys come after it.
  const AttnItem it = a.items[blockIdx.x];
  const SeqMeta s = a.seqs[it.seq];
  const int32_t* pages = a.pages + s.page_off;
  const PoolGeom& g = a.pool;
  const int row_w = g.kvh * D;
  // Per warp: K0 V0 K1 V1 (double buffer).
  char* my_smem = reinterpret_cast<char*>(smem4) + size_t(warp) * 4 * kTile;
  const uint32_t sbase = smem_addr(my_smem);
  const bf16* kpool = static_cast<const bf16*>(g.k);
  const bf16* vpool = static_cast<const bf16*>(g.v);
  const int64_t layer_rows = int64_t(a.layer) * g.max_pages * g.bs;
  const int gq = lane / 4, t4 = lane % 4;

  // Rows: r → token r / nheads, head head0 + r % nheads (valid while token < ntok).
  const int p0 = s.cached + (it.row0 - s.start);  // position of the item's first token
  int prow[2];
  int64_t qoff[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = gq + 8 * hr;
    const int tok = r / it.nheads, hh = r % it.nheads;
    const bool ok = tok < it.ntok;
    prow[hr] = ok ? p0 + tok : -1;
    qoff[hr] = ok ? int64_t(it.row0 + tok) * a.ldq + int64_t(it.head0 + hh) * D : -1;
  }
  // This warp's chunks, and its tiles of ≤ 32 keys (a sparse block of bs keys is ⌈bs/32⌉ tiles).
  const int cps = (it.nchunks + it.nsplit - 1) / it.nsplit;
  const int cb = it.split * cps, ce = min(cb + cps, it.nchunks);
  const int wc = (max(ce - cb, 0) + kWarps - 1) / kWarps;
  const int wb = cb + warp * wc, we = min(wb + wc, ce);
  const int pend = p0 + it.ntok;  // keys < pend can be seen by some row
  const int32_t* sel = it.sparse ? a.sel + (int64_t(it.sel_item) * g.kvh + it.kvh) * a.kmax : nullptr;
  const int tpb = it.sparse ? (g.bs + 31) / 32 : 1;
  const int ntiles = max(we - wb, 0) * tpb;
  auto tile_range = [&](int idx, int& k0, int& kend) {
    if (it.sparse) {
      const int b = sel[wb + idx / tpb];
      k0 = b * g.bs + 32 * (idx % tpb);
      kend = min(b * g.bs + g.bs, pend);
    } else {
      k0 = 32 * (wb + idx);
      kend = min(k0 + 32, pend);
    }
  };
  // Element offset of this lane's key row in tile idx (-1: none).
  auto lookup = [&](int idx) -> int64_t {
    if (idx >= ntiles) return -1;
    int k0, kend;
    tile_range(idx, k0, kend);
    const int j = k0 + lane;
    if (j >= kend) return -1;
    return (layer_rows + int64_t(pages[j / g.bs]) * g.bs + j % g.bs) * row_w + int64_t(it.kvh) * D;
  };
  auto issue = [&](int buf, int64_t row) {
    issue_rows<D>(sbase + buf * 2 * kTile, lane, row, kpool);
    issue_rows<D>(sbase + buf * 2 * kTile + kTile, lane, row, vpool);
    cp_async_commit();
  };

  // Dense tiles whose keys were all cached before this forward (every one but the tile of the
  // newest keys, which the append kernel just before writes) are requested before the wait: the
  // first two, as many as the double buffer holds — at 4K decode a warp's whole share. Sparse
  // tiles follow the selection of this forward: after it.
  int issued = 0;
  if (!it.sparse)
    while (issued < 2 && issued < ntiles && 32 * (wb + issued) + 32 <= s.cached) {
      issue(issued, lookup(issued));
      ++issued;
    }
  grid_dep_wait();  // launched with PDL in decode (g_small_pdl)
  uint32_t qf[D / 16][4];
  load_q_frags<D>(qf, a.q, a.dtq, qoff[0], qoff[1], lane);

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
  const float sl2 = a.scale * kLog2e;

  // Pipeline: tile t+1 is in flight while tile t is computed; page lookups run one tile ahead
  // of the copies (`pre`: tile `issued`, the next to request).
  if (issued == 0 && ntiles > 0) issue(0, lookup(0)), issued = 1;
  int64_t pre = lookup(issued);
  for (int t = 0; t < ntiles; ++t) {
    if (t + 1 < ntiles) {
      if (t + 1 == issued) issue((t + 1) & 1, pre), pre = lookup(++issued);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncwarp();
    int k0, kend;
    tile_range(t, k0, kend);
    if (k0 < kend) {
      const uint32_t ktile = sbase + (t & 1) * 2 * kTile, vtile = ktile + kTile;
      float sc[4][4];
      qk_tile<D>(sc, qf, ktile, lane);
      softmax_tile<D>(sc, m, l, o, k0, kend, prow, sl2, t4);
      pv_tile<D>(o, sc, vtile, lane);
    }
    __syncwarp();
  }
  l[0] = quad_sum(l[0]);
  l[1] = quad_sum(l[1]);
  // The next kernels (combine, then the o_proj product that starts streaming its weights before its
  // wait) launch once every CTA has its K/V tiles: earlier, that product's weight loads delayed
  // this kernel's (H100, 4K batch 1: −0.02 to −0.04 ms per step in every format, 32K too).
  launch_dependents();

  // Merge the 4 warps: each writes (m, l, o) of its 16 rows to its own shared slice.
  float* so = reinterpret_cast<float*>(my_smem);  // [16][D]
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      so[(gq + 8 * hr) * D + 8 * nd + 2 * t4] = o[nd][2 * hr];
      so[(gq + 8 * hr) * D + 8 * nd + 2 * t4 + 1] = o[nd][2 * hr + 1];
    }
  if (t4 == 0) {
    s_m[warp][gq] = m[0], s_l[warp][gq] = l[0];
    s_m[warp][gq + 8] = m[1], s_l[warp][gq + 8] = l[1];
  }
  __syncthreads();
  const float* all = reinterpret_cast<const float*>(smem4);
  constexpr size_t wstride = 4 * kTile / 4;  // floats per warp slice
  for (int idx = threadIdx.x; idx < 16 * D; idx += kWarps * 32) {
    const int r = idx / D, dc = idx % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_m[w][r]);
    float L = 0.f, O = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(s_m[w][r] - M);
        L += s_l[w][r] * f;
        O += all[w * wstride + r * D + dc] * f;
      }
    }
    if (it.nsplit == 1) {
      const int tok = r / it.nheads, hh = r % it.nheads;
      if (tok < it.ntok)
        store_out(a, int64_t(it.row0 + tok) * a.ldo + int64_t(it.head0 + hh) * D + dc, O / L);
    } else {
      const int64_t slot = it.part + it.split;
      a.partial[(slot * 16 + r) * D + dc] = O;
      if (dc == 0) {
        a.partial_ml[(slot * 16 + r) * 2] = M;
        a.partial_ml[(slot * 16 + r) * 2 + 1] = L;
      }
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32) attention_dense_kernel(SparseArgs a) {
  extern __shared__ float4 smem4[];
  launch_dependents();  // the next kernel may start loading its weights (common.cuh)
  grid_dep_wait();  // launched with PDL in decode (g_small_pdl)
  constexpr uint32_t kTile = 32 * D * 2;
  constexpr int CPR = D / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const AttnItem it = a.dense_items[blockIdx.x];
  const SeqMeta s = a.seqs[it.seq];
  const int32_t* pages = a.pages + s.page_off;
  const PoolGeom& g = a.pool;
  const int row_w = g.kvh * D;
  const uint32_t sbase = smem_addr(smem4);  // K0 V0 K1 V1, then (sparse) block flags and list
  const bf16* kpool = static_cast<const bf16*>(g.k);
  const bf16* vpool = static_cast<const bf16*>(g.v);
  const int64_t layer_rows = int64_t(a.layer) * g.max_pages * g.bs;
  const int gq = lane / 4, t4 = lane % 4;
  const int p0 = s.cached + (it.row0 - s.start);
  const int pend = p0 + it.ntok;
  // This warp's tokens: [w·tpu, min((w+1)·tpu, ntok)).
  const int wt0 = warp * it.tpu, wt1 = min(wt0 + it.tpu, it.ntok);
  const int wlast = wt1 > wt0 ? p0 + wt1 - 1 : -1;  // last position this warp attends from
  int prow[2];
  int64_t qoff[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = gq + 8 * hr;
    const int tok = wt0 + r / it.nheads, hh = r % it.nheads;
    const bool ok = r / it.nheads < it.tpu && tok < wt1;
    prow[hr] = ok ? p0 + tok : -1;
    qoff[hr] = ok ? int64_t(it.row0 + tok) * a.ldq + int64_t(it.head0 + hh) * D : -1;
  }
  uint32_t qf[D / 16][4];
  load_q_frags<D>(qf, a.q, a.dtq, qoff[0], qoff[1], lane);

  // Sparse items (one token per warp): the union of the warps' selected blocks, ascending, each
  // with the mask of the warps that selected it.
  uint32_t* list = reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(smem4) + 4 * kTile);
  int n_union = 0;
  const int tpb = it.sparse ? (g.bs + 31) / 32 : 1;
  if (it.sparse) {
    const int nb = (pend - 1) / g.bs + 1;
    uint32_t* flags = list + 4 * a.kmax;  // [nb]
    __shared__ int s_cnt[kWarps];
    for (int b = tid; b < nb; b += kWarps * 32) flags[b] = 0;
    __syncthreads();
    if (wt1 > wt0) {
      const int32_t* sel = a.sel + (int64_t(it.sel_item + warp) * g.kvh + it.kvh) * a.kmax;
      for (int i = lane; i < it.nchunks; i += 32) atomicOr(&flags[sel[i]], 1u << warp);
    }
    __syncthreads();
    int base = 0;
    for (int b0 = 0; b0 < nb; b0 += kWarps * 32) {
      const int b = b0 + tid;
      const uint32_t f = b < nb ? flags[b] : 0u;
      const uint32_t ballot = __ballot_sync(0xffffffffu, f != 0);
      if (lane == 0) s_cnt[warp] = __popc(ballot);
      __syncthreads();
      int before = base;
      for (int w = 0; w < warp; ++w) before += s_cnt[w];
      if (f) list[before + __popc(ballot & ((1u << lane) - 1u))] = uint32_t(b) | (f << 24);
      for (int w = 0; w < kWarps; ++w) base += s_cnt[w];
      __syncthreads();
    }
    n_union = base;
  }
  const int ntiles = it.sparse ? n_union * tpb : (pend + 31) / 32;
  // Tile t: keys [k0, kend) and the mask of warps that use it.
  auto tile_range = [&](int t, int& k0, int& kend, uint32_t& mask) {
    if (it.sparse) {
      const uint32_t e = list[t / tpb];
      const int b = int(e & 0xFFFFFFu);
      k0 = b * g.bs + 32 * (t % tpb);
      kend = min(b * g.bs + g.bs, pend);
      mask = e >> 24;
    } else {
      k0 = 32 * t;
      kend = min(k0 + 32, pend);
      mask = 0xFu;
    }
  };
  auto issue = [&](int buf, int t) {
    int k0, kend;
    uint32_t mask;
    tile_range(t, k0, kend, mask);
    const uint32_t kt = sbase + buf * 2 * kTile, vt = kt + kTile;
    for (int idx = tid; idx < 32 * CPR; idx += kWarps * 32) {
      const int r = idx / CPR, c = idx % CPR;
      const int j = k0 + r;
      const bool ok = j < kend;
      const int64_t row =
          ok ? (layer_rows + int64_t(pages[j / g.bs]) * g.bs + j % g.bs) * row_w + int64_t(it.kvh) * D + c * 8 : 0;
      cp_async16(kt + RowSwizzle<D>::offset(r, c), kpool + row, ok ? 16 : 0);
      cp_async16(vt + RowSwizzle<D>::offset(r, c), vpool + row, ok ? 16 : 0);
    }
    cp_async_commit();
  };

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
  const float sl2 = a.scale * kLog2e;
  if (ntiles > 0) issue(0, 0);
  for (int t = 0; t < ntiles; ++t) {
    if (t + 1 < ntiles) {
      issue((t + 1) & 1, t + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    int k0, kend;
    uint32_t mask;
    tile_range(t, k0, kend, mask);
    if (k0 < kend && k0 <= wlast && (mask >> warp & 1u)) {
      const uint32_t ktile = sbase + (t & 1) * 2 * kTile, vtile = ktile + kTile;
      float sc[4][4];
      qk_tile<D>(sc, qf, ktile, lane);
      softmax_tile<D>(sc, m, l, o, k0, kend, prow, sl2, t4);
      pv_tile<D>(o, sc, vtile, lane);
    }
    __syncthreads();
  }
  l[0] = quad_sum(l[0]);
  l[1] = quad_sum(l[1]);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    if (prow[hr] < 0) continue;
    const int r = gq + 8 * hr;
    const int64_t base = int64_t(it.row0 + wt0 + r / it.nheads) * a.ldo + int64_t(it.head0 + r % it.nheads) * D;
    const float inv = 1.0f / l[hr];
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      store_out(a, base + 8 * nd + 2 * t4, o[nd][2 * hr] * inv);
      store_out(a, base + 8 * nd + 2 * t4 + 1, o[nd][2 * hr + 1] * inv);
    }
  }
}

// Merges the splits of one (unit, row): grid (units with splits, 16 rows), 256 threads. Thread
// (split group, float4 column) reads every kSG-th split, so all loads are in flight at once.
constexpr int kCombineThreads = 256;

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float x = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, x) : v + x;
  }
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = is_max ? -INFINITY : 0.f;
#pragma unroll
  for (int w = 0; w < kCombineThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  __syncthreads();
  return r;
}

template <int D>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(SparseArgs a) {
  launch_dependents();  // the next kernel may start loading its weights (common.cuh)
  constexpr int Q = D / 4;                    // float4 per row
  constexpr int SG = kCombineThreads / Q;     // split groups
  __shared__ float w[kMaxDecodeSplits];
  __shared__ float red[kCombineThreads / 32];
  __shared__ float4 acc[SG][Q];
  const AttnItem it = a.items[a.combine_items[blockIdx.x]];  // batch metadata: before the wait
  const int r = blockIdx.y;
  const int tok = r / it.nheads, hh = r % it.nheads;
  if (tok >= it.ntok) return;
  grid_dep_wait();  // launched with PDL in decode (g_small_pdl)
  const int tid = threadIdx.x, ns = it.nsplit;
  const int64_t part = it.part;
  // Every load at once — the split's (max, sum) and this thread's columns of its splits — so the
  // partials cost one L2 round trip, not two (the weights need the reductions first).
  const float ms = tid < ns ? a.partial_ml[((part + tid) * 16 + r) * 2] : -INFINITY;
  const float ls = tid < ns ? a.partial_ml[((part + tid) * 16 + r) * 2 + 1] : 0.f;
  const int q = tid % Q, sg = tid / Q;
  constexpr int kPer = (kMaxDecodeSplits + SG - 1) / SG;  // splits per thread
  float4 v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int sp = sg + i * SG;
    v[i] = sp < ns ? reinterpret_cast<const float4*>(a.partial + ((part + sp) * 16 + r) * D)[q]
                   : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const float M = block_reduce(ms, red, true);
  const float f = (tid < ns && ms != -INFINITY) ? exp2f(ms - M) : 0.f;
  if (tid < ns) w[tid] = f;
  const float L = block_reduce(f * ls, red, false);  // (its barrier also publishes w)
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int sp = sg + i * SG;
    if (sp >= ns) break;
    const float ws = w[sp];
    o.x += v[i].x * ws, o.y += v[i].y * ws, o.z += v[i].z * ws, o.w += v[i].w * ws;
  }
  acc[sg][q] = o;
  __syncthreads();
  if (tid < Q) {
    float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int g2 = 0; g2 < SG; ++g2) {
      const float4 v = acc[g2][tid];
      t.x += v.x, t.y += v.y, t.z += v.z, t.w += v.w;
    }
    const int64_t base = int64_t(it.row0 + tok) * a.ldo + int64_t(it.head0 + hh) * D + 4 * tid;
    store_out(a, base, t.x / L);
    store_out(a, base + 1, t.y / L);
    store_out(a, base + 2, t.z / L);
    store_out(a, base + 3, t.w / L);
  }
}

template <int D>
void attention_d(const SparseArgs& a, cudaStream_t st) {
  constexpr size_t smem = size_t(kWarps) * 4 * 32 * D * 2;
  // Shared-tile kernel: K/V double buffer + (sparse) union list [4·kmax] + block flags [max_blocks].
  const size_t smem_dense =
      size_t(4) * 32 * D * 2 + (a.max_blocks > 0 ? size_t(4) * a.kmax * 4 + size_t(a.max_blocks) * 4 : 0);
  static bool attr = false;
  static size_t dense_attr = 48 * 1024;
  if (!attr) {
    SALA_CUDA_CHECK(
        cudaFuncSetAttribute(attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = true;
  }
  if (smem_dense > dense_attr) {
    SALA_CUDA_CHECK(cudaFuncSetAttribute(attention_dense_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem_dense)));
    dense_attr = smem_dense;
  }
  if (a.n_dense_items > 0) {
    launch_pdl(g_small_pdl, attention_dense_kernel<D>, dim3(unsigned(a.n_dense_items)), dim3(kWarps * 32), smem_dense,
               st, a);
    SALA_CUDA_LAUNCH("attention dense kernel");
  }
  if (a.n_items <= 0) return;
  launch_pdl(g_small_pdl, attention_kernel<D>, dim3(unsigned(a.n_items)), dim3(kWarps * 32), smem, st, a);
  SALA_CUDA_LAUNCH("attention kernel");
  if (a.n_combine > 0) {
    launch_pdl(g_small_pdl, combine_kernel<D>, dim3(unsigned(a.n_combine), 16), dim3(kCombineThreads), 0, st, a);
    SALA_CUDA_LAUNCH("attention combine kernel");
  }
}

}  // namespace

void launch_attention(const SparseArgs& a, cudaStream_t st) {
  if (a.n_items <= 0 && a.n_dense_items <= 0) return;
  switch (a.pool.d) {
    case 16: return attention_d<16>(a, st);
    case 32: return attention_d<32>(a, st);
    case 64: return attention_d<64>(a, st);
    case 128: return attention_d<128>(a, st);
    default: cuda_fail_msg("sparse_attention: head dim must be 16, 32, 64 or 128 on CUDA", __FILE__, __LINE__);
  }
}

}  // namespace sala::cuda
