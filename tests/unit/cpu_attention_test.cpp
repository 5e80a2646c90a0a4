// Tests of the CPU attention ops (lightning Simple-GLA and sparse InfLLM-v2) against naive
// implementations written here directly from the spec formulas (§3.6, §4.3–4.8), in double, sharing
// no code with the backend. Also the block-selection helper against the numbers of spec §8.6–8.8.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/sparse_select.h"

namespace sala {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- small utilities ----

std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = dist(rng);
    while (x == 0.f);
  }
  return v;
}

template <typename A, typename B>
double rel_err(const A& got, const B& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  EXPECT_GT(den, 0.0) << "reference is all zeros";
  return std::sqrt(num / den);
}

template <typename T>
std::vector<T> slice(const std::vector<T>& v, size_t first, size_t count) {
  return std::vector<T>(v.begin() + first, v.begin() + first + count);
}

// ALiBi slopes for a power-of-two head count (spec §3.5): g[h] = −start^(h+1), start = 2^(−2^−(log2 n − 3)).
std::vector<float> alibi_log_decay(int n) {
  const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(double(n)) - 3)));
  std::vector<float> g(static_cast<size_t>(n));
  for (int h = 0; h < n; ++h) g[size_t(h)] = -float(std::pow(start, h + 1));
  return g;
}

// The test geometry: K1 window 8 stride 4, K2 window 32 stride 16, blocks of 16 tokens, budget
// K = topk + local = 8 blocks (128 tokens); lightning 4 heads of 16.
CacheSpec test_spec(int q_heads = 8, int lightning_heads = 4) {
  CacheSpec s;
  s.sparse_layers = 2;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.q_heads = q_heads;
  s.block_size = 16;
  s.kernel_size = 8;
  s.kernel_stride = 4;
  s.init_blocks = 1;
  s.local_blocks = 4;
  s.topk = 4;
  s.max_pages = 64;
  s.lightning_layers = 2;
  s.lightning_heads = lightning_heads;
  s.lightning_dim = 16;
  s.log_decay = alibi_log_decay(lightning_heads);
  s.lightning_scale = 1.0f / 4.0f;
  s.max_slots = 4;
  s.attn_scale = 1.0f / 4.0f;
  return s;
}

Mat mat(std::vector<float>& v, int64_t rows, int64_t cols) { return {v.data(), DType::F32, rows, cols}; }

// One sequence's part of a packed call.
struct Part {
  int slot = 0;
  std::vector<int32_t> pages;
  int64_t cached = 0;
  bool sparse = false;
  const float *q = nullptr, *k = nullptr, *v = nullptr;  // n rows each, head-major
  int64_t n = 0;
};

// Packs the parts into one batch, runs the op, returns each part's output rows.
std::vector<std::vector<float>> run(CpuBackend& be, bool lightning, int layer, const std::vector<Part>& parts,
                                    int64_t qw, int64_t kw) {
  int64_t N = 0;
  for (const auto& p : parts) N += p.n;
  std::vector<float> Q(size_t(N * qw)), K(size_t(N * kw)), V(size_t(N * kw)), O(size_t(N * qw), 12345.f);
  BatchInfo batch;
  int64_t row = 0;
  for (const auto& p : parts) {
    std::copy_n(p.q, p.n * qw, Q.begin() + row * qw);
    std::copy_n(p.k, p.n * kw, K.begin() + row * kw);
    std::copy_n(p.v, p.n * kw, V.begin() + row * kw);
    SeqEntry e;
    e.slot = p.slot;
    e.start = row;
    e.n_new = p.n;
    e.cached = p.cached;
    e.sparse = p.sparse;
    e.pages = p.pages;
    if (e.pages.empty()) {  // lightning-only callers: any page table long enough satisfies begin_batch
      const int64_t need = (p.cached + p.n + be.spec().block_size - 1) / be.spec().block_size;
      for (int64_t i = 0; i < need; ++i) e.pages.push_back(int32_t(i));
    }
    batch.seqs.push_back(e);
    for (int64_t t = 0; t < p.n; ++t) {
      batch.tokens.push_back(0);
      batch.positions.push_back(int32_t(p.cached + t));
    }
    row += p.n;
  }
  be.begin_batch(batch);
  if (lightning)
    be.lightning_attention(layer, mat(Q, N, qw), mat(K, N, kw), mat(V, N, kw), mat(O, N, qw));
  else
    be.sparse_attention(layer, mat(Q, N, qw), mat(K, N, kw), mat(V, N, kw), mat(O, N, qw));
  std::vector<std::vector<float>> outs;
  row = 0;
  for (const auto& p : parts) {
    outs.push_back(slice(O, size_t(row * qw), size_t(p.n * qw)));
    row += p.n;
  }
  return outs;
}

// Runs one sequence's tokens [0, n) through an op in calls of the given sizes (cycled), starting
// from an empty cache; returns all output rows. `sparse_final`: regime from the final length.
std::vector<float> run_in_calls(CpuBackend& be, bool lightning, int layer, int slot, const std::vector<int32_t>& pages,
                                const std::vector<float>& q, const std::vector<float>& k,
                                const std::vector<float>& v, int64_t n, int64_t qw, int64_t kw,
                                const std::vector<int64_t>& sizes, bool sparse, int64_t cached0 = 0) {
  std::vector<float> out;
  int64_t t = 0;
  for (size_t i = 0; t < n; ++i) {
    const int64_t len = std::min(sizes[i % sizes.size()], n - t);
    Part p;
    p.slot = slot;
    p.pages = pages;
    p.cached = cached0 + t;
    p.sparse = sparse;
    p.q = q.data() + t * qw;
    p.k = k.data() + t * kw;
    p.v = v.data() + t * kw;
    p.n = len;
    auto o = run(be, lightning, layer, {p}, qw, kw);
    out.insert(out.end(), o[0].begin(), o[0].end());
    t += len;
  }
  return out;
}

std::vector<int32_t> iota_pages(int n, int first = 0) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), first);
  return p;
}

// ---- naive Simple GLA (spec §3.6), double ----

// q: [n][H*d], k, v: [n][Hkv*d]; S: [H][d][d] carried in and out. Returns o: [n][H*d].
std::vector<double> naive_gla(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                              int64_t n, int H, int Hkv, int d, const std::vector<float>& g, double s,
                              std::vector<double>& S) {
  S.resize(size_t(H) * d * d, 0.0);
  std::vector<double> o(size_t(n) * H * d, 0.0);
  const int r = H / Hkv;
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < H; ++h) {
      const double gamma = std::exp(double(g[size_t(h)]));
      const float* qt = &q[size_t(t * H * d + h * d)];
      const float* kt = &k[size_t(t * Hkv * d + (h / r) * d)];
      const float* vt = &v[size_t(t * Hkv * d + (h / r) * d)];
      double* Sh = &S[size_t(h) * d * d];
      for (int a = 0; a < d; ++a)
        for (int b = 0; b < d; ++b) Sh[a * d + b] = gamma * Sh[a * d + b] + double(kt[a]) * vt[b];
      for (int b = 0; b < d; ++b) {
        double acc = 0;
        for (int a = 0; a < d; ++a) acc += double(qt[a]) * Sh[a * d + b];
        o[size_t(t * H * d + h * d + b)] = s * acc;
      }
    }
  return o;
}

std::vector<float> read_state(CpuBackend& be, int slot, int layer) {
  const auto& s = be.spec();
  const float* p = be.state(slot, layer);
  return std::vector<float>(p, p + size_t(s.lightning_heads) * s.lightning_dim * s.lightning_dim);
}

// ---- naive attention (spec §4.3–4.8), double, over the logical key history ----

struct NaiveGeo {
  int bs, ks, st, init, local, topk;
  explicit NaiveGeo(const CacheSpec& s)
      : bs(s.block_size), ks(s.kernel_size), st(s.kernel_stride), init(s.init_blocks), local(s.local_blocks),
        topk(s.topk) {}
  int64_t n1(int64_t T) const { return T < ks ? 0 : (T - ks) / st + 1; }
  int64_t n2(int64_t T) const { return T < 4 * ks ? 0 : (T - 4 * ks) / (4 * st) + 1; }
};

// Mean of K rows [first, first + window) (all kv heads): [Hkv*d].
std::vector<double> naive_mean(const std::vector<float>& K, int64_t kw, int64_t first, int64_t window) {
  std::vector<double> m(size_t(kw), 0.0);
  for (int64_t j = first; j < first + window; ++j)
    for (int64_t x = 0; x < kw; ++x) m[size_t(x)] += K[size_t(j * kw + x)];
  for (auto& x : m) x /= double(window);
  return m;
}

// Stage 1 from logits (§4.5): a[g][c'] over visible K2 chunks, b[g][c] over visible K1 chunks;
// returns score[c] for c < ncols (invisible columns 0; +inf for visible ones if no K2 is visible).
std::vector<double> naive_stage1(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b,
                                 int64_t ncols) {
  std::vector<double> score(size_t(ncols), 0.0);
  for (size_t g = 0; g < a.size(); ++g) {
    double lse = -kInf;
    if (!a[g].empty()) {
      const double m = *std::max_element(a[g].begin(), a[g].end());
      double z = 0;
      for (double x : a[g]) z += std::exp(x - m);
      lse = m + std::log(z);
    }
    for (size_t c = 0; c < b[g].size(); ++c) score[c] += lse == -kInf ? kInf : std::exp(b[g][c] - lse);
  }
  return score;
}

double dotd(const float* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return s;
}

// Selected blocks (ascending) for a query at p of a T-token sequence, kv head h (§4.5–4.7).
// qg: the G query-head rows of the group. K: [T][Hkv*d].
std::vector<int64_t> naive_select(const CacheSpec& spec, const std::vector<const float*>& qg,
                                  const std::vector<float>& K, int64_t p, int64_t T, int h, int* dropped = nullptr) {
  const NaiveGeo geo(spec);
  const int d = spec.head_dim;
  const int64_t kw = int64_t(spec.kv_heads) * d;
  const double s = spec.attn_scale;
  const int64_t ncols = geo.n1(T), nv1 = geo.n1(p + 1), nv2 = geo.n2(p + 1);
  std::vector<std::vector<double>> a(qg.size()), b(qg.size());
  for (size_t g = 0; g < qg.size(); ++g) {
    for (int64_t c = 0; c < nv2; ++c) {
      const auto m = naive_mean(K, kw, c * 4 * geo.st, 4 * geo.ks);
      a[g].push_back(s * dotd(qg[g], m.data() + h * d, d));
    }
    for (int64_t c = 0; c < nv1; ++c) {
      const auto m = naive_mean(K, kw, c * geo.st, geo.ks);
      b[g].push_back(s * dotd(qg[g], m.data() + h * d, d));
    }
  }
  const auto score = naive_stage1(a, b, ncols);
  const int64_t NB = (T + geo.bs - 1) / geo.bs, qb = p / geo.bs;
  // (forced, B, k): forced blocks rank first, then B desc, then k asc.
  std::vector<std::tuple<bool, double, int64_t>> cand;
  for (int64_t k = 0; k <= qb; ++k) {  // future blocks are never selected ([ENGINE] rule)
    double B;
    const bool forced = k < geo.init || (qb - geo.local <= k && k <= qb);
    if (forced) {
      B = kInf;
    } else {
      B = -kInf;
      for (int64_t c = 0; c < ncols; ++c)
        if (c * geo.st < (k + 1) * geo.bs && c * geo.st + geo.ks > k * geo.bs) B = std::max(B, score[size_t(c)]);
    }
    cand.emplace_back(forced, B, k);
  }
  std::sort(cand.begin(), cand.end(), [](auto& x, auto& y) {
    if (std::get<0>(x) != std::get<0>(y)) return std::get<0>(x);
    if (std::get<1>(x) != std::get<1>(y)) return std::get<1>(x) > std::get<1>(y);
    return std::get<2>(x) < std::get<2>(y);
  });
  const int64_t K_budget = std::min<int64_t>(geo.topk + geo.local, NB);
  std::vector<int64_t> sel;
  for (int64_t i = 0; i < std::min<int64_t>(K_budget, int64_t(cand.size())); ++i) sel.push_back(std::get<2>(cand[size_t(i)]));
  std::sort(sel.begin(), sel.end());
  if (dropped) *dropped = int(qb + 1 - int64_t(sel.size()));
  return sel;
}

// One query token at position p (all q heads) against the history K, V ([T][Hkv*d]).
// sparse: InfLLM-v2 selection; otherwise dense causal. Returns [Hq*d].
std::vector<double> naive_attend(const CacheSpec& spec, const float* q, const std::vector<float>& K,
                                 const std::vector<float>& V, int64_t p, int64_t T, bool sparse,
                                 int* dropped = nullptr) {
  const int d = spec.head_dim, Hq = spec.q_heads, Hkv = spec.kv_heads, G = Hq / Hkv;
  const int64_t kw = int64_t(Hkv) * d;
  std::vector<double> out(size_t(Hq) * d, 0.0);
  if (dropped) *dropped = 0;
  for (int h = 0; h < Hkv; ++h) {
    std::vector<const float*> qg;
    for (int g = 0; g < G; ++g) qg.push_back(q + (h * G + g) * d);
    std::set<int64_t> blocks;
    if (sparse) {
      int dr = 0;
      for (int64_t b : naive_select(spec, qg, K, p, T, h, &dr)) blocks.insert(b);
      if (dropped) *dropped += dr;
    } else {
      for (int64_t b = 0; b <= p / spec.block_size; ++b) blocks.insert(b);
    }
    for (int g = 0; g < G; ++g) {
      std::vector<double> logits;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j <= p; ++j)
        if (blocks.count(j / spec.block_size)) {
          double x = 0;
          for (int i = 0; i < d; ++i) x += double(qg[size_t(g)][i]) * K[size_t(j * kw + h * d + i)];
          logits.push_back(spec.attn_scale * x);
          keys.push_back(j);
        }
      const double m = *std::max_element(logits.begin(), logits.end());
      double z = 0;
      for (auto& x : logits) z += (x = std::exp(x - m));
      for (size_t i = 0; i < keys.size(); ++i)
        for (int c = 0; c < d; ++c)
          out[size_t((h * G + g) * d + c)] += logits[i] / z * V[size_t(keys[i] * kw + h * d + c)];
    }
  }
  return out;
}

// Naive outputs for the query rows [from, T) of one sequence (q rows indexed by position).
std::vector<double> naive_sequence(const CacheSpec& spec, const std::vector<float>& q, const std::vector<float>& K,
                                   const std::vector<float>& V, int64_t from, int64_t T, bool sparse,
                                   int* dropped_total = nullptr) {
  const int64_t qw = int64_t(spec.q_heads) * spec.head_dim;
  std::vector<double> out;
  if (dropped_total) *dropped_total = 0;
  for (int64_t p = from; p < T; ++p) {
    int dr = 0;
    auto o = naive_attend(spec, q.data() + p * qw, K, V, p, T, sparse, &dr);
    if (dropped_total) *dropped_total += dr;
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}

struct SeqData {
  std::vector<float> q, k, v;
  int64_t qw, kw;
  SeqData(const CacheSpec& s, int64_t n, uint32_t seed)
      : q(random_vec(size_t(n) * s.q_heads * s.head_dim, seed)),
        k(random_vec(size_t(n) * s.kv_heads * s.head_dim, seed + 1)),
        v(random_vec(size_t(n) * s.kv_heads * s.head_dim, seed + 2)),
        qw(int64_t(s.q_heads) * s.head_dim),
        kw(int64_t(s.kv_heads) * s.head_dim) {}
};

// ================================ lightning ================================

TEST(CpuAttention, LightningToySpec85) {
  CacheSpec spec;
  spec.sparse_layers = 1;
  spec.kv_heads = spec.q_heads = 1;
  spec.head_dim = 2;
  spec.block_size = 16;
  spec.kernel_size = 8;
  spec.kernel_stride = 4;
  spec.max_pages = 8;
  spec.lightning_layers = 1;
  spec.lightning_heads = 1;
  spec.lightning_dim = 2;
  spec.log_decay = {float(std::log(0.5))};
  spec.lightning_scale = 1.0f;
  spec.max_slots = 3;
  spec.attn_scale = 1.0f;
  CpuBackend be(2);
  be.create_caches(spec);
  for (int s = 0; s < 3; ++s) be.reset_state(s);

  std::vector<float> q = {1, 1, 1, 0, 0, 1}, k = {1, 0, 0, 1, 1, 1}, v = {1, 2, 3, 4, 1, 1};
  const std::vector<float> want_o = {1, 2, 0.5, 1, 2.5, 3};
  const std::vector<std::vector<float>> want_state = {{1, 2, 0, 0}, {0.5, 1, 3, 4}, {1.25, 1.5, 2.5, 3}};

  // One call of 3 tokens (recurrence).
  auto o = run_in_calls(be, true, 0, 0, {}, q, k, v, 3, 2, 2, {3}, false);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(o[i], want_o[i], 1e-6) << i;
  auto st = read_state(be, 0, 0);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(st[i], want_state[2][i], 1e-6) << i;

  // Token by token: the state after each step.
  for (int64_t t = 0; t < 3; ++t) {
    Part p;
    p.slot = 1;
    p.cached = t;
    p.q = q.data() + 2 * t;
    p.k = k.data() + 2 * t;
    p.v = v.data() + 2 * t;
    p.n = 1;
    auto ot = run(be, true, 0, {p}, 2, 2);
    EXPECT_NEAR(ot[0][0], want_o[size_t(2 * t)], 1e-6);
    EXPECT_NEAR(ot[0][1], want_o[size_t(2 * t + 1)], 1e-6);
    auto s = read_state(be, 1, 0);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(s[i], want_state[size_t(t)][i], 1e-6) << "t=" << t;
  }

  // Chunked path (a 70-token call whose first 3 tokens are the toy): same first rows; the state
  // after 70 tokens equals the naive recurrence.
  auto q2 = random_vec(140, 5), k2 = random_vec(140, 6), v2 = random_vec(140, 7);
  std::copy(q.begin(), q.end(), q2.begin());
  std::copy(k.begin(), k.end(), k2.begin());
  std::copy(v.begin(), v.end(), v2.begin());
  auto oc = run_in_calls(be, true, 0, 2, {}, q2, k2, v2, 70, 2, 2, {70}, false);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(oc[i], want_o[i], 1e-6) << i;
  std::vector<double> S;
  auto naive = naive_gla(q2, k2, v2, 70, 1, 1, 2, spec.log_decay, 1.0, S);
  EXPECT_LT(rel_err(oc, naive), 1e-5);
  EXPECT_LT(rel_err(read_state(be, 2, 0), S), 1e-5);
}

class LightningKv : public ::testing::TestWithParam<int> {};  // param: lightning kv heads (4, or 2 = GQA)

TEST_P(LightningKv, RecurrenceMatchesNaive) {
  const CacheSpec spec = test_spec();
  const int H = spec.lightning_heads, d = spec.lightning_dim, Hkv = GetParam();
  CpuBackend be(2);
  be.create_caches(spec);
  be.reset_state(0);
  const int64_t n = 40;
  auto q = random_vec(size_t(n) * H * d, 11), k = random_vec(size_t(n) * Hkv * d, 12),
       v = random_vec(size_t(n) * Hkv * d, 13);
  auto o = run_in_calls(be, true, 1, 0, {}, q, k, v, n, H * d, Hkv * d, {n}, false);
  std::vector<double> S;
  auto want = naive_gla(q, k, v, n, H, Hkv, d, spec.log_decay, spec.lightning_scale, S);
  EXPECT_LT(rel_err(o, want), 1e-5);
  EXPECT_LT(rel_err(read_state(be, 0, 1), S), 1e-5);
}

TEST_P(LightningKv, ChunkedEqualsTokenByToken) {
  const CacheSpec spec = test_spec();
  const int H = spec.lightning_heads, d = spec.lightning_dim, Hkv = GetParam();
  CpuBackend be(2);
  be.create_caches(spec);
  for (int s = 0; s < 4; ++s) be.reset_state(s);
  // 130 tokens (chunks 64 + 64 + 2) in one call vs one token per call.
  const int64_t n = 130;
  auto q = random_vec(size_t(n) * H * d, 21), k = random_vec(size_t(n) * Hkv * d, 22),
       v = random_vec(size_t(n) * Hkv * d, 23);
  auto chunked = run_in_calls(be, true, 0, 0, {}, q, k, v, n, H * d, Hkv * d, {n}, false);
  auto single = run_in_calls(be, true, 0, 1, {}, q, k, v, n, H * d, Hkv * d, {1}, false);
  EXPECT_LT(rel_err(chunked, single), 1e-5);
  EXPECT_LT(rel_err(read_state(be, 0, 0), read_state(be, 1, 0)), 1e-5);
  std::vector<double> S;
  auto want = naive_gla(q, k, v, n, H, Hkv, d, spec.log_decay, spec.lightning_scale, S);
  EXPECT_LT(rel_err(chunked, want), 1e-5);
  EXPECT_LT(rel_err(read_state(be, 0, 0), S), 1e-5);

  // Chunked with a carried-in state: 70 tokens, then 130 more (both chunked) vs the naive run.
  const int64_t n2 = 200;
  auto q2 = random_vec(size_t(n2) * H * d, 24), k2 = random_vec(size_t(n2) * Hkv * d, 25),
       v2 = random_vec(size_t(n2) * Hkv * d, 26);
  auto two = run_in_calls(be, true, 0, 2, {}, q2, k2, v2, n2, H * d, Hkv * d, {70, 130}, false);
  std::vector<double> S2;
  auto want2 = naive_gla(q2, k2, v2, n2, H, Hkv, d, spec.log_decay, spec.lightning_scale, S2);
  EXPECT_LT(rel_err(two, want2), 1e-5);
  EXPECT_LT(rel_err(slice(two, 70 * H * d, 130 * H * d), slice(want2, 70 * H * d, 130 * H * d)), 1e-5);
  EXPECT_LT(rel_err(read_state(be, 2, 0), S2), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(CpuAttention, LightningKv, ::testing::Values(4, 2));

TEST(CpuAttention, LightningStateCarriedAcrossCalls) {
  const CacheSpec spec = test_spec();
  const int H = spec.lightning_heads, d = spec.lightning_dim;
  CpuBackend be(2);
  be.create_caches(spec);
  be.reset_state(3);
  const int64_t n = 5 + 64 + 1 + 130 + 17 + 63;
  auto q = random_vec(size_t(n) * H * d, 31), k = random_vec(size_t(n) * H * d, 32), v = random_vec(size_t(n) * H * d, 33);
  auto o = run_in_calls(be, true, 1, 3, {}, q, k, v, n, H * d, H * d, {5, 64, 1, 130, 17, 63}, false);
  std::vector<double> S;
  auto want = naive_gla(q, k, v, n, H, H, d, spec.log_decay, spec.lightning_scale, S);
  EXPECT_LT(rel_err(o, want), 1e-5);
  // The last rows alone (after a long history) too.
  EXPECT_LT(rel_err(slice(o, size_t(n - 63) * H * d, 63 * H * d), slice(want, size_t(n - 63) * H * d, 63 * H * d)),
            1e-5);
  EXPECT_LT(rel_err(read_state(be, 3, 1), S), 1e-5);
  // The other layer's state of the slot is untouched.
  for (float x : read_state(be, 3, 0)) ASSERT_EQ(x, 0.f);
}

TEST(CpuAttention, LightningTwoSequencesInOneBatch) {
  const CacheSpec spec = test_spec();
  const int H = spec.lightning_heads, d = spec.lightning_dim, W = H * d;
  CpuBackend be(2);
  be.create_caches(spec);
  for (int s = 0; s < 4; ++s) be.reset_state(s);
  // Sequence A: 70 then 3 tokens; B: 9 then 100 tokens.
  auto qa = random_vec(73 * W, 41), ka = random_vec(73 * W, 42), va = random_vec(73 * W, 43);
  auto qb = random_vec(109 * W, 44), kb = random_vec(109 * W, 45), vb = random_vec(109 * W, 46);
  // Alone: A in slot 1, B in slot 3.
  auto a_alone = run_in_calls(be, true, 0, 1, {}, qa, ka, va, 73, W, W, {70, 3}, false);
  auto b_alone = run_in_calls(be, true, 0, 3, {}, qb, kb, vb, 109, W, W, {9, 100}, false);
  // Together: A in slot 0, B in slot 2.
  std::vector<float> a_batch, b_batch;
  const int64_t a_len[2] = {70, 3}, b_len[2] = {9, 100};
  int64_t at = 0, bt = 0;
  for (int round = 0; round < 2; ++round) {
    Part pa, pb;
    pa.slot = 0;
    pa.cached = at;
    pa.q = qa.data() + at * W;
    pa.k = ka.data() + at * W;
    pa.v = va.data() + at * W;
    pa.n = a_len[round];
    pb.slot = 2;
    pb.cached = bt;
    pb.q = qb.data() + bt * W;
    pb.k = kb.data() + bt * W;
    pb.v = vb.data() + bt * W;
    pb.n = b_len[round];
    // B first in the packed batch in the second round.
    auto outs = round == 0 ? run(be, true, 0, {pa, pb}, W, W) : run(be, true, 0, {pb, pa}, W, W);
    const auto& oa = round == 0 ? outs[0] : outs[1];
    const auto& ob = round == 0 ? outs[1] : outs[0];
    a_batch.insert(a_batch.end(), oa.begin(), oa.end());
    b_batch.insert(b_batch.end(), ob.begin(), ob.end());
    at += a_len[round];
    bt += b_len[round];
  }
  EXPECT_LT(rel_err(a_batch, a_alone), 1e-6);
  EXPECT_LT(rel_err(b_batch, b_alone), 1e-6);
  EXPECT_LT(rel_err(read_state(be, 0, 0), read_state(be, 1, 0)), 1e-6);
  EXPECT_LT(rel_err(read_state(be, 2, 0), read_state(be, 3, 0)), 1e-6);
}

// ================================ sparse ================================

TEST(CpuAttention, SparseDenseMatchesNaive) {
  for (int qh : {2, 8}) {  // G = 1 and G = 4
    const CacheSpec spec = test_spec(qh);
    CpuBackend be(2);
    be.create_caches(spec);
    const int64_t T = 150;
    SeqData s(spec, T, 100 + qh);
    auto o = run_in_calls(be, false, 0, 0, iota_pages(10), s.q, s.k, s.v, T, s.qw, s.kw, {T}, false);
    auto want = naive_sequence(spec, s.q, s.k, s.v, 0, T, false);
    EXPECT_LT(rel_err(o, want), 1e-5) << "q_heads " << qh;
    // The same through decode-sized calls.
    CpuBackend be2(2);
    be2.create_caches(spec);
    auto o2 = run_in_calls(be2, false, 1, 0, iota_pages(10), s.q, s.k, s.v, T, s.qw, s.kw, {1, 5, 17, 64}, false);
    EXPECT_LT(rel_err(o2, want), 1e-5) << "q_heads " << qh;
  }
}

TEST(CpuAttention, SparseChunkSizeDoesNotChangeResults) {
  const CacheSpec spec = test_spec();
  const int64_t T = 300;
  SeqData s(spec, T, 200);
  const auto pages = iota_pages(19);
  for (bool sparse : {false, true}) {
    CpuBackend one(2), many(2), tiny(1), wide(8);
    for (auto* be : {&one, &many, &tiny, &wide}) be->create_caches(spec);
    auto o1 = run_in_calls(one, false, 0, 0, pages, s.q, s.k, s.v, T, s.qw, s.kw, {T}, sparse);
    auto o2 = run_in_calls(many, false, 0, 0, pages, s.q, s.k, s.v, T, s.qw, s.kw, {1, 5, 17, 64}, sparse);
    auto o3 = run_in_calls(tiny, false, 0, 0, pages, s.q, s.k, s.v, T, s.qw, s.kw, {64, 17, 5, 1}, sparse);
    // 8 threads: decode calls split the q heads of a kv head across threads.
    auto o4 = run_in_calls(wide, false, 0, 0, pages, s.q, s.k, s.v, T, s.qw, s.kw, {1, 1, 3, 100}, sparse);
    EXPECT_LT(rel_err(o2, o1), 1e-6) << "sparse " << sparse;
    EXPECT_LT(rel_err(o3, o1), 1e-6) << "sparse " << sparse;
    EXPECT_LT(rel_err(o4, o1), 1e-6) << "sparse " << sparse;
  }
}

TEST(CpuAttention, SparseCompressedKeysAreMeans) {
  const CacheSpec spec = test_spec();
  const NaiveGeo geo(spec);
  const int64_t T = 300;
  SeqData s(spec, T, 300);
  const std::vector<int32_t> pages = {7, 2, 9, 0, 63, 5, 11, 30, 31, 12, 4, 50, 51, 6, 8, 20, 1, 3, 40};
  CpuBackend be(2);
  be.create_caches(spec);
  int64_t t = 0;
  int step = 0;
  const int64_t sizes[] = {1, 5, 17, 64, 1, 1, 3};
  while (t < T) {
    const int64_t len = std::min(sizes[step++ % 7], T - t);
    Part p;
    p.pages = pages;
    p.cached = t;
    p.sparse = true;
    p.q = s.q.data() + t * s.qw;
    p.k = s.k.data() + t * s.kw;
    p.v = s.v.data() + t * s.kw;
    p.n = len;
    run(be, false, 1, {p}, s.qw, s.kw);
    t += len;
    // After every call the compressed caches hold exactly n1(t), n2(t) means.
    for (int64_t c = 0; c < geo.n1(t); ++c) {
      const float* row = be.k1_row(1, c, pages);
      std::vector<float> got(row, row + s.kw);
      ASSERT_LT(rel_err(got, naive_mean(s.k, s.kw, c * geo.st, geo.ks)), 1e-6) << "K1 chunk " << c << " t " << t;
    }
    for (int64_t c = 0; c < geo.n2(t); ++c) {
      const float* row = be.k2_row(1, c, pages);
      std::vector<float> got(row, row + s.kw);
      ASSERT_LT(rel_err(got, naive_mean(s.k, s.kw, c * 4 * geo.st, 4 * geo.ks)), 1e-6) << "K2 chunk " << c;
    }
  }
  EXPECT_EQ(geo.n1(T), 74);
  EXPECT_EQ(geo.n2(T), 17);
  // The raw rows landed in the right pages.
  for (int64_t p = 0; p < T; ++p) {
    const float* kr = be.k_row(1, pages[size_t(p / 16)], int(p % 16));
    const float* vr = be.v_row(1, pages[size_t(p / 16)], int(p % 16));
    ASSERT_EQ(std::vector<float>(kr, kr + s.kw), slice(s.k, size_t(p * s.kw), size_t(s.kw)));
    ASSERT_EQ(std::vector<float>(vr, vr + s.kw), slice(s.v, size_t(p * s.kw), size_t(s.kw)));
  }
}

TEST(CpuAttention, SparseStage1ToySpec89) {
  // Checks the test's own naive stage 1 against the spec's hand numbers.
  const double ln2 = std::log(2.0), ln3 = std::log(3.0);
  auto sc = naive_stage1({{0.0, ln3}}, {{ln2, 0.0}}, 3);
  EXPECT_NEAR(sc[0], 0.5, 1e-12);
  EXPECT_NEAR(sc[1], 0.25, 1e-12);
  EXPECT_EQ(sc[2], 0.0);
  auto sum = naive_stage1({{0.0, ln3}, {0.0, ln3}}, {{ln2, 0.0}, {0.0, ln2}}, 3);
  EXPECT_NEAR(sum[0], 0.75, 1e-12);
  EXPECT_NEAR(sum[1], 0.75, 1e-12);
}

TEST(CpuAttention, SparseMatchesNaiveInfLLM) {
  for (int qh : {2, 8}) {
    const CacheSpec spec = test_spec(qh);
    const int64_t T = 300;
    SeqData s(spec, T, 400 + qh);
    int dropped = 0;
    auto want = naive_sequence(spec, s.q, s.k, s.v, 0, T, true, &dropped);
    EXPECT_GT(dropped, 100) << "the sparse path must drop blocks in this test";
    CpuBackend be(2);
    be.create_caches(spec);
    auto o = run_in_calls(be, false, 0, 0, iota_pages(19), s.q, s.k, s.v, T, s.qw, s.kw, {T}, true);
    EXPECT_LT(rel_err(o, want), 1e-5) << "q_heads " << qh;
    // Row by row, so one wrong selection cannot hide in the total.
    for (int64_t p = 0; p < T; ++p)
      ASSERT_LT(rel_err(slice(o, size_t(p * s.qw), size_t(s.qw)), slice(want, size_t(p * s.qw), size_t(s.qw))),
                1e-5)
          << "position " << p;
    CpuBackend be2(2);
    be2.create_caches(spec);
    auto o2 = run_in_calls(be2, false, 0, 0, iota_pages(19), s.q, s.k, s.v, T, s.qw, s.kw, {17, 1, 64, 5}, true);
    EXPECT_LT(rel_err(o2, want), 1e-5) << "q_heads " << qh;
  }
}

TEST(CpuAttention, SparseEqualsDenseWhileBudgetCoversAllBlocks) {
  const CacheSpec spec = test_spec();
  const int64_t T = 300, covered = int64_t(spec.topk + spec.local_blocks) * spec.block_size;  // 128
  SeqData s(spec, T, 500);
  CpuBackend a(2), b(2);
  a.create_caches(spec);
  b.create_caches(spec);
  auto sp = run_in_calls(a, false, 0, 0, iota_pages(19), s.q, s.k, s.v, T, s.qw, s.kw, {T}, true);
  auto de = run_in_calls(b, false, 0, 0, iota_pages(19), s.q, s.k, s.v, T, s.qw, s.kw, {T}, false);
  for (int64_t p = 0; p < T; ++p) {
    const double e = rel_err(slice(sp, size_t(p * s.qw), size_t(s.qw)), slice(de, size_t(p * s.qw), size_t(s.qw)));
    if (p < covered)
      EXPECT_LT(e, 1e-6) << "position " << p;
    else
      EXPECT_GT(e, 1e-3) << "position " << p << ": sparse should drop blocks here";
  }
}

TEST(CpuAttention, SparseTwoSequencesInOneBatch) {
  const CacheSpec spec = test_spec();
  // A: 200 cached + 100 new, sparse (final length 300); B: 40 cached + 7 new, dense.
  SeqData A(spec, 300, 600), B(spec, 47, 610);
  const auto pages_a = iota_pages(19), pages_b = iota_pages(3, 20);
  CpuBackend alone(2), together(2);
  alone.create_caches(spec);
  together.create_caches(spec);
  auto a_alone = run_in_calls(alone, false, 0, 0, pages_a, A.q, A.k, A.v, 300, A.qw, A.kw, {200, 100}, true);
  auto b_alone = run_in_calls(alone, false, 0, 1, pages_b, B.q, B.k, B.v, 47, B.qw, B.kw, {40, 7}, false);
  std::vector<float> a_t, b_t;
  const int64_t a_len[2] = {200, 100}, b_len[2] = {40, 7};
  int64_t at = 0, bt = 0;
  for (int round = 0; round < 2; ++round) {
    Part pa, pb;
    pa.slot = 0;
    pa.pages = pages_a;
    pa.cached = at;
    pa.sparse = true;
    pa.q = A.q.data() + at * A.qw;
    pa.k = A.k.data() + at * A.kw;
    pa.v = A.v.data() + at * A.kw;
    pa.n = a_len[round];
    pb.slot = 1;
    pb.pages = pages_b;
    pb.cached = bt;
    pb.sparse = false;
    pb.q = B.q.data() + bt * B.qw;
    pb.k = B.k.data() + bt * B.kw;
    pb.v = B.v.data() + bt * B.kw;
    pb.n = b_len[round];
    auto outs = round == 0 ? run(together, false, 0, {pa, pb}, A.qw, A.kw) : run(together, false, 0, {pb, pa}, A.qw, A.kw);
    const auto& oa = round == 0 ? outs[0] : outs[1];
    const auto& ob = round == 0 ? outs[1] : outs[0];
    a_t.insert(a_t.end(), oa.begin(), oa.end());
    b_t.insert(b_t.end(), ob.begin(), ob.end());
    at += a_len[round];
    bt += b_len[round];
  }
  EXPECT_LT(rel_err(a_t, a_alone), 1e-6);
  EXPECT_LT(rel_err(b_t, b_alone), 1e-6);
  // And both against the naive definitions.
  EXPECT_LT(rel_err(slice(a_t, 200 * size_t(A.qw), 100 * size_t(A.qw)), naive_sequence(spec, A.q, A.k, A.v, 200, 300, true)),
            1e-5);
  EXPECT_LT(rel_err(b_t, naive_sequence(spec, B.q, B.k, B.v, 0, 47, false)), 1e-5);
}

TEST(CpuAttention, SparseNonContiguousPages) {
  const CacheSpec spec = test_spec();
  const int64_t T = 300;
  SeqData s(spec, T, 700);
  const std::vector<int32_t> scattered = {7, 2, 9, 0, 63, 5, 11, 30, 31, 12, 4, 50, 51, 6, 8, 20, 1, 3, 40};
  for (bool sparse : {false, true}) {
    CpuBackend a(2), b(2);
    a.create_caches(spec);
    b.create_caches(spec);
    auto o1 = run_in_calls(a, false, 1, 0, iota_pages(19), s.q, s.k, s.v, T, s.qw, s.kw, {33, 1, 64}, sparse);
    auto o2 = run_in_calls(b, false, 1, 0, scattered, s.q, s.k, s.v, T, s.qw, s.kw, {33, 1, 64}, sparse);
    EXPECT_LT(rel_err(o2, o1), 1e-6) << "sparse " << sparse;
  }
}

// Speed figures for the tiny model's shapes (printed; the bound only catches pathologies).
TEST(CpuAttention, TinyModelSpeed) {
  CacheSpec spec = test_spec(4, 4);
  spec.max_pages = 64;
  const int64_t T = 400;
  SeqData s(spec, T, 800);
  const int W = spec.lightning_heads * spec.lightning_dim;
  auto ql = random_vec(size_t(T) * W, 801), kl = random_vec(size_t(T) * W, 802), vl = random_vec(size_t(T) * W, 803);
  CpuBackend be(2);
  be.create_caches(spec);
  be.reset_state(0);
  be.reset_state(1);
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  run_in_calls(be, false, 0, 0, iota_pages(25), s.q, s.k, s.v, T, s.qw, s.kw, {T}, true);
  run_in_calls(be, true, 0, 0, {}, ql, kl, vl, T, W, W, {T}, false);
  auto t1 = clock::now();
  run_in_calls(be, false, 1, 1, iota_pages(25, 30), s.q, s.k, s.v, T, s.qw, s.kw, {1}, true);
  run_in_calls(be, true, 1, 1, {}, ql, kl, vl, T, W, W, {1}, false);
  auto t2 = clock::now();
  const double prefill = std::chrono::duration<double>(t1 - t0).count(),
               decode = std::chrono::duration<double>(t2 - t1).count();
  std::printf("[ speed    ] 400-token prefill, one sparse + one lightning layer: %.2f ms; 400 decode steps: %.2f ms\n",
              prefill * 1e3, decode * 1e3);
  EXPECT_LT(prefill + decode, 2.0);
}

}  // namespace

// ================================ block selection helper ================================

namespace {

sparse::BlockGeometry real_geometry() { return {64, 32, 16, 1, 32, 64}; }

TEST(SparseSelect, CountsSpec86) {
  const auto g = real_geometry();
  struct Row {
    int64_t T, n1, n2, NB;
  };
  const Row rows[] = {{31, 0, 0, 1},         {32, 1, 0, 1},        {48, 2, 0, 1},           {127, 6, 0, 2},
                      {128, 7, 1, 2},        {192, 11, 2, 3},      {2048, 127, 31, 32},     {8191, 510, 126, 128},
                      {8192, 511, 127, 128}, {10000, 624, 155, 157}, {32768, 2047, 511, 512}, {131072, 8191, 2047, 2048},
                      {524288, 32767, 8191, 8192}};
  for (const auto& r : rows) {
    EXPECT_EQ(g.n1(r.T), r.n1) << r.T;
    EXPECT_EQ(g.n2(r.T), r.n2) << r.T;
    EXPECT_EQ(g.n_blocks(r.T), r.NB) << r.T;
    if (r.T >= 8192) {
      EXPECT_EQ(g.budget(r.T), 96) << r.T;
    }
  }
  EXPECT_EQ(g.n1(8192), 511);  // §8.6: visible counts for p = 8191
  EXPECT_EQ(g.n2(8192), 127);
}

TEST(SparseSelect, PoolingWindowsSpec87) {
  const auto g = real_geometry();
  EXPECT_EQ(g.pool_range(0), std::make_pair(int64_t(0), int64_t(3)));
  EXPECT_EQ(g.pool_range(1), std::make_pair(int64_t(3), int64_t(7)));
  EXPECT_EQ(g.pool_range(5), std::make_pair(int64_t(19), int64_t(23)));
  EXPECT_EQ(g.pool_range(100), std::make_pair(int64_t(399), int64_t(403)));
}

TEST(SparseSelect, ForcedBlocksAndFreePicksSpec88) {
  const auto g = real_geometry();
  struct Row {
    int64_t p, qb;
    std::vector<std::pair<int64_t, int64_t>> forced;  // inclusive ranges
    int n_forced, free_picks;
    int64_t free_hi;  // free picks come from {1 … free_hi}
  };
  const std::vector<Row> rows = {
      {0, 0, {{0, 0}}, 1, 0, 0},
      {64, 1, {{0, 1}}, 2, 0, 0},
      {2111, 32, {{0, 32}}, 33, 0, 0},
      {2175, 33, {{0, 33}}, 34, 0, 0},
      {2176, 34, {{0, 0}, {2, 34}}, 34, 1, 1},
      {8191, 127, {{0, 0}, {95, 127}}, 34, 62, 94},
      {10000, 156, {{0, 0}, {124, 156}}, 34, 62, 123},
      {65535, 1023, {{0, 0}, {991, 1023}}, 34, 62, 990},
  };
  for (const auto& r : rows) {
    ASSERT_EQ(r.p / 64, r.qb);
    std::set<int64_t> forced, want;
    for (int64_t k = 0; k <= r.qb; ++k)
      if (g.forced(k, r.qb)) forced.insert(k);
    for (auto [lo, hi] : r.forced)
      for (int64_t k = lo; k <= hi; ++k) want.insert(k);
    EXPECT_EQ(forced, want) << "p " << r.p;
    EXPECT_EQ(int(forced.size()), r.n_forced) << "p " << r.p;

    // Selection for the last token of a T = p+1 sequence with random positive chunk scores.
    const int64_t T = r.p + 1;
    auto scores = random_vec(size_t(std::max<int64_t>(g.n1(T), 1)), uint32_t(r.p), 0.01f, 1.0f);
    std::vector<int32_t> sel;
    sparse::SelectScratch scratch;
    sparse::select_blocks(g, scores.data(), g.n1(T), r.p, T, sel, scratch);
    EXPECT_EQ(int64_t(sel.size()), std::min<int64_t>(96, r.qb + 1)) << "p " << r.p;
    EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
    std::set<int64_t> free;
    for (int32_t b : sel)
      if (!forced.count(b)) free.insert(b);
    for (int64_t f : forced) EXPECT_TRUE(std::count(sel.begin(), sel.end(), int32_t(f))) << "p " << r.p << " forced " << f;
    EXPECT_EQ(int(free.size()), r.free_picks) << "p " << r.p;
    if (!free.empty()) {
      EXPECT_GE(*free.begin(), 1);
      EXPECT_LE(*free.rbegin(), r.free_hi);
    }
    // The free picks are the best pooled scores among the non-forced past blocks.
    std::vector<std::pair<float, int64_t>> pooled;
    for (int64_t k = 1; k <= r.free_hi; ++k) {
      float m = -1;
      for (int64_t c = 0; c < g.n1(T); ++c)
        if (c * 16 < (k + 1) * 64 && c * 16 + 32 > k * 64) m = std::max(m, scores[size_t(c)]);
      pooled.emplace_back(m, k);
    }
    std::sort(pooled.begin(), pooled.end(), [](auto& x, auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
    std::set<int64_t> best;
    for (int i = 0; i < r.free_picks; ++i) best.insert(pooled[size_t(i)].second);
    EXPECT_EQ(free, best) << "p " << r.p;
  }
}

TEST(SparseSelect, DeterministicTiesAndNoFutureBlocks) {
  // Blocks of 16, K1 8/4, init 1, local 1, topk 4: K = 5 of which blocks {0, qb−1, qb} are forced.
  const sparse::BlockGeometry g{16, 8, 4, 1, 1, 4};
  const int64_t p = 10 * 16 + 3, T = 20 * 16;  // qb = 10; blocks 11…19 are in the future
  std::vector<int32_t> sel;
  sparse::SelectScratch scratch;
  // All visible scores equal (also all zero, as after an underflow): lowest indices win.
  for (float v : {1.0f, 0.0f}) {
    std::vector<float> scores(size_t(g.n1(p + 1)), v);
    sparse::select_blocks(g, scores.data(), int64_t(scores.size()), p, T, sel, scratch);
    EXPECT_EQ(sel, (std::vector<int32_t>{0, 1, 2, 9, 10})) << v;
  }
  // A higher score in block 6 (chunks 23…27) takes one of the two free picks.
  std::vector<float> scores(size_t(g.n1(p + 1)), 1.0f);
  scores[25] = 2.0f;
  sparse::select_blocks(g, scores.data(), int64_t(scores.size()), p, T, sel, scratch);
  EXPECT_EQ(sel, (std::vector<int32_t>{0, 1, 6, 9, 10}));
  // No K2 visible (+inf scores on visible columns): forced blocks stay in, the free picks go to
  // the lowest indices, never to future blocks.
  std::fill(scores.begin(), scores.end(), std::numeric_limits<float>::infinity());
  sparse::select_blocks(g, scores.data(), int64_t(scores.size()), p, T, sel, scratch);
  EXPECT_EQ(sel, (std::vector<int32_t>{0, 1, 2, 9, 10}));
  // A NaN score counts as 0.
  std::fill(scores.begin(), scores.end(), 1.0f);
  for (int c = 3; c <= 7; ++c) scores[size_t(c)] = std::numeric_limits<float>::quiet_NaN();  // block 1
  sparse::select_blocks(g, scores.data(), int64_t(scores.size()), p, T, sel, scratch);
  EXPECT_EQ(sel, (std::vector<int32_t>{0, 2, 3, 9, 10}));
  // When every past block fits the budget all are taken, whatever the scores.
  sparse::select_blocks(g, scores.data(), 0, 3 * 16, T, sel, scratch);
  EXPECT_EQ(sel, (std::vector<int32_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace sala
