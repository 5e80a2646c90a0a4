// CPU attention ops (f32): Simple-GLA for lightning layers, dense / InfLLM-v2 for sparse layers.
//
// lightning_attention (spec §3.6–3.8), per (sequence, q head), state S[d][d] f32 in its slot:
//   * Lq < 64: the recurrence, one fused pass over S per token: S = γS + k⊗v, o = s·qᵀS.
//     2·d² MAC per token and head (d = 128: 32 K MAC); S (64 KiB) is read and written once per
//     token, so decode is bound by L2 bandwidth on the state (32 heads: 4 MiB moved per layer).
//   * Lq ≥ 64: chunked-parallel form (§3.7) with C = 64 and e[m] = exp(m·g) from the fp32
//     log-decay: inter q·S_in, intra causal (q·k)·e[i−j]·v, S_out = e[C']S_in + Σ e[C'−1−j] k⊗v.
//     2·d² + C·d MAC per token and head, S touched twice per chunk instead of twice per token.
//   Both forms equal the recurrence to f32 rounding (tests: ~1e-7 relative).
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
// Scratch is allocated once per thread piece, never per token. Outputs must not alias inputs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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
inline float dot(const float* __restrict a, const float* __restrict b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) acc[u] += a[i + u] * b[i + u];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a·x
inline void axpy(float a, const float* __restrict x, float* __restrict y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

constexpr int kChunk = 64;  // GLA chunk length (and the Lq threshold for the chunked form)

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
    std::vector<float> acc(size_t(kChunk) * d), att(size_t(kChunk) * kChunk), ex(kChunk + 1);
    for (int64_t item = i0; item < i1; ++item) {
      const SeqEntry& e = seqs[size_t(item / H)];
      const int h = int(item % H), kh = h / rep;
      const int64_t n = e.n_new;
      if (n == 0) continue;
      float* S = state(e.slot, layer) + size_t(h) * d * d;
      const float g = spec_.log_decay[size_t(h)];
      auto qrow = [&](int64_t t) { return Q + (e.start + t) * q.cols + int64_t(h) * d; };
      auto krow = [&](int64_t t) { return Kp + (e.start + t) * k.cols + int64_t(kh) * d; };
      auto vrow = [&](int64_t t) { return Vp + (e.start + t) * v.cols + int64_t(kh) * d; };
      auto orow = [&](int64_t t) { return O + (e.start + t) * out.cols + int64_t(h) * d; };

      if (n < kChunk) {
        // Recurrence (§3.6): one fused pass over S per token.
        const float gamma = float(std::exp(double(g)));
        float* o = acc.data();
        for (int64_t t = 0; t < n; ++t) {
          const float *qt = qrow(t), *kt = krow(t), *vt = vrow(t);
          std::fill_n(o, d, 0.f);
          for (int a = 0; a < d; ++a) {
            float* Sa = S + size_t(a) * d;
            const float ka = kt[a], qa = qt[a];
            for (int b = 0; b < d; ++b) {
              const float x = gamma * Sa[b] + ka * vt[b];
              Sa[b] = x;
              o[b] += qa * x;
            }
          }
          float* ot = orow(t);
          for (int b = 0; b < d; ++b) ot[b] = s * o[b];
        }
        continue;
      }

      // Chunked-parallel form (§3.7), C = 64; ex[m] = exp(m·g) from the fp32 log-decay.
      for (int m = 0; m <= kChunk; ++m) ex[size_t(m)] = float(std::exp(double(m) * double(g)));
      for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const int L = int(std::min<int64_t>(kChunk, n - c0));
        float* A = acc.data();  // [L][d] output accumulators
        std::fill_n(A, size_t(L) * d, 0.f);
        // Inter-chunk: A[i] = ex[i+1] · (q_iᵀ S_in), four rows per pass over S.
        int i = 0;
        for (; i + 4 <= L; i += 4) {
          const float *q0 = qrow(c0 + i), *q1 = qrow(c0 + i + 1), *q2 = qrow(c0 + i + 2), *q3 = qrow(c0 + i + 3);
          float *a0 = A + size_t(i) * d, *a1 = a0 + d, *a2 = a1 + d, *a3 = a2 + d;
          for (int a = 0; a < d; ++a) {
            const float* Sa = S + size_t(a) * d;
            const float x0 = q0[a], x1 = q1[a], x2 = q2[a], x3 = q3[a];
            for (int b = 0; b < d; ++b) {
              const float sv = Sa[b];
              a0[b] += x0 * sv;
              a1[b] += x1 * sv;
              a2[b] += x2 * sv;
              a3[b] += x3 * sv;
            }
          }
        }
        for (; i < L; ++i) {
          const float* qi = qrow(c0 + i);
          float* ai = A + size_t(i) * d;
          for (int a = 0; a < d; ++a) axpy(qi[a], S + size_t(a) * d, ai, d);
        }
        for (i = 0; i < L; ++i) {
          float* ai = A + size_t(i) * d;
          const float f = ex[size_t(i + 1)];
          for (int b = 0; b < d; ++b) ai[b] *= f;
        }
        // Intra-chunk, causal including the diagonal: A[i] += Σ_{j≤i} ex[i−j]·(q_i·k_j)·v_j.
        float* W = att.data();
        for (i = 0; i < L; ++i) {
          const float* qi = qrow(c0 + i);
          for (int j = 0; j <= i; ++j) W[size_t(i) * kChunk + j] = ex[size_t(i - j)] * dot(qi, krow(c0 + j), d);
        }
        for (i = 0; i < L; ++i) {
          float* ai = A + size_t(i) * d;
          for (int j = 0; j <= i; ++j) axpy(W[size_t(i) * kChunk + j], vrow(c0 + j), ai, d);
          float* oi = orow(c0 + i);
          for (int b = 0; b < d; ++b) oi[b] = s * ai[b];
        }
        // State: S_out = ex[L]·S_in + Σ_j ex[L−1−j]·k_j ⊗ v_j.
        const float fL = ex[size_t(L)];
        for (int a = 0; a < d; ++a) {
          float* Sa = S + size_t(a) * d;
          for (int b = 0; b < d; ++b) Sa[b] *= fL;
          for (int j = 0; j < L; ++j) axpy(ex[size_t(L - 1 - j)] * krow(c0 + j)[a], vrow(c0 + j), Sa, d);
        }
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
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  constexpr float pos_inf = std::numeric_limits<float>::infinity();

  pool_.parallel_for(pairs * slices, [&](int64_t i0, int64_t i1) {
    std::vector<float> sc(size_t(per_slice) * size_t(max_T));  // [head in slice][key]
    std::vector<float> acc(static_cast<size_t>(per_slice) * d), inv(static_cast<size_t>(per_slice));
    std::vector<float> chunk_score, lse(static_cast<size_t>(G)), k2s;
    std::vector<int32_t> sel;
    sparse::SelectScratch sel_scratch;
    std::vector<const float*> krows, vrows;
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
          // Λ[g] = logsumexp_c' (s · q_g · K2[c']) over the visible K2 chunks, max-subtracted.
          k2s.resize(size_t(nv2));
          for (int g = 0; g < G; ++g) {
            const float* qg = qhead(g);
            float m = neg_inf;
            for (int64_t c = 0; c < nv2; ++c) {
              k2s[size_t(c)] = scale * dot(qg, k2_row(layer, c, e.pages) + int64_t(h) * d, d);
              m = std::max(m, k2s[size_t(c)]);
            }
            float z = 0;
            for (int64_t c = 0; c < nv2; ++c) z += std::exp(k2s[size_t(c)] - m);
            lse[size_t(g)] = m + std::log(z);
          }
          // score[c] = Σ_g exp(s · q_g · K1[c] − Λ[g]), summed in g order.
          for (int64_t c = 0; c < ncol; ++c) {
            const float* k1 = k1_row(layer, c, e.pages) + int64_t(h) * d;
            float total = 0;
            for (int g = 0; g < G; ++g) total += std::exp(scale * dot(qhead(g), k1, d) - lse[size_t(g)]);
            chunk_score[size_t(c)] = total;
          }
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
      const int64_t nk = int64_t(krows.size());
      const int ng = g1 - g0;
      for (int64_t j = 0; j < nk; ++j) {
        const float* kr = krows[size_t(j)];
        for (int g = 0; g < ng; ++g) sc[size_t(g) * max_T + j] = scale * dot(qhead(g0 + g), kr, d);
      }
      std::fill(acc.begin(), acc.begin() + size_t(ng) * d, 0.f);
      for (int g = 0; g < ng; ++g) {
        float* sg = sc.data() + size_t(g) * max_T;
        float m = neg_inf;
        for (int64_t j = 0; j < nk; ++j) m = std::max(m, sg[j]);
        float z = 0;
        for (int64_t j = 0; j < nk; ++j) {
          sg[j] = std::exp(sg[j] - m);
          z += sg[j];
        }
        inv[g] = 1.0f / z;
      }
      for (int64_t j = 0; j < nk; ++j) {
        const float* vr = vrows[size_t(j)];
        for (int g = 0; g < ng; ++g) axpy(sc[size_t(g) * max_T + j], vr, acc.data() + size_t(g) * d, d);
      }
      for (int g = 0; g < ng; ++g) {
        float* o = O + r * out.cols + int64_t(h * G + g0 + g) * d;
        const float* a = acc.data() + size_t(g) * d;
        for (int b = 0; b < d; ++b) o[b] = a[b] * inv[g];
      }
    }
  });
}

}  // namespace sala
