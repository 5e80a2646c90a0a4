// Warp-level building blocks of the sparse-layer kernels (select.cu, attention.cu): a warp owns 16
// query rows (tokens × heads of one KV head) as mma.sync A fragments and streams 32-row tiles of
// keys (K, K1 or K2 rows, found through the page table) through its own shared-memory slice.
//   S tile  = Q·Kᵀ      16 × 32, D/16 k-steps × 4 n-tiles of m16n8k16 (bf16 in, fp32 out)
//   O      += P·V       16 × D,  2 k-steps × D/8 n-tiles (P rounded to bf16, as flash-attention)
// Rows of the tile are 16-byte-chunk swizzled so that ldmatrix reads are conflict free (D ≥ 64).
#pragma once
#include "backend/cuda/common.cuh"

namespace sala::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// Copies up to 32 rows of D bf16 (row r at rowptr(r)) into a swizzled tile; rows ≥ nvalid are
// zero-filled. Asynchronous: cp_async_commit + cp_async_wait_all + __syncwarp before use.
template <int D, typename RowPtr>
__device__ __forceinline__ void load_rows_async(uint32_t tile, int lane, int nvalid, RowPtr rowptr, const void* any) {
  constexpr int CPR = D / 8;
#pragma unroll
  for (int i = 0; i < CPR; ++i) {
    const int idx = lane + 32 * i;
    const int r = idx / CPR, c = idx % CPR;
    const bool ok = r < nvalid;
    const void* src = ok ? static_cast<const void*>(rowptr(r) + c * 8) : any;
    cp_async16(tile + RowSwizzle<D>::offset(r, c), src, ok ? 16 : 0);
  }
}

// Issues the asynchronous copy of a 32-row tile: lane l supplies, in `myrow`, the element offset
// (from `base`) of row l, or -1 for a row to zero-fill. One page lookup per lane and tile; the
// row offsets are shuffled to the lanes that copy each row's 16-byte pieces.
template <int D>
__device__ __forceinline__ void issue_rows(uint32_t tile, int lane, int64_t myrow, const bf16* base) {
  constexpr int CPR = D / 8;
#pragma unroll
  for (int i = 0; i < CPR; ++i) {
    const int idx = lane + 32 * i;
    const int r = idx / CPR, c = idx % CPR;
    const int64_t src = __shfl_sync(0xffffffffu, myrow, r);
    const bool ok = src >= 0;
    cp_async16(tile + RowSwizzle<D>::offset(r, c), ok ? base + src + c * 8 : base, ok ? 16 : 0);
  }
}

// A-fragment pair (row offset off, columns c, c+1) of q; off < 0 is a padding row (zeros).
__device__ __forceinline__ uint32_t q_pair(const void* q, int dt, int64_t off, int c) {
  if (off < 0) return 0u;
  if (dt == kBF16) return *reinterpret_cast<const uint32_t*>(static_cast<const bf16*>(q) + off + c);
  return pack_bf16x2(ldf(q, dt, off + c), ldf(q, dt, off + c + 1));
}

// Q fragments of rows g = lane/4 (element offset off0) and g + 8 (off1).
template <int D>
__device__ __forceinline__ void load_q_frags(uint32_t qf[D / 16][4], const void* q, int dt, int64_t off0, int64_t off1,
                                             int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int c = 16 * ks + 2 * t;
    qf[ks][0] = q_pair(q, dt, off0, c);
    qf[ks][1] = q_pair(q, dt, off1, c);
    qf[ks][2] = q_pair(q, dt, off0, c + 8);
    qf[ks][3] = q_pair(q, dt, off1, c + 8);
  }
}

// s[nt][e]: the 16 × 32 product Q·Kᵀ of a key tile at shared address `tile`.
// Element e of n-tile nt: row g (e < 2) or g + 8, key column 8·nt + 2·(lane%4) + (e & 1).
template <int D>
__device__ __forceinline__ void qk_tile(float s[4][4], const uint32_t qf[D / 16][4], uint32_t tile, int lane) {
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    const int row = 8 * nt + (lane & 7);
    if constexpr (D >= 32) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ks += 2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(b0, b1, b2, b3, tile + RowSwizzle<D>::offset(row, 2 * ks + (lane >> 3)));
        mma16816(s[nt], qf[ks], b0, b1);
        mma16816(s[nt], qf[ks + 1], b2, b3);
      }
    } else {
      uint32_t b0, b1;
      ldsm_x2(b0, b1, tile + RowSwizzle<D>::offset(row, (lane >> 3) & 1));
      mma16816(s[nt], qf[0], b0, b1);
    }
  }
}

// o += P·V for a 32-key tile of V at shared address `tile`; p in the layout of qk_tile.
template <int D>
__device__ __forceinline__ void pv_tile(float o[D / 8][4], const float p[4][4], uint32_t tile, int lane) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    uint32_t a[4];
    a[0] = pack_bf16x2(p[2 * kk][0], p[2 * kk][1]);
    a[1] = pack_bf16x2(p[2 * kk][2], p[2 * kk][3]);
    a[2] = pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
    const int mi = lane >> 3;
    const int key = 16 * kk + (mi & 1) * 8 + (lane & 7);
#pragma unroll
    for (int nd = 0; nd < D / 8; nd += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_t(b0, b1, b2, b3, tile + RowSwizzle<D>::offset(key, nd + (mi >> 1)));
      mma16816(o[nd], a, b0, b1);
      mma16816(o[nd + 1], a, b2, b3);
    }
  }
}

// Max / sum over the 4 lanes that share a row.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Row hr (rows g, g + 8: hr = 0, 1) of a 16 × 32 score tile scaled by sl2 in place, −∞ where
// keep(c) is false (c = 8·nt + 2·t4 + e: the key's column in the tile); returns the row's max over
// the 4 lanes of its quad.
template <class Keep>
__device__ __forceinline__ float scaled_row_max(float (*sc)[4], int hr, float sl2, int t4, Keep keep) {
  float mx = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 8 * nt + 2 * t4 + e;
      const float x = keep(c) ? sc[nt][2 * hr + e] * sl2 : -INFINITY;
      sc[nt][2 * hr + e] = x;
      mx = fmaxf(mx, x);
    }
  return quad_max(mx);
}

// One 32-key tile of a warp's online softmax (log2 domain) over its 16 rows: the scores of qk_tile
// scaled by sl2, keys ≥ kend or after a row's position (prow; -1: no row) masked, the running max
// m, sum l and output o rescaled to the new max; sc is left holding the tile's probabilities for
// pv_tile. Keys k0 + 8·nt + 2·t4 + e of lane quad t4, rows g and g + 8 (hr = 0, 1).
template <int D>
__device__ __forceinline__ void softmax_tile(float sc[4][4], float m[2], float l[2], float o[D / 8][4], int k0,
                                             int kend, const int prow[2], float sl2, int t4) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float mx = scaled_row_max(sc, hr, sl2, t4, [&](int c) { return k0 + c < kend && k0 + c <= prow[hr]; });
    const float mn = fmaxf(m[hr], mx);
    const float mu = mn == -INFINITY ? 0.f : mn;
    const float alpha = exp2f(m[hr] - mu);
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2f(sc[nt][2 * hr + e] - mu);
        sc[nt][2 * hr + e] = p;
        sum += p;
      }
    l[hr] = l[hr] * alpha + sum;
    m[hr] = mn;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      o[nd][2 * hr] *= alpha;
      o[nd][2 * hr + 1] *= alpha;
    }
  }
}

// Row index (within the pool of one level) of compressed chunk c of a sequence: the chunk lives in
// the page holding its first token (same layout as the CPU backend).
__device__ __forceinline__ int64_t chunk_row(const PoolGeom& g, int layer, const int32_t* pages, int64_t c, int stride,
                                             int per_page) {
  const int64_t first = c * stride;
  return (int64_t(layer) * g.max_pages + pages[first / g.bs]) * per_page + (first % g.bs) / stride;
}

}  // namespace sala::cuda
