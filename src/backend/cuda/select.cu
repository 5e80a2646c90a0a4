// InfLLM-v2 block selection for the sparse regime, spec §4.5–4.7: stage-1 scores (compressed LSE:
// K2 log-sum-exp normaliser, K1 numerators, summed over the group's heads in fp32, rounded to bf16),
// pooling to blocks with forced init/local blocks, deterministic top-K (score desc, index asc, past
// blocks only).
//
// Speed of light per (token, KV head) at context T (d = 128, G = 16):
//   FLOPs 2·G·d·(T/64 + T/16) = 320·T on tensor cores (1M: 0.34 GFLOP per token and head);
//   bytes (K1 + K2 rows, bf16) 256·(T/16 + T/64) = 20 MB at 1M.
// Three launch shapes (CudaBackend::choose_select_splits, sel_prefill):
//   prefill one CTA per (group of ≤ 8 consecutive tokens, KV head), warp w scoring token w, the
//          key tiles read once per CTA through a shared ring (select_prefill_kernel, below).
//   fused  one CTA of 8 warps per (token group, KV head), the warps splitting the key tiles and
//          each scoring every token: decode-like batches (about one token per group), and every
//          batch in the batch-invariant mode or with set_select_splits(1).
//   split  decode (few tokens, long contexts): the K2 log-sum-exp pass and the K1 column-sum pass
//          each run over S CTAs per (token, head), then 16 pooling CTAs per (token, head) that
//          also keep their segment's top-K candidates, and one top-K CTA over the candidates.
//          At 1M, batch 1: 2 CTAs streaming 40 MB per layer → 2·S CTAs; the whole decode step
//          went from 13.1 to 7.3 ms (H200, 2026-11-24; docs/cuda-backend.md).
// Top-K: the nsel-th largest of the unique 32-bit keys (bf16 score bits, block index) by a 4-pass
// radix select, then an ascending compaction — exact and deterministic. Selection lists are
// checked bit-exactly against a host recomputation from the GPU's own K1/K2 in sala_cuda_tests,
// with both shapes forced.
#include <cmath>

#include "backend/cuda/attn_common.cuh"

namespace sala::cuda {

namespace {

constexpr int kWarps = 8;       // warps of a scoring CTA; they split the key tiles
constexpr int kGroupTokens = kSelectGroupTokens;  // tokens of one sequence sharing a prefill scoring CTA
constexpr int kTopkThreads = 512;

__device__ __forceinline__ uint32_t block_key(float score, int k) {
  uint32_t u = __float_as_uint(score);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (u & 0xFFFF0000u) | (0xFFFFu - uint32_t(k));
}

// Streams this warp's 32-row tiles t0 + warp, t0 + warp + kWarps, ... (< t1) of rows 0..n-1
// (element offsets from rowof) through its double buffer; consume(first row, shared address of the
// tile) for each.
template <int D, typename RowOf, typename Consume>
__device__ __forceinline__ void stream_tiles(uint32_t sbase, int warp, int lane, int t0, int t1, int n,
                                             const bf16* base, RowOf rowof, Consume consume) {
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
    consume(32 * (t0 + warp + kWarps * i), sbase + (i & 1) * kTile);
    __syncwarp();
  }
}

// Tiles [t0, t1) of split `split` of S over n rows.
__device__ __forceinline__ void split_range(int n, int split, int S, int& t0, int& t1) {
  const int nt = (n + 31) / 32;
  t0 = int(int64_t(nt) * split / S);
  t1 = int(int64_t(nt) * (split + 1) / S);
}

// The tokens a scoring CTA serves (consecutive tokens of one sequence, one KV head) and their q
// rows hb..hb+15 as mma A fragments in shared memory, lane-major so that each lane's reload of a
// fragment is one conflict-free 16-byte load: the key tiles are read once for all the tokens.
template <int D>
struct TokenGroup {
  SelItem it[kGroupTokens];
  uint4 qf[kGroupTokens][D / 16][32];
  int n;
};

template <int D>
__device__ __forceinline__ void stage_q(TokenGroup<D>& tg, const SparseArgs& a, int h, int hb, int nrows, int warp,
                                        int lane) {
  const int G = a.q_heads / a.pool.kvh, gq = lane / 4;
  if (warp < tg.n) {
    const int64_t qrow = int64_t(tg.it[warp].row) * a.ldq + int64_t(h * G + hb) * D;
    uint32_t qf[D / 16][4];
    load_q_frags<D>(qf, a.q, a.dtq, gq < nrows ? qrow + int64_t(gq) * D : -1,
                    gq + 8 < nrows ? qrow + int64_t(gq + 8) * D : -1, lane);
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) tg.qf[warp][ks][lane] = make_uint4(qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3]);
  }
  __syncthreads();
}

// s = q_t · tileᵀ (16 × 32) for token t of the group.
template <int D>
__device__ __forceinline__ void token_scores(float (&sc)[4][4], const TokenGroup<D>& tg, int t, uint32_t tile,
                                             int lane) {
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint4 v = tg.qf[t][ks][lane];
    qf[ks][0] = v.x, qf[ks][1] = v.y, qf[ks][2] = v.z, qf[ks][3] = v.w;
  }
  qk_tile<D>(sc, qf, tile, lane);
}

// One key tile of a token's LSE pass: folds the scores of rows gq, gq + 8 (columns < nv) into the
// running per-row (m, l) in the log2 domain (the same on the 4 lanes of a row).
__device__ __forceinline__ void lse_update(float (&sc)[4][4], int nv, float sl2, int t4, float (&m)[2], float (&l)[2]) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float mx = scaled_row_max(sc, hr, sl2, t4, [nv](int c) { return c < nv; });
    const float mn = fmaxf(m[hr], mx);
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) sum += exp2f(sc[nt][2 * hr + e] - mn);
    l[hr] = l[hr] * exp2f(m[hr] - mn) + quad_sum(sum);
    m[hr] = mn;
  }
}

// One key tile of a token's column pass: cs[col] (col < nv) = Σ over the nrows q rows of
// exp2(s·sl2 − Λ_row) (written for hb = 0, added for later row blocks; +∞ without visible K2).
__device__ __forceinline__ void colsum_store(const float (&sc)[4][4], const float (&lam)[2], bool vis, float* cs, int nv,
                                             int hb, int nrows, float sl2, int lane) {
  const int gq = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float colsum = 0.f;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int row = gq + 8 * hr;
        if (row < nrows) colsum += vis ? exp2f(sc[nt][2 * hr + e] * sl2 - lam[hr]) : INFINITY;
      }
      colsum += __shfl_xor_sync(0xffffffffu, colsum, 4);
      colsum += __shfl_xor_sync(0xffffffffu, colsum, 8);
      colsum += __shfl_xor_sync(0xffffffffu, colsum, 16);
      const int col = 8 * nt + 2 * t4 + e;
      if (gq == 0 && col < nv) {
        if (hb == 0)
          cs[col] = colsum;
        else
          cs[col] += colsum;
      }
    }
}

// Pass 1 over K2 tiles [t0, t1) (rows < n2, the group's largest vis2): per token, per-lane (max,
// sum) in the log2 domain of rows gq and gq + 8 over its visible K2 chunks.
template <int D>
__device__ __forceinline__ void lse_tiles(const SparseArgs& a, const TokenGroup<D>& tg, const int32_t* pages, int h,
                                          uint32_t sbase, int warp, int lane, int t0, int t1, int n2,
                                          float (&m)[kGroupTokens][2], float (&l)[kGroupTokens][2]) {
  const PoolGeom& g = a.pool;
  const int64_t row_w = int64_t(g.kvh) * D;
  const float sl2 = a.scale * kLog2e;
  const int t4 = lane % 4;
#pragma unroll
  for (int t = 0; t < kGroupTokens; ++t) m[t][0] = m[t][1] = -INFINITY, l[t][0] = l[t][1] = 0.f;
  stream_tiles<D>(
      sbase, warp, lane, t0, t1, n2, static_cast<const bf16*>(g.k2),
      [&](int c) { return chunk_row(g, a.layer, pages, c, 4 * g.st, g.k2pp) * row_w + h * D; },
      [&](int first, uint32_t tile) {
#pragma unroll
        for (int t = 0; t < kGroupTokens; ++t) {
          if (t >= tg.n) break;
          const int nv = tg.it[t].vis2 - first;
          if (nv <= 0) continue;  // uniform over the warp
          float sc[4][4];
          token_scores<D>(sc, tg, t, tile, lane);
          lse_update(sc, nv, sl2, t4, m[t], l[t]);
        }
      });
}

// Merges the warps' (m, l) through shared memory: (M, L) of token t, row r in s_ml[kWarps][t][r].
__device__ __forceinline__ void merge_warps(float (*s_ml)[kGroupTokens][16][2], int ntok, int warp, int lane,
                                            const float (&m)[kGroupTokens][2], const float (&l)[kGroupTokens][2]) {
  const int gq = lane / 4;
  if (lane % 4 == 0) {
#pragma unroll
    for (int t = 0; t < kGroupTokens; ++t) {
      s_ml[warp][t][gq][0] = m[t][0], s_ml[warp][t][gq][1] = l[t][0];
      s_ml[warp][t][gq + 8][0] = m[t][1], s_ml[warp][t][gq + 8][1] = l[t][1];
    }
  }
  __syncthreads();
  if (int(threadIdx.x) < 16 * ntok) {
    const int t = threadIdx.x / 16, row = threadIdx.x % 16;
    float M = -INFINITY, L = 0.f;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_ml[w][t][row][0]);
    if (M != -INFINITY)
      for (int w = 0; w < kWarps; ++w) L += s_ml[w][t][row][1] * exp2f(s_ml[w][t][row][0] - M);
    s_ml[kWarps][t][row][0] = M, s_ml[kWarps][t][row][1] = L;
  }
  __syncthreads();
}

// Pass 2 over K1 tiles [t0, t1) (rows < n1, the group's largest ncol): per token, column sums over
// the group's q rows of exp2(s·q·K1 − Λ), Λ per row (lam[t][hr] for row gq + 8·hr); each column
// belongs to one warp (written, or added for hb > 0).
template <int D>
__device__ __forceinline__ void colsum_tiles(const SparseArgs& a, const TokenGroup<D>& tg, const int32_t* pages,
                                             int h, uint32_t sbase, int warp, int lane, int t0, int t1, int n1,
                                             int hb, int nrows, const float (&lam)[kGroupTokens][2]) {
  const PoolGeom& g = a.pool;
  const int64_t row_w = int64_t(g.kvh) * D;
  const float sl2 = a.scale * kLog2e;
  stream_tiles<D>(
      sbase, warp, lane, t0, t1, n1, static_cast<const bf16*>(g.k1),
      [&](int c) { return chunk_row(g, a.layer, pages, c, g.st, g.k1pp) * row_w + h * D; },
      [&](int first, uint32_t tile) {
#pragma unroll
        for (int t = 0; t < kGroupTokens; ++t) {
          if (t >= tg.n) break;
          const SelItem& it = tg.it[t];
          const int nv = it.ncol - first;
          if (nv <= 0) continue;
          float sc[4][4];
          token_scores<D>(sc, tg, t, tile, lane);
          colsum_store(sc, lam[t], it.vis2 > 0, a.chunk_scores + it.cs_off + int64_t(h) * it.ncol + first, nv, hb,
                       nrows, sl2, lane);
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

// Key of block k (spec §4.6–4.7): the max of its chunk scores (NaN as 0), +∞ for the forced
// init/local blocks, with the block index in the low bits (unique, ties to the lower index).
__device__ __forceinline__ uint32_t pooled_key(const PoolGeom& g, const SelItem& it, const float* cs, int k) {
  const int qb = it.p / g.bs;
  float score;
  if (k < g.init_blocks || (qb - g.local_blocks <= k && k <= qb)) {
    score = INFINITY;
  } else {
    const int64_t ncols_all = n_chunks(it.T, g.ks, g.st);
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
  return block_key(score, k);
}

// Writes emit(k) for the positions k with keys[k] ≥ thr, in ascending order: each warp counts its
// own segment, the counts give each warp its offset, then the warps write.
template <typename T, typename Emit>
__device__ void compact_ascending(const uint32_t* keys, int nb, uint32_t thr, T* out, Emit emit) {
  __shared__ int s_cnt[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  const int seg = ((nb + nw - 1) / nw + 31) / 32 * 32;
  const int b0 = warp * seg, b1 = min(nb, b0 + seg);
  int cnt = 0;
  for (int base = b0; base < b1; base += 32)
    cnt += __popc(__ballot_sync(0xffffffffu, base + lane < b1 && keys[base + lane] >= thr));
  if (lane == 0) s_cnt[warp] = cnt;
  __syncthreads();
  int off = 0;
  for (int w = 0; w < warp; ++w) off += s_cnt[w];
  for (int base = b0; base < b1; base += 32) {
    const int k = base + lane;
    const bool take = k < b1 && keys[k] >= thr;
    const uint32_t ballot = __ballot_sync(0xffffffffu, take);
    if (take) out[off + __popc(ballot & ((1u << lane) - 1u))] = emit(k);
    off += __popc(ballot);
  }
}

// The top-K list of one (item, KV head) from its nb = qb + 1 block keys (shared or global memory).
__device__ void select_top(const SparseArgs& a, const SelItem& it, int item_idx, int h, const uint32_t* keys) {
  const int nb = it.p / a.pool.bs + 1;
  const uint32_t thr = kth_largest_key(keys, nb, it.nsel);
  compact_ascending(keys, nb, thr, a.sel + (int64_t(item_idx) * a.pool.kvh + h) * a.kmax,
                    [](int k) { return int32_t(k); });
}

// Shared memory of a scoring CTA: each warp's two key tiles, then the token group.
template <int D>
constexpr size_t scoring_smem() {
  return size_t(kWarps) * 2 * 32 * D * 2 + sizeof(TokenGroup<D>);
}

// Loads the group's SelItems (tokens first..first+n−1) and returns its page table.
template <int D>
__device__ __forceinline__ const int32_t* load_group(TokenGroup<D>& tg, const SparseArgs& a, int first, int n) {
  if (threadIdx.x == 0) tg.n = n;
  if (int(threadIdx.x) < n) tg.it[threadIdx.x] = a.sel_items[first + threadIdx.x];
  __syncthreads();
  return a.pages + a.seqs[tg.it[0].seq].page_off;
}

// Many items (prefill): one CTA per (token group, KV head) does both passes over every key tile,
// then the top-K of each token in turn.
template <int D>
__global__ void __launch_bounds__(kWarps * 32) select_fused_kernel(SparseArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ float s_ml[kWarps + 1][kGroupTokens][16][2];
  constexpr size_t kTiles = size_t(kWarps) * 2 * 32 * D * 2;
  TokenGroup<D>& tg = *reinterpret_cast<TokenGroup<D>*>(reinterpret_cast<char*>(smem4) + kTiles);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = a.pool.kvh;
  const int grp = int(blockIdx.x) / kvh, h = int(blockIdx.x) % kvh;
  const int first = a.sel_groups[grp];
  const int32_t* pages = load_group(tg, a, first, a.sel_groups[grp + 1] - first);
  const int G = a.q_heads / kvh;
  const uint32_t sbase = smem_addr(reinterpret_cast<char*>(smem4) + size_t(warp) * 2 * (32 * D * 2));
  const int gq = lane / 4;
  int n1 = 0, n2 = 0;
  for (int t = 0; t < tg.n; ++t) n1 = max(n1, tg.it[t].ncol), n2 = max(n2, tg.it[t].vis2);

  for (int hb = 0; hb < G; hb += 16) {
    const int nrows = min(16, G - hb);
    stage_q(tg, a, h, hb, nrows, warp, lane);
    float m[kGroupTokens][2], l[kGroupTokens][2], lam[kGroupTokens][2];
    lse_tiles<D>(a, tg, pages, h, sbase, warp, lane, 0, (n2 + 31) / 32, n2, m, l);
    merge_warps(s_ml, tg.n, warp, lane, m, l);
#pragma unroll
    for (int t = 0; t < kGroupTokens; ++t)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float M = s_ml[kWarps][t][gq + 8 * hr][0], L = s_ml[kWarps][t][gq + 8 * hr][1];
        lam[t][hr] = t < tg.n && tg.it[t].vis2 > 0 ? M + log2f(L) : -INFINITY;
      }
    colsum_tiles<D>(a, tg, pages, h, sbase, warp, lane, 0, (n1 + 31) / 32, n1, hb, nrows, lam);
    __syncthreads();
  }
  // Top-K of each token, its block keys in the tile buffers when they fit.
  for (int t = 0; t < tg.n; ++t) {
    const SelItem& it = tg.it[t];
    const int nb = it.p / a.pool.bs + 1;
    const float* cs = a.chunk_scores + it.cs_off + int64_t(h) * it.ncol;
    uint32_t* keys = nb <= int(kTiles / 4) ? reinterpret_cast<uint32_t*>(smem4) : a.block_keys + it.key_off + int64_t(h) * nb;
    for (int k = threadIdx.x; k < nb; k += blockDim.x) keys[k] = pooled_key(a.pool, it, cs, k);
    __syncthreads();
    select_top(a, it, first + t, h, keys);
    __syncthreads();
  }
}

// Prefill (token groups of several tokens): one CTA per (token group, KV head), warp w scores
// token w with its q fragments in registers. The key tiles stream once per CTA through a ring of
// kRing shared buffers (tile i issued by warp i mod kWarps, kRing − 1 tiles ahead), so every warp
// runs its own LSE and column sums over all tiles without a cross-warp merge, and the CTA needs
// 8·32·D·2 bytes of shared memory (64 KB at d = 128) instead of 160 KB: two CTAs per SM. The
// fused kernel above (tiles split over the warps, each warp scoring every token) kept one CTA per
// SM whose 8 warps ran long serial chains per tile (ncu, H200, 128K prefill: 15% of the time).
// The ring doubles as the block-key buffer of the top-K (≤ 16384 keys: contexts up to 1M at d = 128).
constexpr int kRing = 8;
template <int D>
constexpr size_t ring_smem() {
  return size_t(kRing) * 32 * D * 2;
}

// Streams 32-row tiles [0, ntiles) of rows 0..n-1 through the ring; consume(first row, tile) is
// called by every warp for each tile (all threads must call this together).
template <int D, typename RowOf, typename Consume>
__device__ __forceinline__ void stream_tiles_cta(uint32_t ring, int warp, int lane, int n, const bf16* base, RowOf rowof,
                                                 Consume consume) {
  constexpr uint32_t kTile = 32 * D * 2;
  const int ntiles = (n + 31) / 32;
  auto issue = [&](int i) {
    if (i < ntiles && warp == i % kWarps) {
      const int c = 32 * i + lane;
      issue_rows<D>(ring + (i % kRing) * kTile, lane, c < n ? rowof(c) : int64_t(-1), base);
    }
    cp_async_commit();  // one group per thread and step (empty when not its tile): uniform waits
  };
  for (int i = 0; i < kRing - 1; ++i) issue(i);
  for (int i = 0; i < ntiles; ++i) {
    cp_async_wait<kRing - 2>();  // this thread's pieces of tile i have landed
    __syncthreads();             // everyone's; and tile i − 1 is consumed, its buffer free
    issue(i + kRing - 1);
    consume(32 * i, ring + (i % kRing) * kTile);
  }
  cp_async_wait<0>();
  __syncthreads();
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32, 2) select_prefill_kernel(SparseArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ SelItem s_it[kGroupTokens];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, t4 = lane % 4;
  const int kvh = a.pool.kvh;
  const int grp = int(blockIdx.x) / kvh, h = int(blockIdx.x) % kvh;
  const int first = a.sel_groups[grp], n = a.sel_groups[grp + 1] - first;
  if (int(threadIdx.x) < n) s_it[threadIdx.x] = a.sel_items[first + threadIdx.x];
  __syncthreads();
  const PoolGeom& g = a.pool;
  const int32_t* pages = a.pages + a.seqs[s_it[0].seq].page_off;
  const int G = a.q_heads / kvh;
  const int64_t row_w = int64_t(g.kvh) * D;
  const float sl2 = a.scale * kLog2e;
  const uint32_t ring = smem_addr(smem4);
  const bool mine = warp < n;
  const SelItem it = s_it[mine ? warp : 0];
  int n1 = 0, n2 = 0;
  for (int t = 0; t < n; ++t) n1 = max(n1, s_it[t].ncol), n2 = max(n2, s_it[t].vis2);

  for (int hb = 0; hb < G; hb += 16) {
    const int nrows = min(16, G - hb);
    uint32_t qf[D / 16][4];
    const int64_t qrow = int64_t(it.row) * a.ldq + int64_t(h * G + hb) * D;
    load_q_frags<D>(qf, a.q, a.dtq, mine && gq < nrows ? qrow + int64_t(gq) * D : -1,
                    mine && gq + 8 < nrows ? qrow + int64_t(gq + 8) * D : -1, lane);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    stream_tiles_cta<D>(
        ring, warp, lane, n2, static_cast<const bf16*>(g.k2),
        [&](int c) { return chunk_row(g, a.layer, pages, c, 4 * g.st, g.k2pp) * row_w + h * D; },
        [&](int first_row, uint32_t tile) {
          const int nv = it.vis2 - first_row;
          if (!mine || nv <= 0) return;  // uniform over the warp
          float sc[4][4];
          qk_tile<D>(sc, qf, tile, lane);
          lse_update(sc, nv, sl2, t4, m, l);
        });
    float lam[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) lam[hr] = it.vis2 > 0 ? m[hr] + log2f(l[hr]) : -INFINITY;
    float* cs = a.chunk_scores + it.cs_off + int64_t(h) * it.ncol;
    stream_tiles_cta<D>(
        ring, warp, lane, n1, static_cast<const bf16*>(g.k1),
        [&](int c) { return chunk_row(g, a.layer, pages, c, g.st, g.k1pp) * row_w + h * D; },
        [&](int first_row, uint32_t tile) {
          const int nv = it.ncol - first_row;
          if (!mine || nv <= 0) return;
          float sc[4][4];
          qk_tile<D>(sc, qf, tile, lane);
          colsum_store(sc, lam, it.vis2 > 0, cs + first_row, nv, hb, nrows, sl2, lane);
        });
  }
  // Top-K of each token in turn (the column sums written above are visible after the ring's final barrier), its block keys in the ring when they fit.
  for (int t = 0; t < n; ++t) {
    const SelItem& ti = s_it[t];
    const int nb = ti.p / g.bs + 1;
    const float* tcs = a.chunk_scores + ti.cs_off + int64_t(h) * ti.ncol;
    uint32_t* keys = nb <= int(ring_smem<D>() / 4) ? reinterpret_cast<uint32_t*>(smem4)
                                                   : a.block_keys + ti.key_off + int64_t(h) * nb;
    for (int k = threadIdx.x; k < nb; k += blockDim.x) keys[k] = pooled_key(g, ti, tcs, k);
    __syncthreads();
    select_top(a, ti, first + t, h, keys);
    __syncthreads();
  }
}

// A CTA of the split path: (item, KV head) unit ih = blockIdx / S and its split; its one-token
// group staged in shared memory after the warps' tile buffers, the page table, the q heads per KV
// head and this warp's tile buffers.
template <int D>
struct SplitCta {
  TokenGroup<D>* tg;
  const int32_t* pages;
  uint32_t sbase;
  int warp, lane, S, split, ih, h, G;
};
template <int D>
__device__ __forceinline__ SplitCta<D> split_cta(const SparseArgs& a, float4* smem4) {
  constexpr size_t kTiles = size_t(kWarps) * 2 * 32 * D * 2;
  SplitCta<D> c;
  c.tg = reinterpret_cast<TokenGroup<D>*>(reinterpret_cast<char*>(smem4) + kTiles);
  c.warp = threadIdx.x / 32, c.lane = threadIdx.x % 32;
  const int kvh = a.pool.kvh;
  c.S = a.sel_splits;
  c.split = int(blockIdx.x) % c.S, c.ih = int(blockIdx.x) / c.S;
  c.h = c.ih % kvh;
  c.pages = load_group(*c.tg, a, c.ih / kvh, 1);
  c.G = a.q_heads / kvh;
  c.sbase = smem_addr(reinterpret_cast<char*>(smem4) + size_t(c.warp) * 2 * (32 * D * 2));
  return c;
}

// Few items (decode): the key tiles of each (item, KV head) are split over S CTAs. Pass 1 writes
// each split's (M, L) per row; pass 2 merges them into Λ and scores its K1 columns.
template <int D>
__global__ void __launch_bounds__(kWarps * 32) select_lse_kernel(SparseArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ float s_ml[kWarps + 1][kGroupTokens][16][2];
  const SplitCta<D> c = split_cta<D>(a, smem4);
  TokenGroup<D>& tg = *c.tg;
  const int warp = c.warp, lane = c.lane, S = c.S, split = c.split, ih = c.ih, h = c.h, G = c.G;
  const int32_t* pages = c.pages;
  const uint32_t sbase = c.sbase;
  const int n2 = tg.it[0].vis2;
  int t0, t1;
  split_range(n2, split, S, t0, t1);
  float* ml = a.sel_ml + (int64_t(ih) * S + split) * G * 2;
  for (int hb = 0; hb < G; hb += 16) {
    const int nrows = min(16, G - hb);
    stage_q(tg, a, h, hb, nrows, warp, lane);
    float m[kGroupTokens][2], l[kGroupTokens][2];
    lse_tiles<D>(a, tg, pages, h, sbase, warp, lane, t0, t1, n2, m, l);
    merge_warps(s_ml, 1, warp, lane, m, l);
    if (int(threadIdx.x) < nrows) {
      ml[2 * (hb + threadIdx.x)] = s_ml[kWarps][0][threadIdx.x][0];
      ml[2 * (hb + threadIdx.x) + 1] = s_ml[kWarps][0][threadIdx.x][1];
    }
    __syncthreads();
  }
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32) select_colsum_kernel(SparseArgs a) {
  extern __shared__ float4 smem4[];
  const SplitCta<D> c = split_cta<D>(a, smem4);
  TokenGroup<D>& tg = *c.tg;
  const int warp = c.warp, lane = c.lane, S = c.S, split = c.split, ih = c.ih, h = c.h, G = c.G;
  const int32_t* pages = c.pages;
  const uint32_t sbase = c.sbase;
  const int gq = lane / 4;
  const int n1 = tg.it[0].ncol;
  int t0, t1;
  split_range(n1, split, S, t0, t1);
  const float* ml = a.sel_ml + int64_t(ih) * S * G * 2;
  for (int hb = 0; hb < G; hb += 16) {
    const int nrows = min(16, G - hb);
    stage_q(tg, a, h, hb, nrows, warp, lane);
    float lam[kGroupTokens][2] = {};
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {  // Λ of row gq + 8·hr from the splits' (M, L), in split order
      const int row = hb + min(gq + 8 * hr, nrows - 1);
      float M = -INFINITY, L = 0.f;
      for (int s = 0; s < S; ++s) M = fmaxf(M, ml[(s * G + row) * 2]);
      if (M != -INFINITY)
        for (int s = 0; s < S; ++s) L += ml[(s * G + row) * 2 + 1] * exp2f(ml[(s * G + row) * 2] - M);
      lam[0][hr] = tg.it[0].vis2 > 0 ? M + log2f(L) : -INFINITY;
    }
    colsum_tiles<D>(a, tg, pages, h, sbase, warp, lane, t0, t1, n1, hb, nrows, lam);
    __syncthreads();
  }
}

// Split path, top-K in two stages (exact): kPoolCtas CTAs per (item, KV head) each pool one
// contiguous segment of the block keys into shared memory and keep the segment's own top-nsel keys
// (every key of the global top-nsel is in its segment's), in block order; one CTA then selects
// from those kPoolCtas·kmax candidates, padded with key 0 (below every real key: even a −∞ score
// keeps the high bits of its key non-zero). At 1M context that is 1536 keys instead of 16384
// in the final single-CTA select (ncu, H200: 46.7 µs for the one-stage top-K of 16384 keys).
constexpr int kPoolCtas = kSelectPoolCtas;
constexpr int kPoolSegKeys = 65536 / kPoolCtas;  // blocks ≤ 65536 (the key's index field; checked on the host)
__global__ void __launch_bounds__(256) select_pool_kernel(SparseArgs a) {
  __shared__ uint32_t skeys[kPoolSegKeys];
  const int kvh = a.pool.kvh;
  const int unit = int(blockIdx.x) / kPoolCtas, part = int(blockIdx.x) % kPoolCtas;
  const int item_idx = unit / kvh, h = unit % kvh;
  const SelItem it = a.sel_items[item_idx];
  const int nb = it.p / a.pool.bs + 1, seg = (nb + kPoolCtas - 1) / kPoolCtas;
  const int b0 = min(nb, part * seg), n = min(nb, b0 + seg) - b0;
  const float* cs = a.chunk_scores + it.cs_off + int64_t(h) * it.ncol;
  for (int i = threadIdx.x; i < n; i += blockDim.x) skeys[i] = pooled_key(a.pool, it, cs, b0 + i);
  __syncthreads();
  uint32_t* cand = a.sel_cand + (int64_t(unit) * kPoolCtas + part) * a.kmax;
  const int m = min(it.nsel, n);
  if (m > 0) {
    const uint32_t thr = kth_largest_key(skeys, n, m);
    compact_ascending(skeys, n, thr, cand, [&](int k) { return skeys[k]; });
  }
  for (int i = m + int(threadIdx.x); i < a.kmax; i += blockDim.x) cand[i] = 0u;
}

__global__ void __launch_bounds__(kTopkThreads) select_topk_kernel(SparseArgs a) {
  extern __shared__ uint32_t skeys[];  // kPoolCtas · kmax candidates
  const int kvh = a.pool.kvh;
  const int item_idx = int(blockIdx.x) / kvh, h = int(blockIdx.x) % kvh;
  const SelItem it = a.sel_items[item_idx];
  const int nc = kPoolCtas * a.kmax;
  const uint32_t* cand = a.sel_cand + int64_t(blockIdx.x) * nc;
  for (int k = threadIdx.x; k < nc; k += blockDim.x) skeys[k] = cand[k];
  __syncthreads();
  const uint32_t thr = kth_largest_key(skeys, nc, it.nsel);
  compact_ascending(skeys, nc, thr, a.sel + (int64_t(item_idx) * kvh + h) * a.kmax,
                    [&](int k) { return int32_t(0xFFFFu - (skeys[k] & 0xFFFFu)); });
}

template <typename K>
void set_smem(K kernel, size_t bytes, bool& done) {
  if (done) return;
  SALA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  done = true;
}

template <int D>
void select_d(const SparseArgs& a, cudaStream_t st) {
  constexpr size_t smem = scoring_smem<D>();
  const unsigned units = unsigned(int64_t(a.n_sel_items) * a.pool.kvh);
  if (a.sel_prefill) {
    static bool attr = false;
    set_smem(select_prefill_kernel<D>, ring_smem<D>(), attr);
    select_prefill_kernel<D><<<unsigned(int64_t(a.n_sel_groups) * a.pool.kvh), kWarps * 32, ring_smem<D>(), st>>>(a);
    SALA_CUDA_LAUNCH("select prefill kernel");
    return;
  }
  if (a.sel_splits <= 1) {
    static bool attr = false;
    set_smem(select_fused_kernel<D>, smem, attr);
    select_fused_kernel<D><<<unsigned(int64_t(a.n_sel_groups) * a.pool.kvh), kWarps * 32, smem, st>>>(a);
    SALA_CUDA_LAUNCH("select kernel");
    return;
  }
  static bool attr_lse = false, attr_col = false, attr_topk = false;
  set_smem(select_lse_kernel<D>, smem, attr_lse);
  set_smem(select_colsum_kernel<D>, smem, attr_col);
  const size_t topk_smem = size_t(kPoolCtas) * size_t(a.kmax) * 4;
  if (topk_smem > 48 * 1024) set_smem(select_topk_kernel, topk_smem, attr_topk);
  const unsigned split_units = units * unsigned(a.sel_splits);
  select_lse_kernel<D><<<split_units, kWarps * 32, smem, st>>>(a);
  SALA_CUDA_LAUNCH("select lse kernel");
  select_colsum_kernel<D><<<split_units, kWarps * 32, smem, st>>>(a);
  SALA_CUDA_LAUNCH("select colsum kernel");
  select_pool_kernel<<<units * kPoolCtas, 256, 0, st>>>(a);
  SALA_CUDA_LAUNCH("select pool kernel");
  select_topk_kernel<<<units, kTopkThreads, topk_smem, st>>>(a);
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
