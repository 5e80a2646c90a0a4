// CPU attention ops (f32): Simple-GLA for lightning layers, dense / InfLLM-v2 for sparse layers.
//
// lightning_attention (spec §3.6–3.8), per (sequence, q head), state S[d][d] f32 in its slot:
//   * Lq < 64: the recurrence, one fused pass over S per token: S = γS + k⊗v, o = s·qᵀS
//     (output tile in registers). 2·d² MAC per token and head (d = 128: 32 K MAC); S (64 KiB) is
//     read and written once per token, so decode is bound by cache/DRAM bandwidth on the state
//     (32 heads: 2 MiB read + 2 MiB written per layer and token).
//   * Lq ≥ 64: chunked-parallel form (§3.7) with C = 64 and e[m] = exp(m·g) from the fp32
//     log-decay: inter Q·S_in, intra causal (q·k)·e[i−j]·v, S_out = e[C']S_in + Σ e[C'−1−j] k⊗v,
//     as register-tiled small GEMMs. ≈ 2·d² + C·d MAC per token and head, S read twice per chunk.
//   Both forms equal the recurrence to f32 rounding (tests: < 1e-5 relative, typically ~1e-7).
//
// sparse_attention (spec §4.3–4.8), per sequence: (1) copy the new k/v rows into the pages,
// (2) append the complete K1 (window ks, stride st) and K2 (4ks, 4st) chunks as means of K rows,
// (3) per (token, kv head[, slice of its G q heads]) attend:
//   * dense: keys 0..p; 2·(p+1)·d MAC per q head; K/V rows (2·(p+1)·d·4 bytes) are read once per
//     kv head and shared by its G q heads (decode at 16 K, d 128: 16 MiB per kv head per layer).
//   * sparse (InfLLM-v2, ideal per-token visibility): when qb+1 ≤ K every past block is selected
//     and stage 1 is skipped (identical result); otherwise stage 1 (compressed LSE of the G heads:
//     G·(n2+n1)·d MAC over the visible chunks), pooling + forced blocks + deterministic top-K
//     (sparse_select.h), then stage 2 over ≤ K·bs keys: 2·K·bs·d MAC per q head
//     (K = 96, bs = 64: ≤ 6144 keys, 1.6 M MAC per head).
//   Softmax is two-pass (scores, max, exp-sum, weighted V) in f32 over exactly the selected keys,
//   in ascending key order, so sparse equals dense bit for bit when every block is selected.
//   Scores use 2-head x 4-key register tiles, P·V a 4-head x 16-column tile over 64-key blocks.
// Scratch is allocated once per thread piece, never per token. Outputs must not alias inputs.
//
// Measured (one core of the 2-core dev box, AMD EPYC, CPU time; AVX2 path / SSE baseline path):
// dense decode over 4096 keys with 32 q / 2 kv heads of 128: 2.9–3.5 ms (≈ 20 GFLOP/s, ~25% of
// the no-FMA AVX2 peak; the P·V loads of scattered page rows dominate) / 5.0 ms; lightning
// 32 x 128 heads: 0.085–0.095 ms per token in prefill (either form, ≈ 23 GFLOP/s) / 0.16–0.2 ms,
// 0.11–0.3 ms for a decode step (state traffic). The two paths give bit-identical results.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/sparse_select.h"
#include "core/error.h"

namespace sala {

namespace {

float* f32_data(const Mat& m, const char* what) {
  SALA_CHECK(m.dtype == DType::F32, "cpu {}: expected an f32 matrix, got {}", what, dtype_name(m.dtype));
  return static_cast<float*>(m.data);
}

// Dot product with 8 independent partial sums (vectorises without -ffast-math).
[[gnu::always_inline]] inline float dot(const float* __restrict a, const float* __restrict b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) acc[u] += a[i + u] * b[i + u];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a·x
[[gnu::always_inline]] inline void axpy(float a, const float* __restrict x, float* __restrict y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

constexpr int kChunk = 64;  // GLA chunk length (and the Lq threshold for the chunked form)

// Rows of one head in a packed [N, heads*dim] matrix: base points at (row 0, this head).
struct Rows {
  const float* base;
  int64_t stride;
  const float* operator[](int64_t t) const { return base + t * stride; }
};

// ---- SIMD ----
// The kernels below are templates on the vector width W (floats): W = 8 (AVX, compiled inside
// target("avx2") wrappers and chosen at run time when the CPU has AVX2) or W = 4 (SSE / NEON,
// the baseline). GCC vector extensions, element-wise arithmetic only, no FMA, no reassociation:
// both widths do the same f32 operations in the same order (the dot products keep 8 lanes in
// both), so the two paths agree bit for bit; only libm's exp/log may differ between CPUs.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"  // the vector types never cross a non-inlined call
#endif
typedef float v4 __attribute__((vector_size(16)));
typedef float v8 __attribute__((vector_size(32)));
template <int W>
using vec = std::conditional_t<W == 8, v8, v4>;

template <int W>
[[gnu::always_inline]] inline vec<W> load(const float* p) {
  vec<W> r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
template <int W>
[[gnu::always_inline]] inline void store(float* p, const vec<W>& x) {
  std::memcpy(p, &x, sizeof x);
}

// C[i][:N] += Σ_kk A(i, kk) · B[kk][:N] for i < M, kk < K, with A(i, kk) = a[i·a_i + kk·a_k] and
// B row kk at brow(kk). Register tiles of 4 rows x 2W columns, K in blocks of 64 so the B rows of a
// block stay in L1 across the tiles; per element the sum runs kk ascending, tile or edge alike.
template <int W, typename BRow>
[[gnu::always_inline]] inline void gemm_rows(int M, int N, int K, const float* a, int64_t a_i, int64_t a_k, BRow brow,
                                             float* c, int64_t c_i) {
  using V = vec<W>;
  for (int k0 = 0; k0 < K; k0 += 64) {
    const int k1 = std::min(K, k0 + 64);
    int i = 0;
    for (; i + 4 <= M; i += 4) {
      int j = 0;
      for (; j + 2 * W <= N; j += 2 * W) {
        float* c0 = c + i * c_i + j;
        V t00 = load<W>(c0), t01 = load<W>(c0 + W), t10 = load<W>(c0 + c_i), t11 = load<W>(c0 + c_i + W);
        V t20 = load<W>(c0 + 2 * c_i), t21 = load<W>(c0 + 2 * c_i + W), t30 = load<W>(c0 + 3 * c_i),
          t31 = load<W>(c0 + 3 * c_i + W);
        const float* ar = a + i * a_i;
        for (int kk = k0; kk < k1; ++kk) {
          const float* br = brow(kk) + j;
          const V b0 = load<W>(br), b1 = load<W>(br + W);
          const float* ak = ar + kk * a_k;
          const float x0 = ak[0], x1 = ak[a_i], x2 = ak[2 * a_i], x3 = ak[3 * a_i];
          t00 += x0 * b0;
          t01 += x0 * b1;
          t10 += x1 * b0;
          t11 += x1 * b1;
          t20 += x2 * b0;
          t21 += x2 * b1;
          t30 += x3 * b0;
          t31 += x3 * b1;
        }
        store<W>(c0, t00);
        store<W>(c0 + W, t01);
        store<W>(c0 + c_i, t10);
        store<W>(c0 + c_i + W, t11);
        store<W>(c0 + 2 * c_i, t20);
        store<W>(c0 + 2 * c_i + W, t21);
        store<W>(c0 + 3 * c_i, t30);
        store<W>(c0 + 3 * c_i + W, t31);
      }
      if (j < N)
        for (int r = 0; r < 4; ++r)
          for (int kk = k0; kk < k1; ++kk)
            axpy(a[(i + r) * a_i + kk * a_k], brow(kk) + j, c + (i + r) * c_i + j, N - j);
    }
    for (; i < M; ++i)
      for (int kk = k0; kk < k1; ++kk) axpy(a[i * a_i + kk * a_k], brow(kk), c + i * c_i, N);
  }
}

template <int W>
[[gnu::always_inline]] inline void gemm_acc(int M, int N, int K, const float* a, int64_t a_i, int64_t a_k,
                                            const float* b, int64_t b_k, float* c, int64_t c_i) {
  gemm_rows<W>(M, N, K, a, a_i, a_k, [=](int kk) { return b + kk * b_k; }, c, c_i);
}

// The 8-lane partial sums of a dot product: one v8, or two v4 (lanes 0–3, 4–7).
template <int W>
struct Acc8;
template <>
struct Acc8<8> {
  v8 x = {};
  [[gnu::always_inline]] void add(const float* a, const float* b) { x += load<8>(a) * load<8>(b); }
  [[gnu::always_inline]] float sum() const {
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
  }
};
template <>
struct Acc8<4> {
  v4 lo = {}, hi = {};
  [[gnu::always_inline]] void add(const float* a, const float* b) {
    lo += load<4>(a) * load<4>(b);
    hi += load<4>(a + 4) * load<4>(b + 4);
  }
  [[gnu::always_inline]] float sum() const {
    return ((lo[0] + hi[0]) + (lo[1] + hi[1])) + ((lo[2] + hi[2]) + (lo[3] + hi[3]));
  }
};

// sc[g][j] = scale · (q_g · k_j) for g < ng, j < nk, every entry exactly scale * dot(q_g, k_j, d).
// Tiles of HT heads x 4 keys (HT = 2 with AVX, 1 with SSE: 8 accumulator registers) if d % 8 == 0.
template <int W>
[[gnu::always_inline]] inline void qk_scores(const float* q, int ng, int d, float scale, const float* const* krows,
                                             int64_t nk, float* sc, int64_t sc_stride) {
  constexpr int HT = W == 8 ? 2 : 1;
  int64_t j = 0;
  if (d % 8 == 0) {
    for (; j + 4 <= nk; j += 4) {
      const float *k0 = krows[j], *k1 = krows[j + 1], *k2 = krows[j + 2], *k3 = krows[j + 3];
      int g = 0;
      for (; g + HT <= ng; g += HT) {
        Acc8<W> acc[HT][4];
        for (int x = 0; x < d; x += 8)
          for (int h = 0; h < HT; ++h) {
            const float* qh = q + int64_t(g + h) * d + x;
            acc[h][0].add(qh, k0 + x);
            acc[h][1].add(qh, k1 + x);
            acc[h][2].add(qh, k2 + x);
            acc[h][3].add(qh, k3 + x);
          }
        for (int h = 0; h < HT; ++h)
          for (int u = 0; u < 4; ++u) sc[int64_t(g + h) * sc_stride + j + u] = scale * acc[h][u].sum();
      }
      for (; g < ng; ++g)
        for (int u = 0; u < 4; ++u) sc[int64_t(g) * sc_stride + j + u] = scale * dot(q + int64_t(g) * d, krows[j + u], d);
    }
  }
  for (; j < nk; ++j)
    for (int g = 0; g < ng; ++g) sc[int64_t(g) * sc_stride + j] = scale * dot(q + int64_t(g) * d, krows[j], d);
}

// GLA recurrence (§3.6) over n tokens: one fused pass over S per token, S = γS + k⊗v and
// o = s·qᵀS, in column tiles of 2W so the output tile stays in registers.
template <int W>
[[gnu::always_inline]] inline void gla_recurrent_impl(float* __restrict S, int d, float gamma, float s, int64_t n,
                                                      Rows q, Rows k, Rows v, float* out, int64_t out_stride) {
  using V = vec<W>;
  for (int64_t t = 0; t < n; ++t) {
    const float *qt = q[t], *kt = k[t], *vt = v[t];
    float* ot = out + t * out_stride;
    int b0 = 0;
    for (; b0 + 2 * W <= d; b0 += 2 * W) {
      V o0 = {}, o1 = {};
      const V v0 = load<W>(vt + b0), v1 = load<W>(vt + b0 + W);
      for (int a = 0; a < d; ++a) {
        float* Sa = S + size_t(a) * d + b0;
        const float ka = kt[a], qa = qt[a];
        const V x0 = gamma * load<W>(Sa) + ka * v0, x1 = gamma * load<W>(Sa + W) + ka * v1;
        store<W>(Sa, x0);
        store<W>(Sa + W, x1);
        o0 += qa * x0;
        o1 += qa * x1;
      }
      store<W>(ot + b0, s * o0);
      store<W>(ot + b0 + W, s * o1);
    }
    for (int b = b0; b < d; ++b) {
      float o = 0;
      for (int a = 0; a < d; ++a) {
        float& x = S[size_t(a) * d + b];
        x = gamma * x + kt[a] * vt[b];
        o += qt[a] * x;
      }
      ot[b] = s * o;
    }
  }
}

// GLA chunked-parallel form (§3.7) over n tokens in chunks of 64; ex[m] = exp(m·g), m ≤ 64.
// Scratch: A [64][d], W [64][64], KD [64][d].
template <int VW>
[[gnu::always_inline]] inline void gla_chunked_impl(float* __restrict S, int d, float s, const float* ex, int64_t n,
                                                    Rows q, Rows k, Rows v, float* out, int64_t out_stride,
                                                    float* __restrict A, float* __restrict W, float* __restrict KD) {
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int L = int(std::min<int64_t>(kChunk, n - c0));
    const float* Q0 = q[c0];
    const float* V0 = v[c0];
    // Inter-chunk: A[i] = ex[i+1] · (q_iᵀ S_in).
    std::fill_n(A, size_t(L) * d, 0.f);
    gemm_acc<VW>(L, d, d, Q0, q.stride, 1, S, d, A, d);
    for (int i = 0; i < L; ++i) {
      float* ai = A + size_t(i) * d;
      const float f = ex[i + 1];
      for (int b = 0; b < d; ++b) ai[b] *= f;
    }
    // Intra-chunk, causal including the diagonal: A[i] += Σ_{j≤i} ex[i−j]·(q_i·k_j)·v_j.
    for (int i = 0; i < L; ++i) {
      const float* qi = q[c0 + i];
      float* wi = W + size_t(i) * kChunk;
      for (int j = 0; j <= i; ++j) wi[j] = ex[i - j] * dot(qi, k[c0 + j], d);
      for (int j = i + 1; j < L; ++j) wi[j] = 0.f;
    }
    for (int i = 0; i < L; i += 4) {  // row tiles of 4 need keys up to their last row only
      const int rows = std::min(4, L - i);
      gemm_acc<VW>(rows, d, i + rows, W + size_t(i) * kChunk, kChunk, 1, V0, v.stride, A + size_t(i) * d, d);
    }
    for (int i = 0; i < L; ++i) {
      const float* ai = A + size_t(i) * d;
      float* oi = out + (c0 + i) * out_stride;
      for (int b = 0; b < d; ++b) oi[b] = s * ai[b];
    }
    // State: S_out = ex[L]·S_in + Σ_j ex[L−1−j]·k_j ⊗ v_j = ex[L]·S_in + KDᵀ·V.
    const float fL = ex[L];
    for (int64_t x = 0; x < int64_t(d) * d; ++x) S[x] *= fL;
    for (int j = 0; j < L; ++j) {
      const float* kj = k[c0 + j];
      const float f = ex[L - 1 - j];
      for (int a = 0; a < d; ++a) KD[size_t(j) * d + a] = f * kj[a];
    }
    gemm_acc<VW>(d, d, L, KD, 1, d, V0, v.stride, S, d);
  }
}

// Stage 1 (§4.5) for one kv head: Λ[g] = logsumexp_c' (s·q_g·K2[c']) over the n2 visible K2 rows
// (max-subtracted), then score[c] = Σ_g exp(s·q_g·K1[c] − Λ[g]) (summed in g order) for c < n1.
// q: the G query heads of the group, contiguous. buf: scratch of G·max(n1, n2) floats, lse: G.
template <int W>
[[gnu::always_inline]] inline void stage1_scores_impl(const float* q, int G, int d, float scale,
                                                      const float* const* k2, int64_t n2, const float* const* k1,
                                                      int64_t n1, float* buf, float* lse, float* score) {
  qk_scores<W>(q, G, d, scale, k2, n2, buf, n2);
  for (int g = 0; g < G; ++g) {
    const float* a = buf + g * n2;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < n2; ++c) m = std::max(m, a[c]);
    float z = 0;
    for (int64_t c = 0; c < n2; ++c) z += std::exp(a[c] - m);
    lse[g] = m + std::log(z);
  }
  qk_scores<W>(q, G, d, scale, k1, n1, buf, n1);
  for (int64_t c = 0; c < n1; ++c) {
    float total = 0;
    for (int g = 0; g < G; ++g) total += std::exp(buf[g * n1 + c] - lse[g]);
    score[c] = total;
  }
}

// Softmax attention of ng query heads (contiguous in q and out) over the nk given key/value rows,
// two-pass in f32: logits, max, exp and sum, weighted sum of V (keys ascending), divide.
// sc: scratch [ng][sc_stride ≥ nk]; acc: scratch [min(ng, 64)][d].
template <int W>
[[gnu::always_inline]] inline void attend_rows_impl(const float* q, int ng, int d, float scale,
                                                    const float* const* krows, const float* const* vrows, int64_t nk,
                                                    float* __restrict sc, int64_t sc_stride, float* __restrict acc,
                                                    float* out) {
  qk_scores<W>(q, ng, d, scale, krows, nk, sc, sc_stride);
  float inv[64];
  for (int g0 = 0; g0 < ng; g0 += 64) {  // (ng ≤ 64 in practice; chunked only to bound `inv`)
    const int g1 = std::min(ng, g0 + 64);
    for (int g = g0; g < g1; ++g) {
      float* sg = sc + g * sc_stride;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < nk; ++j) m = std::max(m, sg[j]);
      float z = 0;
      for (int64_t j = 0; j < nk; ++j) {
        sg[j] = std::exp(sg[j] - m);
        z += sg[j];
      }
      inv[g - g0] = 1.0f / z;
    }
    std::fill_n(acc, size_t(g1 - g0) * d, 0.f);
    gemm_rows<W>(g1 - g0, d, int(nk), sc + g0 * sc_stride, sc_stride, 1, [=](int j) { return vrows[j]; }, acc, d);
    for (int g = g0; g < g1; ++g) {
      float* o = out + int64_t(g) * d;
      const float* a = acc + int64_t(g - g0) * d;
      for (int b = 0; b < d; ++b) o[b] = a[b] * inv[g - g0];
    }
  }
}

// Entry points: the AVX2 instantiation when the CPU has it, else the baseline one.
#if defined(__x86_64__) && defined(__GNUC__)
bool cpu_has_avx2() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
}
#define SALA_KERNEL(name)                                                              \
  template <typename... Args>                                                          \
  __attribute__((target("avx2"))) void name##_avx2(Args... args) {                     \
    name##_impl<8>(args...);                                                           \
  }                                                                                    \
  template <typename... Args>                                                          \
  void name(Args... args) {                                                            \
    if (cpu_has_avx2())                                                                \
      name##_avx2(args...);                                                            \
    else                                                                               \
      name##_impl<4>(args...);                                                         \
  }
#else
#define SALA_KERNEL(name)          \
  template <typename... Args>      \
  void name(Args... args) {        \
    name##_impl<4>(args...);       \
  }
#endif
SALA_KERNEL(gla_recurrent)
SALA_KERNEL(gla_chunked)
SALA_KERNEL(stage1_scores)
SALA_KERNEL(attend_rows)
#undef SALA_KERNEL

}  // namespace

// ---------------------------------------------------------------------------------------------
// Lightning (Simple GLA)
// ---------------------------------------------------------------------------------------------

void CpuBackend::lightning_attention(int layer, const Mat& q, const Mat& k, const Mat& v, Mat out) {
  SALA_CHECK(batch_, "cpu lightning_attention: begin_batch was not called");
  SALA_CHECK(layer >= 0 && layer < spec_.lightning_layers, "cpu lightning_attention: layer {} out of range [0, {})",
             layer, spec_.lightning_layers);
  const int d = spec_.lightning_dim, H = spec_.lightning_heads;
  SALA_CHECK(d > 0 && q.cols == int64_t(H) * d && out.cols == q.cols,
             "cpu lightning_attention: q/out width {}/{} != heads {} x dim {}", q.cols, out.cols, H, d);
  SALA_CHECK(k.cols == v.cols && k.cols % d == 0 && k.cols > 0, "cpu lightning_attention: k/v width {}/{}", k.cols,
             v.cols);
  const int Hkv = int(k.cols / d);
  SALA_CHECK(H % Hkv == 0, "cpu lightning_attention: {} q heads not a multiple of {} kv heads", H, Hkv);
  SALA_CHECK(q.rows == k.rows && q.rows == v.rows && q.rows == out.rows && q.rows == batch_->n_tokens(),
             "cpu lightning_attention: {} rows for a batch of {} tokens", q.rows, batch_->n_tokens());
  SALA_CHECK(int(spec_.log_decay.size()) == H, "cpu lightning_attention: {} log-decays for {} heads",
             spec_.log_decay.size(), H);
  const int rep = H / Hkv;
  const float* Q = f32_data(q, "lightning_attention");
  const float* Kp = f32_data(k, "lightning_attention");
  const float* Vp = f32_data(v, "lightning_attention");
  float* O = f32_data(out, "lightning_attention");
  const float s = spec_.lightning_scale;
  const auto& seqs = batch_->seqs;
  for (const auto& e : seqs) {
    SALA_CHECK(e.slot >= 0 && e.slot < spec_.max_slots, "cpu lightning_attention: slot {} out of range", e.slot);
    SALA_CHECK(e.start >= 0 && e.n_new >= 0 && e.start + e.n_new <= q.rows,
               "cpu lightning_attention: rows [{}, {}) outside the batch", e.start, e.start + e.n_new);
  }

  const int64_t items = int64_t(seqs.size()) * H;
  pool_.parallel_for(items, [&](int64_t i0, int64_t i1) {
    std::vector<float> acc(static_cast<size_t>(kChunk) * d), kd(static_cast<size_t>(kChunk) * d),
        att(size_t(kChunk) * kChunk), ex(kChunk + 1);
    for (int64_t item = i0; item < i1; ++item) {
      const SeqEntry& e = seqs[size_t(item / H)];
      const int h = int(item % H), kh = h / rep;
      const int64_t n = e.n_new;
      if (n == 0) continue;
      float* S = state(e.slot, layer) + size_t(h) * d * d;
      const float g = spec_.log_decay[size_t(h)];
      const Rows qr{Q + e.start * q.cols + int64_t(h) * d, q.cols};
      const Rows kr{Kp + e.start * k.cols + int64_t(kh) * d, k.cols};
      const Rows vr{Vp + e.start * v.cols + int64_t(kh) * d, v.cols};
      float* o = O + e.start * out.cols + int64_t(h) * d;
      if (n < kChunk) {
        gla_recurrent(S, d, float(std::exp(double(g))), s, n, qr, kr, vr, o, out.cols);
      } else {
        // Exponentials from the fp32 log-decay, never powers of a rounded γ.
        for (int m = 0; m <= kChunk; ++m) ex[size_t(m)] = float(std::exp(double(m) * double(g)));
        gla_chunked(S, d, s, ex.data(), n, qr, kr, vr, o, out.cols, acc.data(), att.data(), kd.data());
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Sparse (InfLLM-v2) layers
// ---------------------------------------------------------------------------------------------

void CpuBackend::sparse_attention(int layer, const Mat& q, const Mat& k, const Mat& v, Mat out) {
  SALA_CHECK(batch_, "cpu sparse_attention: begin_batch was not called");
  SALA_CHECK(layer >= 0 && layer < spec_.sparse_layers, "cpu sparse_attention: layer {} out of range [0, {})", layer,
             spec_.sparse_layers);
  const int d = spec_.head_dim, Hq = spec_.q_heads, Hkv = spec_.kv_heads;
  SALA_CHECK(Hkv > 0 && Hq % Hkv == 0, "cpu sparse_attention: {} q heads vs {} kv heads", Hq, Hkv);
  SALA_CHECK(q.cols == int64_t(Hq) * d && out.cols == q.cols && k.cols == int64_t(Hkv) * d && v.cols == k.cols,
             "cpu sparse_attention: widths q {} k {} v {} out {} for {}/{} heads of {}", q.cols, k.cols, v.cols,
             out.cols, Hq, Hkv, d);
  SALA_CHECK(q.rows == k.rows && q.rows == v.rows && q.rows == out.rows && q.rows == batch_->n_tokens(),
             "cpu sparse_attention: {} rows for a batch of {} tokens", q.rows, batch_->n_tokens());
  const int G = Hq / Hkv;
  const int bs = spec_.block_size;
  const int64_t row_w = int64_t(Hkv) * d;
  const float* Q = f32_data(q, "sparse_attention");
  const float* Kp = f32_data(k, "sparse_attention");
  const float* Vp = f32_data(v, "sparse_attention");
  float* O = f32_data(out, "sparse_attention");
  const float scale = spec_.attn_scale;
  const sparse::BlockGeometry geo = sparse::BlockGeometry::from(spec_);
  const int ks = spec_.kernel_size, st = spec_.kernel_stride;
  const auto& seqs = batch_->seqs;

  // (1) Append the new k, v rows to the pages.
  int64_t max_T = 0;
  std::vector<int32_t> row_seq(size_t(q.rows), -1);
  for (size_t si = 0; si < seqs.size(); ++si) {
    const SeqEntry& e = seqs[si];
    const int64_t T = e.cached + e.n_new;
    SALA_CHECK(e.start >= 0 && e.n_new >= 0 && e.cached >= 0 && e.start + e.n_new <= q.rows,
               "cpu sparse_attention: rows [{}, {}) outside the batch", e.start, e.start + e.n_new);
    SALA_CHECK(int64_t(e.pages.size()) * bs >= T, "cpu sparse_attention: {} pages do not hold {} tokens",
               e.pages.size(), T);
    max_T = std::max(max_T, T);
    for (int64_t t = 0; t < e.n_new; ++t) {
      const int64_t p = e.cached + t;
      const int page = e.pages[size_t(p / bs)], off = int(p % bs);
      std::memcpy(k_row(layer, page, off), Kp + (e.start + t) * k.cols, size_t(row_w) * 4);
      std::memcpy(v_row(layer, page, off), Vp + (e.start + t) * v.cols, size_t(row_w) * 4);
      row_seq[size_t(e.start + t)] = int32_t(si);
    }
  }

  // (2) Extend K1 and K2 with the chunks completed by this call: mean of the window's K rows.
  struct ChunkJob {
    int32_t seq;
    int32_t level;  // 1 or 2
    int64_t chunk;
  };
  std::vector<ChunkJob> jobs;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const SeqEntry& e = seqs[si];
    const int64_t T = e.cached + e.n_new;
    for (int64_t c = geo.n1(e.cached); c < geo.n1(T); ++c) jobs.push_back({int32_t(si), 1, c});
    for (int64_t c = geo.n2(e.cached); c < geo.n2(T); ++c) jobs.push_back({int32_t(si), 2, c});
  }
  pool_.parallel_for(int64_t(jobs.size()), [&](int64_t j0, int64_t j1) {
    std::vector<float> sum(static_cast<size_t>(row_w));
    for (int64_t j = j0; j < j1; ++j) {
      const ChunkJob& job = jobs[size_t(j)];
      const SeqEntry& e = seqs[size_t(job.seq)];
      const int64_t window = job.level == 1 ? ks : 4 * int64_t(ks);
      const int64_t first = job.chunk * (job.level == 1 ? st : 4 * int64_t(st));
      std::fill(sum.begin(), sum.end(), 0.f);
      for (int64_t p = first; p < first + window; ++p) {
        const float* kr = k_row(layer, e.pages[size_t(p / bs)], int(p % bs));
        for (int64_t x = 0; x < row_w; ++x) sum[size_t(x)] += kr[x];
      }
      float* dst = job.level == 1 ? k1_row(layer, job.chunk, e.pages) : k2_row(layer, job.chunk, e.pages);
      for (int64_t x = 0; x < row_w; ++x) dst[x] = sum[size_t(x)] / float(window);
    }
  });

  // (3) Attention. Work item = (token row, kv head, slice of the group's q heads); the head split
  // only exists to keep every thread busy when there are fewer (token, kv head) pairs than threads.
  for (int64_t r = 0; r < q.rows; ++r)
    SALA_CHECK(row_seq[size_t(r)] >= 0, "cpu sparse_attention: batch row {} belongs to no sequence", r);
  const int64_t pairs = q.rows * Hkv;
  const int slices = int(std::clamp<int64_t>((pool_.size() + pairs - 1) / std::max<int64_t>(pairs, 1), 1, G));
  const int per_slice = (G + slices - 1) / slices;
  constexpr float pos_inf = std::numeric_limits<float>::infinity();

  pool_.parallel_for(pairs * slices, [&](int64_t i0, int64_t i1) {
    std::vector<float> sc(size_t(per_slice) * size_t(max_T));  // [head in slice][key]
    std::vector<float> acc(static_cast<size_t>(std::min(per_slice, 64)) * d);
    std::vector<float> chunk_score, lse(static_cast<size_t>(G)), k2s;
    std::vector<int32_t> sel;
    sparse::SelectScratch sel_scratch;
    std::vector<const float*> krows, vrows, k1p, k2p;
    krows.reserve(size_t(max_T));
    vrows.reserve(size_t(max_T));
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t r = item / (int64_t(Hkv) * slices);
      const int h = int((item / slices) % Hkv);
      const int slice = int(item % slices);
      const int g0 = slice * per_slice, g1 = std::min(G, g0 + per_slice);
      if (g0 >= g1) continue;
      const SeqEntry& e = seqs[size_t(row_seq[size_t(r)])];
      const int64_t p = e.cached + (r - e.start);
      const int64_t T = e.cached + e.n_new;
      const int64_t qb = p / bs;
      auto qhead = [&](int g) { return Q + r * q.cols + int64_t(h * G + g) * d; };

      // Block selection (ascending block indices).
      sel.clear();
      if (!e.sparse || qb + 1 <= geo.budget(T)) {
        for (int64_t b = 0; b <= qb; ++b) sel.push_back(int32_t(b));
      } else {
        // Stage 1 (§4.5): compressed-LSE scores of the visible K1 columns that can matter.
        const int64_t nv1 = geo.n1(p + 1), nv2 = geo.n2(p + 1);
        const int64_t ncol = std::min(nv1, geo.scored_columns(qb));
        chunk_score.assign(size_t(std::max<int64_t>(ncol, 0)), 0.f);
        if (nv2 == 0) {
          std::fill(chunk_score.begin(), chunk_score.end(), pos_inf);
        } else if (ncol > 0) {
          k2p.resize(size_t(nv2));
          k1p.resize(size_t(ncol));
          for (int64_t c = 0; c < nv2; ++c) k2p[size_t(c)] = k2_row(layer, c, e.pages) + int64_t(h) * d;
          for (int64_t c = 0; c < ncol; ++c) k1p[size_t(c)] = k1_row(layer, c, e.pages) + int64_t(h) * d;
          k2s.resize(size_t(G) * size_t(std::max(nv2, ncol)));
          stage1_scores(qhead(0), G, d, scale, k2p.data(), nv2, k1p.data(), ncol, k2s.data(), lse.data(),
                        chunk_score.data());
        }
        // Stages 1b/1c (§4.6–4.7): pooling, forced blocks, deterministic top-K of past blocks.
        sparse::select_blocks(geo, chunk_score.data(), ncol, p, T, sel, sel_scratch);
      }

      // Stage 2 (§4.8) / dense (§4.3): softmax over keys j ≤ p in the selected blocks.
      krows.clear();
      vrows.clear();
      for (int32_t b : sel) {
        const int page = e.pages[size_t(b)];
        const int64_t n_in = std::min<int64_t>(bs, p + 1 - int64_t(b) * bs);
        for (int64_t o = 0; o < n_in; ++o) {
          krows.push_back(k_row(layer, page, int(o)) + int64_t(h) * d);
          vrows.push_back(v_row(layer, page, int(o)) + int64_t(h) * d);
        }
      }
      attend_rows(qhead(g0), g1 - g0, d, scale, krows.data(), vrows.data(), int64_t(krows.size()), sc.data(), max_T,
                  acc.data(), O + r * out.cols + int64_t(h * G + g0) * d);
    }
  });
}

}  // namespace sala
