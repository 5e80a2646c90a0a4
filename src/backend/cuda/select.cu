// InfLLM-v2 block selection for the sparse regime, spec §4.5–4.7: stage-1 scores (compressed LSE:
// K2 log-sum-exp normaliser, K1 numerators, summed over the group's heads in fp32, rounded to bf16),
// pooling to blocks with forced init/local blocks, deterministic top-K (score desc, index asc, past
// blocks only). One CTA of 8 warps per (query token, KV head); the warps split the key tiles.
//
// Speed of light per (token, KV head) at context T (d = 128, G = 16):
//   FLOPs 2·G·d·(n2 + ncol) ≈ 4096·(T/64 + T/16): T = 32K → 10.5 MFLOP (tensor cores).
//   Bytes (K1 + K2 rows, bf16) 256·(T/16 + T/64): T = 32K → 655 KB per KV head.
//   Decode (2 KV heads): ~1.3 MB per layer at 32K → ~0.4 µs of bandwidth; latency bound in practice
//   (8 warps per CTA split the tiles, two tiles in flight per warp).
//   Prefill: every token re-reads its K1/K2 columns (no sharing between tokens yet).
// Top-K: threshold found by a 32-step bisection on unique 32-bit keys (bf16 score bits, block
// index), then ascending compaction with ballots — exact and deterministic.
// Measured (H200, 2026-11-22): the whole InfLLM-v2 decode step of one layer at T = 32K (append,
// compress, selection, stage 2, 2 KV heads) 66 µs; selection lists are checked bit-exactly
// against a host recomputation from the GPU's own K1/K2 in sala_cuda_tests.
#include <cmath>

#include "backend/cuda/attn_common.cuh"

namespace sala::cuda {

namespace {

constexpr int kWarps = 8;       // warps of a scoring CTA; they split the key tiles
constexpr int kTopkThreads = 512;
constexpr int kTopkSmemKeys = 16384;  // block keys held in shared memory by the split path's top-K

__device__ __forceinline__ uint32_t block_key(float score, int k) {
  uint32_t u = __float_as_uint(score);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (u & 0xFFFF0000u) | (0xFFFFu - uint32_t(k));
}

// Streams this warp's 32-row tiles t0 + warp, t0 + warp + kWarps, ... (< t1) of rows 0..n-1
// (element offsets from rowof) through its double buffer; consume(first row, rows in tile,
// 16 × 32 products q·rowᵀ).
template <int D, typename RowOf, typename Consume>
__device__ __forceinline__ void stream_tiles(const uint32_t (&qf)[D / 16][4], uint32_t sbase, int warp, int lane,
                                             int t0, int t1, int n, const bf16* base, RowOf rowof, Consume consume) {
  constexpr uint32_t kTile = 32 * D * 2;
  const int span = t1 - t0;
  const int ntiles = span > warp ? (span - warp + kWarps - 1) / kWarps : 0;
  auto lookup = [&](int i) -> int64_t {
    const int c = 32 * (t0 + warp + kWarps * i) + lane;
    return (i < ntiles && c < n) ? rowof(c) : int64_t(-1);
  };
  if (ntiles > 0) {
    issue_rows<D>(sbase, lane, lookup(0), base);
    cp_async_commit();
  }
  int64_t pre = lookup(1);
  for (int i = 0; i < ntiles; ++i) {
    if (i + 1 < ntiles) {
      issue_rows<D>(sbase + ((i + 1) & 1) * kTile, lane, pre, base);
      cp_async_commit();
      pre = lookup(i + 2);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncwarp();
    float sc[4][4];
    qk_tile<D>(sc, qf, sbase + (i & 1) * kTile, lane);
    __syncwarp();
    const int first = 32 * (t0 + warp + kWarps * i);
    consume(first, min(32, n - first), sc);
  }
}

// Tiles [t0, t1) of split `split` of S over n rows.
__device__ __forceinline__ void split_range(int n, int split, int S, int& t0, int& t1) {
  const int nt = (n + 31) / 32;
  t0 = int(int64_t(nt) * split / S);
  t1 = int(int64_t(nt) * (split + 1) / S);
}

// Pass 1 over K2 tiles [t0, t1): per-lane (max, sum) in the log2 domain of rows gq and gq + 8.
template <int D>
__device__ __forceinline__ void lse_tiles(const SparseArgs& a, const SelItem& it, const int32_t* pages, int h,
                                          const uint32_t (&qf)[D / 16][4], uint32_t sbase, int warp, int lane, int t0,
                                          int t1, float (&m)[2], float (&l)[2]) {
  const PoolGeom& g = a.pool;
  const int64_t row_w = int64_t(g.kvh) * D;
  const float sl2 = a.scale * kLog2e;
  const int t4 = lane % 4;
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.f;
  stream_tiles<D>(
      qf, sbase, warp, lane, t0, t1, it.vis2, static_cast<const bf16*>(g.k2),
      [&](int c) { return chunk_row(g, a.layer, pages, c, 4 * g.st, g.k2pp) * row_w + h * D; },
      [&](int, int nv, float(&sc)[4][4]) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = 8 * nt + 2 * t4 + e;
              const float x = col < nv ? sc[nt][2 * hr + e] * sl2 : -INFINITY;
              sc[nt][2 * hr + e] = x;
              mx = fmaxf(mx, x);
            }
          mx = quad_max(mx);
          const float mn = fmaxf(m[hr], mx);
          float sum = 0.f;
          if (mn != -INFINITY) {
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) sum += exp2f(sc[nt][2 * hr + e] - mn);
            l[hr] = l[hr] * exp2f(m[hr] - mn) + quad_sum(sum);
          }
          m[hr] = mn;
        }
      });
}

// Merges the warps' (m, l) of 16 rows through shared memory: (M, L) of row r in s_ml[0][r].
__device__ __forceinline__ void merge_warps(float (*s_ml)[16][2], int warp, int lane, const float (&m)[2],
                                            const float (&l)[2]) {
  const int gq = lane / 4;
  if (lane % 4 == 0) {
    s_ml[warp][gq][0] = m[0], s_ml[warp][gq][1] = l[0];
    s_ml[warp][gq + 8][0] = m[1], s_ml[warp][gq + 8][1] = l[1];
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int row = threadIdx.x;
    float M = -INFINITY, L = 0.f;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_ml[w][row][0]);
    if (M != -INFINITY)
      for (int w = 0; w < kWarps; ++w) L += s_ml[w][row][1] * exp2f(s_ml[w][row][0] - M);
    s_ml[kWarps][row][0] = M, s_ml[kWarps][row][1] = L;
  }
  __syncthreads();
}

// Pass 2 over K1 tiles [t0, t1): column sums over the group's rows of exp2(s·q·K1 − Λ), Λ per row
// (lam[hr] for row gq + 8·hr); each column belongs to one warp (written, or added for hb > 0).
template <int D>
__device__ __forceinline__ void colsum_tiles(const SparseArgs& a, const SelItem& it, const int32_t* pages, int h,
                                             const uint32_t (&qf)[D / 16][4], uint32_t sbase, int warp, int lane,
                                             int t0, int t1, int hb, int nrows, const float (&lam)[2], float* cs) {
  const PoolGeom& g = a.pool;
  const int64_t row_w = int64_t(g.kvh) * D;
  const float sl2 = a.scale * kLog2e;
  const int gq = lane / 4, t4 = lane % 4;
  stream_tiles<D>(
      qf, sbase, warp, lane, t0, t1, it.ncol, static_cast<const bf16*>(g.k1),
      [&](int c) { return chunk_row(g, a.layer, pages, c, g.st, g.k1pp) * row_w + h * D; },
      [&](int base, int nv, float(&sc)[4][4]) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float colsum = 0.f;
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
              const int row = gq + 8 * hr;
              if (row < nrows) colsum += it.vis2 > 0 ? exp2f(sc[nt][2 * hr + e] * sl2 - lam[hr]) : INFINITY;
            }
            colsum += __shfl_xor_sync(0xffffffffu, colsum, 4);
            colsum += __shfl_xor_sync(0xffffffffu, colsum, 8);
            colsum += __shfl_xor_sync(0xffffffffu, colsum, 16);
            const int col = 8 * nt + 2 * t4 + e;
            if (gq == 0 && col < nv) {
              if (hb == 0)
                cs[base + col] = colsum;
              else
                cs[base + col] += colsum;
            }
          }
      });
}

// The nsel-th largest of nb unique keys (1 ≤ nsel ≤ nb): radix select on 8-bit digits, most
// significant first — 4 passes over the keys with a shared histogram (warp-aggregated atomics).
__device__ uint32_t kth_largest_key(const uint32_t* keys, int nb, int nsel) {
  __shared__ int hist[256];
  __shared__ int s_pick[2];
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0, mask = 0;
  int need = nsel;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int base = 0; base < nb; base += blockDim.x) {  // uniform trip count: whole warps below
      const int k = base + int(threadIdx.x);
      const bool in = k < nb && (keys[k] & mask) == prefix;
      const uint32_t digit = in ? (keys[k] >> shift) & 255u : 256u;
      const uint32_t peers = __match_any_sync(0xffffffffu, digit);
      if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // bins from the top: lane l holds bins 255 − 8l − j, j < 8
      int c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += c[j] = hist[255 - 8 * lane - j];
      int incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
      }
      int acc = incl - sum;
      if (acc < need && need <= incl) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (acc + c[j] >= need) {
            s_pick[0] = 255 - 8 * lane - j, s_pick[1] = acc;
            break;
          }
          acc += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= uint32_t(s_pick[0]) << shift;
    mask |= 255u << shift;
    need -= s_pick[1];
    __syncthreads();
  }
  return prefix;
}

// Pooling of the chunk scores to blocks with the forced init/local blocks, then the top-K list in
// ascending block order (spec §4.6–4.7). keys: nb = qb + 1 slots (shared or global memory).
__device__ void pool_and_select(const SparseArgs& a, const SelItem& it, int item_idx, int h, const float* cs,
                                uint32_t* keys) {
  const PoolGeom& g = a.pool;
  const int qb = it.p / g.bs;
  const int nb = qb + 1;
  const int64_t ncols_all = n_chunks(it.T, g.ks, g.st);
  for (int k = threadIdx.x; k < nb; k += blockDim.x) {
    float score;
    if (k < g.init_blocks || (qb - g.local_blocks <= k && k <= qb)) {
      score = INFINITY;
    } else {
      const int64_t lo = int64_t(k) * g.bs - g.ks;
      const int64_t c0 = lo < 0 ? 0 : lo / g.st + 1;
      const int64_t c1 = min(int64_t((int64_t(k) + 1) * g.bs - 1) / g.st, ncols_all - 1);
      score = -INFINITY;
      for (int64_t c = c0; c <= c1; ++c) {
        float v = c < it.ncol ? rbf(cs[c]) : 0.f;
        if (v != v) v = 0.f;
        score = fmaxf(score, v);
      }
    }
    keys[k] = block_key(score, k);
  }
  __syncthreads();
  const uint32_t thr = kth_largest_key(keys, nb, it.nsel);
  if (threadIdx.x < 32) {  // ascending compaction (one warp)
    const int lane = threadIdx.x;
    int32_t* sel = a.sel + (int64_t(item_idx) * g.kvh + h) * a.kmax;
    int written = 0;
    for (int base = 0; base < nb; base += 32) {
      const int k = base + lane;
      const bool take = k < nb && keys[k] >= thr;
      const uint32_t ballot = __ballot_sync(0xffffffffu, take);
      if (take) sel[written + __popc(ballot & ((1u << lane) - 1u))] = k;
      written += __popc(ballot);
    }
  }
}

// Many items (prefill): one CTA per (item, KV head) does both passes and the top-K.
template <int D>
__global__ void __launch_bounds__(kWarps * 32) select_fused_kernel(SparseArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ float s_ml[kWarps + 1][16][2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = a.pool.kvh;
  const int item_idx = int(blockIdx.x) / kvh, h = int(blockIdx.x) % kvh;
  const SelItem it = a.sel_items[item_idx];
  const int32_t* pages = a.pages + a.seqs[it.seq].page_off;
  const int G = a.q_heads / kvh;
  constexpr uint32_t kTile = 32 * D * 2;
  const uint32_t sbase = smem_addr(reinterpret_cast<char*>(smem4) + size_t(warp) * 2 * kTile);
  float* cs = a.chunk_scores + it.cs_off + int64_t(h) * it.ncol;
  const int gq = lane / 4;
  const int nt1 = (it.ncol + 31) / 32, nt2 = (it.vis2 + 31) / 32;

  for (int hb = 0; hb < G; hb += 16) {
    const int nrows = min(16, G - hb);
    const int64_t qrow = int64_t(it.row) * a.ldq + int64_t(h * G + hb) * D;
    uint32_t qf[D / 16][4];
    load_q_frags<D>(qf, a.q, a.dtq, gq < nrows ? qrow + int64_t(gq) * D : -1,
                    gq + 8 < nrows ? qrow + int64_t(gq + 8) * D : -1, lane);
    float m[2], l[2], lam[2];
    lse_tiles<D>(a, it, pages, h, qf, sbase, warp, lane, 0, nt2, m, l);
    merge_warps(s_ml, warp, lane, m, l);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float M = s_ml[kWarps][gq + 8 * hr][0], L = s_ml[kWarps][gq + 8 * hr][1];
      lam[hr] = it.vis2 > 0 ? M + log2f(L) : -INFINITY;
    }
    colsum_tiles<D>(a, it, pages, h, qf, sbase, warp, lane, 0, nt1, hb, nrows, lam, cs);
    __syncthreads();
  }
  const int nb = it.p / a.pool.bs + 1;
  uint32_t* keys = nb <= int(kWarps * 2 * kTile / 4) ? reinterpret_cast<uint32_t*>(smem4)
                                                     : a.block_keys + it.key_off + int64_t(h) * nb;
  pool_and_select(a, it, item_idx, h, cs, keys);
}

// Few items (decode): the key tiles of each (item, KV head) are split over S CTAs. Pass 1 writes
// each split's (M, L) per row; pass 2 merges them into Λ and scores its K1 columns.
template <int D>
__global__ void __launch_bounds__(kWarps * 32) select_lse_kernel(SparseArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ float s_ml[kWarps + 1][16][2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = a.pool.kvh, S = a.sel_splits;
  const int split = int(blockIdx.x) % S, ih = int(blockIdx.x) / S;
  const int item_idx = ih / kvh, h = ih % kvh;
  const SelItem it = a.sel_items[item_idx];
  const int32_t* pages = a.pages + a.seqs[it.seq].page_off;
  const int G = a.q_heads / kvh;
  const uint32_t sbase = smem_addr(reinterpret_cast<char*>(smem4) + size_t(warp) * 2 * (32 * D * 2));
  const int gq = lane / 4;
  int t0, t1;
  split_range(it.vis2, split, S, t0, t1);
  float* ml = a.sel_ml + (int64_t(ih) * S + split) * G * 2;
  for (int hb = 0; hb < G; hb += 16) {
    const int nrows = min(16, G - hb);
    const int64_t qrow = int64_t(it.row) * a.ldq + int64_t(h * G + hb) * D;
    uint32_t qf[D / 16][4];
    load_q_frags<D>(qf, a.q, a.dtq, gq < nrows ? qrow + int64_t(gq) * D : -1,
                    gq + 8 < nrows ? qrow + int64_t(gq + 8) * D : -1, lane);
    float m[2], l[2];
    lse_tiles<D>(a, it, pages, h, qf, sbase, warp, lane, t0, t1, m, l);
    merge_warps(s_ml, warp, lane, m, l);
    if (threadIdx.x < nrows) {
      ml[2 * (hb + threadIdx.x)] = s_ml[kWarps][threadIdx.x][0];
      ml[2 * (hb + threadIdx.x) + 1] = s_ml[kWarps][threadIdx.x][1];
    }
    __syncthreads();
  }
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32) select_colsum_kernel(SparseArgs a) {
  extern __shared__ float4 smem4[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = a.pool.kvh, S = a.sel_splits;
  const int split = int(blockIdx.x) % S, ih = int(blockIdx.x) / S;
  const int item_idx = ih / kvh, h = ih % kvh;
  const SelItem it = a.sel_items[item_idx];
  const int32_t* pages = a.pages + a.seqs[it.seq].page_off;
  const int G = a.q_heads / kvh;
  const uint32_t sbase = smem_addr(reinterpret_cast<char*>(smem4) + size_t(warp) * 2 * (32 * D * 2));
  float* cs = a.chunk_scores + it.cs_off + int64_t(h) * it.ncol;
  const int gq = lane / 4;
  int t0, t1;
  split_range(it.ncol, split, S, t0, t1);
  const float* ml = a.sel_ml + int64_t(ih) * S * G * 2;
  for (int hb = 0; hb < G; hb += 16) {
    const int nrows = min(16, G - hb);
    const int64_t qrow = int64_t(it.row) * a.ldq + int64_t(h * G + hb) * D;
    uint32_t qf[D / 16][4];
    load_q_frags<D>(qf, a.q, a.dtq, gq < nrows ? qrow + int64_t(gq) * D : -1,
                    gq + 8 < nrows ? qrow + int64_t(gq + 8) * D : -1, lane);
    float lam[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {  // Λ of row gq + 8·hr from the splits' (M, L), in split order
      const int row = hb + min(gq + 8 * hr, nrows - 1);
      float M = -INFINITY, L = 0.f;
      for (int s = 0; s < S; ++s) M = fmaxf(M, ml[(s * G + row) * 2]);
      if (M != -INFINITY)
        for (int s = 0; s < S; ++s) L += ml[(s * G + row) * 2 + 1] * exp2f(ml[(s * G + row) * 2] - M);
      lam[hr] = it.vis2 > 0 ? M + log2f(L) : -INFINITY;
    }
    colsum_tiles<D>(a, it, pages, h, qf, sbase, warp, lane, t0, t1, hb, nrows, lam, cs);
  }
}

__global__ void __launch_bounds__(kTopkThreads) select_topk_kernel(SparseArgs a) {
  extern __shared__ uint32_t skeys[];
  const int kvh = a.pool.kvh;
  const int item_idx = int(blockIdx.x) / kvh, h = int(blockIdx.x) % kvh;
  const SelItem it = a.sel_items[item_idx];
  const int nb = it.p / a.pool.bs + 1;
  uint32_t* keys = nb <= kTopkSmemKeys ? skeys : a.block_keys + it.key_off + int64_t(h) * nb;
  pool_and_select(a, it, item_idx, h, a.chunk_scores + it.cs_off + int64_t(h) * it.ncol, keys);
}

template <typename K>
void set_smem(K kernel, size_t bytes, bool& done) {
  if (done) return;
  SALA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  done = true;
}

template <int D>
void select_d(const SparseArgs& a, cudaStream_t st) {
  constexpr size_t smem = size_t(kWarps) * 2 * 32 * D * 2;
  const unsigned units = unsigned(int64_t(a.n_sel_items) * a.pool.kvh);
  if (a.sel_splits <= 1) {
    static bool attr = false;
    set_smem(select_fused_kernel<D>, smem, attr);
    select_fused_kernel<D><<<units, kWarps * 32, smem, st>>>(a);
    SALA_CUDA_LAUNCH("select kernel");
    return;
  }
  static bool attr_lse = false, attr_col = false, attr_topk = false;
  set_smem(select_lse_kernel<D>, smem, attr_lse);
  set_smem(select_colsum_kernel<D>, smem, attr_col);
  set_smem(select_topk_kernel, kTopkSmemKeys * 4, attr_topk);
  const unsigned split_units = units * unsigned(a.sel_splits);
  select_lse_kernel<D><<<split_units, kWarps * 32, smem, st>>>(a);
  SALA_CUDA_LAUNCH("select lse kernel");
  select_colsum_kernel<D><<<split_units, kWarps * 32, smem, st>>>(a);
  SALA_CUDA_LAUNCH("select colsum kernel");
  select_topk_kernel<<<units, kTopkThreads, kTopkSmemKeys * 4, st>>>(a);
  SALA_CUDA_LAUNCH("select top-k kernel");
}

}  // namespace

void launch_select(const SparseArgs& a, cudaStream_t st) {
  if (a.n_sel_items <= 0) return;
  switch (a.pool.d) {
    case 16: return select_d<16>(a, st);
    case 32: return select_d<32>(a, st);
    case 64: return select_d<64>(a, st);
    case 128: return select_d<128>(a, st);
    default: cuda_fail_msg("sparse_attention: head dim must be 16, 32, 64 or 128 on CUDA", __FILE__, __LINE__);
  }
}

}  // namespace sala::cuda
