// sala_cuda_tests: every CUDA op against the CPU backend (the f32 reference) on random inputs.
// Standalone (no GoogleTest: the GPU machine has none). One line per check, a final
// "N passed, M failed" line, exit status 1 on any failure.
//
//   sala_cuda_tests            parity checks
//   sala_cuda_tests --bench [--json FILE]   speed-of-light measurements (cuda_bench.cpp)
//
// Inputs are rounded to bf16 on the host first, so both backends see identical values and the
// differences come only from the CUDA backend's bf16 rounding points and summation order.
// Outputs on the GPU are poisoned with NaN before each op, so an unwritten element fails.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/sparse_select.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/weights.h"

using namespace sala;

int run_bench(int argc, char** argv);  // cuda_bench.cpp

namespace {

int g_pass = 0, g_fail = 0;

std::string strf(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

void check(bool ok, const std::string& name, const std::string& detail = "") {
  std::printf("[%s] %-58s %s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.c_str());
  std::fflush(stdout);
  (ok ? g_pass : g_fail)++;
}

struct Rng {
  std::mt19937_64 g;
  std::normal_distribution<float> nd{0.f, 1.f};
  explicit Rng(uint64_t seed) : g(seed) {}
  float normal() { return nd(g); }
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); }
};

std::vector<float> randn(Rng& r, size_t n, float std = 1.f, float mean = 0.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(mean + std * r.normal());
  return v;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    const double d = double(a[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Both backends plus the buffers of the current check.
struct Ctx {
  CpuBackend cpu;
  CudaBackend gpu;
  std::vector<std::unique_ptr<Buffer>> keep;
  Ctx() : cpu(0), gpu(0) {}
  Mat cmat(int64_t rows, int64_t cols, const std::vector<float>* init = nullptr) {
    keep.push_back(cpu.alloc(size_t(rows * cols) * 4));
    Mat m = keep.back()->mat(DType::F32, rows, cols);
    if (init) cpu.upload(m, init->data());
    return m;
  }
  Mat gmat(DType dt, int64_t rows, int64_t cols, const std::vector<float>* init = nullptr) {
    keep.push_back(gpu.alloc(std::max<size_t>(size_t(rows * cols) * dtype_size(dt), 16)));
    Mat m = keep.back()->mat(dt, rows, cols);
    if (init)
      gpu.upload(m, init->data());
    else
      poison(m);
    return m;
  }
  void poison(Mat m) {
    std::vector<float> nan(size_t(m.rows * m.cols), std::nanf(""));
    gpu.upload(m, nan.data());
  }
  std::vector<float> cget(const Mat& m) {
    std::vector<float> h(size_t(m.rows * m.cols));
    cpu.download(m, h.data());
    return h;
  }
  std::vector<float> gget(const Mat& m) {
    std::vector<float> h(size_t(m.rows * m.cols));
    gpu.download(m, h.data());
    return h;
  }
};

const char* dn(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F32 ? "f32" : "f16"; }

// ------------------------------------------------------------------------------------------------
void test_memory(Ctx& C, Rng& r) {
  for (DType dt : {DType::BF16, DType::F32, DType::F16}) {
    auto h = randn(r, 1000);
    Mat m = C.gmat(dt, 10, 100, &h);
    check(rel_err(C.gget(m), h) == 0.0, strf("upload/download roundtrip %s", dn(dt)));
  }
  // load_weight from several checkpoint dtypes: exact bf16 of the value.
  for (DType src : {DType::BF16, DType::F32, DType::F16}) {
    std::vector<float> f(37 * 53);
    for (auto& x : f) x = r.normal();
    std::vector<uint8_t> raw(f.size() * dtype_size(src));
    convert_from_f32(f.data(), src, raw.data(), f.size());
    std::vector<float> asf(f.size());
    convert_to_f32(raw.data(), src, asf.data(), f.size());
    for (auto& x : asf) x = round_bf16(x);
    TensorView tv{raw.data(), src, {37, 53}};
    Weight w = C.gpu.load_weight(tv);
    check(w.w.dtype == DType::BF16 && w.w.rows == 37 && w.w.cols == 53 && rel_err(C.gget(w.w), asf) == 0.0,
          strf("load_weight from %s", dn(src)));
  }
  {
    std::vector<float> f = randn(r, 96);
    TensorView tv{f.data(), DType::F32, {96}};
    Weight w = C.gpu.load_vector(tv);
    check(w.w.rows == 1 && w.w.cols == 96 && rel_err(C.gget(w.w), f) == 0.0, "load_vector");
  }
  {
    Weight wc = C.cpu.random_weight(300, 257, 0.5f, 0.02f, 1234);
    Weight wg = C.gpu.random_weight(300, 257, 0.5f, 0.02f, 1234);
    auto c = C.cget(wc.w), g = C.gget(wg.w);
    size_t differ = 0;
    for (size_t i = 0; i < c.size(); ++i) differ += round_bf16(c[i]) != g[i];
    double mean = 0, var = 0;
    for (float x : g) mean += x;
    mean /= double(g.size());
    for (float x : g) var += (x - mean) * (x - mean);
    const double sd = std::sqrt(var / double(g.size()));
    check(differ * 1000 <= g.size() && std::fabs(mean - 0.5) < 1e-3 && std::fabs(sd - 0.02) < 1e-3,
          "random_weight matches the CPU stream", strf("differ %zu/%zu mean %.5f sd %.5f", differ, g.size(), mean, sd));
  }
}

// ------------------------------------------------------------------------------------------------
void test_matmul(Ctx& C, Rng& r) {
  struct S {
    int64_t n, out, in;
  };
  const std::vector<S> shapes = {{1, 64, 64},    {2, 200, 136},  {3, 129, 256},  {4, 64, 64},    {5, 300, 72},
                                 {7, 96, 512},   {8, 257, 1024}, {9, 64, 64},    {16, 200, 136}, {33, 129, 256},
                                 {100, 300, 72}, {1, 40, 36},    {6, 40, 36},    {17, 40, 36},   {1, 4096, 4096},
                                 {8, 4096, 4096}, {64, 4096, 4096}, {1, 1000, 16384}};
  for (const S& s : shapes) {
    auto w = randn(r, size_t(s.out * s.in), 1.0f / std::sqrt(float(s.in)));
    TensorView tv{w.data(), DType::F32, {s.out, s.in}};
    Weight wc = C.cpu.load_weight(tv), wg = C.gpu.load_weight(tv);
    auto x = randn(r, size_t(s.n * s.in));
    Mat xc = C.cmat(s.n, s.in, &x), yc = C.cmat(s.n, s.out);
    C.cpu.matmul(xc, wc, yc);
    const auto ref = C.cget(yc);
    for (DType xd : {DType::BF16, DType::F32})
      for (DType yd : {DType::BF16, DType::F32}) {
        if (s.out * s.in > 1000000 && (xd != DType::BF16)) continue;
        Mat xg = C.gmat(xd, s.n, s.in, &x), yg = C.gmat(yd, s.n, s.out);
        C.gpu.matmul(xg, wg, yg);
        const double e = rel_err(C.gget(yg), ref);
        check(e < 1e-2, strf("matmul N=%lld %lldx%lld x:%s y:%s", (long long)s.n, (long long)s.out, (long long)s.in,
                             dn(xd), dn(yd)),
              strf("rel %.2e", e));
      }
    if (s.n <= 8)  // every GEMV variant (FMA, tensor cores with 4 or 16 warps)
      for (int mode = 1; mode <= 3; ++mode) {
        C.gpu.set_gemv_mode(mode);
        Mat xg = C.gmat(DType::BF16, s.n, s.in, &x), yg = C.gmat(DType::BF16, s.n, s.out);
        C.gpu.matmul(xg, wg, yg);
        C.gpu.set_gemv_mode(0);
        const double e = rel_err(C.gget(yg), ref);
        check(e < 1e-2, strf("matmul(gemv mode %d) N=%lld %lldx%lld", mode, (long long)s.n, (long long)s.out,
                             (long long)s.in),
              strf("rel %.2e", e));
      }
    if (s.n <= 8) {  // the cuBLAS path at small N too
      C.gpu.set_use_gemv(false);
      Mat xg = C.gmat(DType::BF16, s.n, s.in, &x), yg = C.gmat(DType::BF16, s.n, s.out);
      C.gpu.matmul(xg, wg, yg);
      C.gpu.set_use_gemv(true);
      const double e = rel_err(C.gget(yg), ref);
      check(e < 1e-2, strf("matmul(cuBLAS) N=%lld %lldx%lld", (long long)s.n, (long long)s.out, (long long)s.in),
            strf("rel %.2e", e));
    }
    C.keep.clear();
  }
}

// ------------------------------------------------------------------------------------------------
void test_rows_ops(Ctx& C, Rng& r) {
  // rmsnorm (out of place, in place, f32 output)
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 4096}, {7, 100}, {132, 128}, {5, 16}, {3, 24}, {2, 16384}, {3, 1536}, {9, 1024}}) {
    auto x = randn(r, size_t(rows * cols), 2.0f);
    auto wv = randn(r, size_t(cols), 0.2f, 1.0f);
    TensorView tv{wv.data(), DType::F32, {cols}};
    Weight wc = C.cpu.load_vector(tv), wg = C.gpu.load_vector(tv);
    Mat xc = C.cmat(rows, cols, &x), yc = C.cmat(rows, cols);
    C.cpu.rmsnorm(xc, wc, 1e-6f, yc);
    const auto ref = C.cget(yc);
    Mat xg = C.gmat(DType::BF16, rows, cols, &x), yg = C.gmat(DType::BF16, rows, cols);
    C.gpu.rmsnorm(xg, wg, 1e-6f, yg);
    double e = rel_err(C.gget(yg), ref);
    check(e < 1e-2, strf("rmsnorm %lldx%lld", (long long)rows, (long long)cols), strf("rel %.2e", e));
    C.gpu.rmsnorm(xg, wg, 1e-6f, xg);
    e = rel_err(C.gget(xg), ref);
    check(e < 1e-2, strf("rmsnorm in place %lldx%lld", (long long)rows, (long long)cols), strf("rel %.2e", e));
    Mat yf = C.gmat(DType::F32, rows, cols);
    Mat xg2 = C.gmat(DType::BF16, rows, cols, &x);
    C.gpu.rmsnorm(xg2, wg, 1e-6f, yf);
    e = rel_err(C.gget(yf), ref);
    check(e < 1e-5, strf("rmsnorm f32 out %lldx%lld", (long long)rows, (long long)cols), strf("rel %.2e", e));
    C.keep.clear();
  }
  // rope at large positions
  for (int hd : {16, 64, 128}) {
    const int64_t rows = 9, cols = 4 * hd;
    BatchInfo b;
    for (int64_t i = 0; i < rows; ++i) {
      b.tokens.push_back(0);
      b.positions.push_back(int32_t(i == 0 ? 0 : r.uniform(0, 500000)));
    }
    C.cpu.begin_batch(b);
    C.gpu.begin_batch(b);
    auto x = randn(r, size_t(rows * cols));
    Mat xc = C.cmat(rows, cols, &x), xg = C.gmat(DType::BF16, rows, cols, &x);
    C.cpu.rope(xc, hd, 10000.0);
    C.gpu.rope(xg, hd, 10000.0);
    const double e = rel_err(C.gget(xg), C.cget(xc));
    check(e < 1e-2, strf("rope head_dim %d", hd), strf("rel %.2e", e));
    C.keep.clear();
  }
  // elementwise (fast path n % 8 == 0, generic path otherwise)
  for (int64_t n : {int64_t(3000), int64_t(91), int64_t(1) << 20}) {
    auto a = randn(r, size_t(n), 2.0f), bv = randn(r, size_t(n), 2.0f);
    for (int op = 0; op < 4; ++op) {
      Mat ac = C.cmat(1, n, &a), bc = C.cmat(1, n, &bv), oc = C.cmat(1, n);
      Mat ag = C.gmat(DType::BF16, 1, n, &a), bg = C.gmat(DType::BF16, 1, n, &bv), og = C.gmat(DType::BF16, 1, n);
      const char* name = "";
      switch (op) {
        case 0: C.cpu.silu_mul(ac, bc, oc), C.gpu.silu_mul(ag, bg, og), name = "silu_mul"; break;
        case 1: C.cpu.sigmoid_mul(ac, bc, oc), C.gpu.sigmoid_mul(ag, bg, og), name = "sigmoid_mul"; break;
        case 2:
          C.cpu.add_scaled(ac, bc, 0.2474f), C.gpu.add_scaled(ag, bg, 0.2474f), name = "add_scaled";
          oc = ac, og = ag;
          break;
        case 3: C.cpu.scale(ac, 0.0625f, oc), C.gpu.scale(ag, 0.0625f, og), name = "scale"; break;
      }
      const double e = rel_err(C.gget(og), C.cget(oc));
      check(e < 1e-2, strf("%s n=%lld", name, (long long)n), strf("rel %.2e", e));
      C.keep.clear();
    }
  }
  // sigmoid_mul in place, mixed dtypes (f32 gate)
  {
    const int64_t n = 4096;
    auto a = randn(r, size_t(n)), z = randn(r, size_t(n));
    Mat ac = C.cmat(2, n / 2, &a), zc = C.cmat(2, n / 2, &z);
    C.cpu.sigmoid_mul(ac, zc, ac);
    Mat ag = C.gmat(DType::BF16, 2, n / 2, &a), zg = C.gmat(DType::F32, 2, n / 2, &z);
    C.gpu.sigmoid_mul(ag, zg, ag);
    const double e = rel_err(C.gget(ag), C.cget(ac));
    check(e < 1e-2, "sigmoid_mul in place, f32 gate", strf("rel %.2e", e));
    C.keep.clear();
  }
  // embed + gather_rows
  for (int64_t cols : {int64_t(64), int64_t(4096), int64_t(36)}) {
    const int64_t vocab = 100, rows = 13;
    auto t = randn(r, size_t(vocab * cols));
    TensorView tv{t.data(), DType::F32, {vocab, cols}};
    Weight wc = C.cpu.load_weight(tv), wg = C.gpu.load_weight(tv);
    BatchInfo b;
    for (int64_t i = 0; i < rows; ++i) {
      b.tokens.push_back(int32_t(r.uniform(0, vocab - 1)));
      b.positions.push_back(int32_t(i));
    }
    C.cpu.begin_batch(b);
    C.gpu.begin_batch(b);
    Mat oc = C.cmat(rows, cols), og = C.gmat(DType::BF16, rows, cols);
    C.cpu.embed(wc, 12.0f, oc);
    C.gpu.embed(wg, 12.0f, og);
    double e = rel_err(C.gget(og), C.cget(oc));
    check(e < 1e-2, strf("embed width %lld", (long long)cols), strf("rel %.2e", e));
    std::vector<int64_t> idx = {12, 0, 5, 5, 7};
    if (cols == 36)  // more rows than travel inline in the kernel parameters
      for (int i = 0; i < 300; ++i) idx.push_back(r.uniform(0, rows - 1));
    const int64_t ng = int64_t(idx.size());
    Mat gc = C.cmat(ng, cols), gg = C.gmat(DType::BF16, ng, cols);
    C.cpu.gather_rows(oc, idx, gc);
    C.gpu.gather_rows(og, idx, gg);
    e = rel_err(C.gget(gg), C.cget(gc));
    check(e < 1e-2, strf("gather_rows %lld rows width %lld", (long long)ng, (long long)cols), strf("rel %.2e", e));
    C.keep.clear();
  }
}

// ------------------------------------------------------------------------------------------------
std::vector<float> slopes_log_decay(int H) {
  std::vector<float> g(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) g[size_t(h)] = -float(std::pow(2.0, -double(h + 1) * 8.0 / H));
  return g;
}

void test_lightning(Ctx& C, Rng& r) {
  struct Geo {
    int H, Hkv, d;
    bool fma;  // chunked prefill through the fp32 FMA kernel instead of tensor cores
  };
  for (Geo geo : {Geo{4, 4, 16, false}, Geo{4, 2, 64, false}, Geo{32, 32, 128, false}, Geo{32, 32, 128, true}}) {
    C.gpu.set_gla_fma(geo.fma);
    CacheSpec spec;
    spec.lightning_layers = 2;
    spec.lightning_heads = geo.H;
    spec.lightning_dim = geo.d;
    spec.log_decay = slopes_log_decay(geo.H);
    spec.lightning_scale = 1.0f / std::sqrt(float(geo.d));
    spec.max_slots = 4;
    C.cpu.create_caches(spec);
    C.gpu.create_caches(spec);
    for (int s = 0; s < 4; ++s) C.cpu.reset_state(s), C.gpu.reset_state(s);
    // Three sequences (slots 2, 0, 1) through calls of mixed lengths: chunked (≥ 64) and recurrent.
    const std::vector<std::vector<int64_t>> calls = {{150, 5, 64}, {1, 70, 63}, {1, 1, 1}, {200, 1, 2}};
    const int slots[3] = {2, 0, 1};
    std::vector<int64_t> len(3, 0);
    double worst_out = 0;
    bool all_ok = true;
    for (size_t ci = 0; ci < calls.size(); ++ci) {
      BatchInfo b;
      // Packed in order seq 1, seq 0, seq 2 (entries listed 0, 1, 2): row order != entry order.
      const int order[3] = {1, 0, 2};
      int64_t row = 0;
      std::vector<int64_t> start(3);
      for (int oi : order) {
        start[size_t(oi)] = row;
        row += calls[ci][size_t(oi)];
      }
      for (int si = 0; si < 3; ++si) {
        SeqEntry e;
        e.slot = slots[si];
        e.start = start[size_t(si)];
        e.n_new = calls[ci][size_t(si)];
        e.cached = len[size_t(si)];
        b.seqs.push_back(e);
      }
      const int64_t N = row;
      for (int64_t i = 0; i < N; ++i) b.tokens.push_back(1), b.positions.push_back(0);
      C.cpu.begin_batch(b);
      C.gpu.begin_batch(b);
      const int64_t qw = int64_t(geo.H) * geo.d, kw = int64_t(geo.Hkv) * geo.d;
      auto q = randn(r, size_t(N * qw)), k = randn(r, size_t(N * kw)), v = randn(r, size_t(N * kw));
      Mat qc = C.cmat(N, qw, &q), kc = C.cmat(N, kw, &k), vc = C.cmat(N, kw, &v), oc = C.cmat(N, qw);
      Mat qg = C.gmat(DType::BF16, N, qw, &q), kg = C.gmat(DType::BF16, N, kw, &k), vg = C.gmat(DType::BF16, N, kw, &v),
          og = C.gmat(DType::BF16, N, qw);
      C.cpu.lightning_attention(1, qc, kc, vc, oc);
      C.gpu.lightning_attention(1, qg, kg, vg, og);
      const double e = rel_err(C.gget(og), C.cget(oc));
      worst_out = std::max(worst_out, e);
      all_ok &= e < 2e-2;
      check(e < 2e-2,
            strf("lightning%s H%d/%d d%d call %zu (%lld,%lld,%lld)", geo.fma ? "(fma)" : "", geo.H, geo.Hkv, geo.d, ci,
                 (long long)calls[ci][0], (long long)calls[ci][1], (long long)calls[ci][2]),
            strf("rel %.2e", e));
      for (int si = 0; si < 3; ++si) len[size_t(si)] += calls[ci][size_t(si)];
      C.keep.clear();
    }
    // States after all calls (fp32 on both sides).
    const size_t sf = size_t(geo.H) * geo.d * geo.d;
    std::vector<float> sg(sf);
    double worst = 0;
    for (int s : slots) {
      C.gpu.download_state(s, 1, sg.data());
      std::vector<float> sc(C.cpu.state(s, 1), C.cpu.state(s, 1) + sf);
      worst = std::max(worst, rel_err(sg, sc));
    }
    check(worst < 1e-4, strf("lightning%s H%d/%d d%d states", geo.fma ? "(fma)" : "", geo.H, geo.Hkv, geo.d),
          strf("rel %.2e", worst));
    // Layer 0 untouched.
    C.gpu.download_state(2, 0, sg.data());
    check(std::all_of(sg.begin(), sg.end(), [](float x) { return x == 0.f; }),
          strf("lightning H%d d%d other layer untouched", geo.H, geo.d));
    // copy_state / reset_state
    C.cpu.copy_state(2, 3), C.gpu.copy_state(2, 3);
    C.cpu.reset_state(0), C.gpu.reset_state(0);
    C.gpu.download_state(3, 1, sg.data());
    std::vector<float> sc(C.cpu.state(3, 1), C.cpu.state(3, 1) + sf);
    const double ec = rel_err(sg, sc);
    C.gpu.download_state(0, 1, sg.data());
    const bool zero = std::all_of(sg.begin(), sg.end(), [](float x) { return x == 0.f; });
    check(ec < 1e-4 && zero, strf("lightning d%d copy_state/reset_state", geo.d), strf("rel %.2e", ec));
  }
  C.gpu.set_gla_fma(false);
}

// ------------------------------------------------------------------------------------------------
// Sparse layers: dense causal + InfLLM-v2, chunked prefill, decode, multi-sequence batches,
// non-contiguous pages, the dense→sparse switch.
struct SparseGeo {
  const char* name;
  int d, kvh, qh, bs, ks, st, init, local, topk;
  std::vector<int64_t> a_chunks;  // prompt chunks of sequence A (sparse from its first chunk)
  int64_t dense_len;              // sequence C crosses it during decode
};

// Host recomputation of the selection from the GPU's own caches and q: exact check of pooling,
// forced blocks and top-K (differences only from fp32 vs double scores rounded to bf16).
int check_selection(CudaBackend& gpu, const CacheSpec& spec, int layer, const BatchInfo& b, const std::vector<float>& q,
                    int64_t& checked) {
  const auto& items = gpu.debug_sel_items();
  if (items.empty()) return 0;
  const auto sel = gpu.debug_selection();
  const auto k1 = gpu.debug_pool(2), k2 = gpu.debug_pool(3);
  const sparse::BlockGeometry geo = sparse::BlockGeometry::from(spec);
  const int d = spec.head_dim, kvh = spec.kv_heads, G = spec.q_heads / kvh;
  const int kmax = spec.topk + spec.local_blocks;
  const int bs = spec.block_size, st = spec.kernel_stride;
  const int k1pp = std::max(1, bs / st), k2pp = std::max(1, bs / (4 * st));
  const int64_t row_w = int64_t(kvh) * d;
  const double s = spec.attn_scale;
  auto chunk_row = [&](const std::vector<int32_t>& pages, int64_t c, int stride, int pp) {
    const int64_t first = c * stride;
    return (int64_t(layer) * spec.max_pages + pages[size_t(first / bs)]) * pp + (first % bs) / stride;
  };
  int bad = 0;
  std::vector<int32_t> out;
  sparse::SelectScratch scratch;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& it = items[i];
    const auto& e = b.seqs[size_t(it.seq)];
    for (int h = 0; h < kvh; ++h) {
      std::vector<float> score(size_t(it.ncol), 0.f);
      std::vector<double> lse(static_cast<size_t>(G));
      for (int g = 0; g < G; ++g) {
        const float* qg = q.data() + int64_t(it.row) * spec.q_heads * d + int64_t(h * G + g) * d;
        std::vector<double> a(size_t(it.vis2));
        double m = -INFINITY;
        for (int c = 0; c < it.vis2; ++c) {
          const float* kr = k2.data() + chunk_row(e.pages, c, 4 * st, k2pp) * row_w + h * d;
          double dot = 0;
          for (int x = 0; x < d; ++x) dot += double(qg[x]) * kr[x];
          a[size_t(c)] = s * dot;
          m = std::max(m, a[size_t(c)]);
        }
        double z = 0;
        for (double v : a) z += std::exp(v - m);
        lse[size_t(g)] = it.vis2 > 0 ? m + std::log(z) : -INFINITY;
      }
      for (int c = 0; c < it.ncol; ++c) {
        const float* kr = k1.data() + chunk_row(e.pages, c, st, k1pp) * row_w + h * d;
        double total = 0;
        for (int g = 0; g < G; ++g) {
          const float* qg = q.data() + int64_t(it.row) * spec.q_heads * d + int64_t(h * G + g) * d;
          double dot = 0;
          for (int x = 0; x < d; ++x) dot += double(qg[x]) * kr[x];
          total += std::exp(s * dot - lse[size_t(g)]);
        }
        score[size_t(c)] = round_bf16(float(total));
      }
      sparse::select_blocks(geo, score.data(), it.ncol, it.p, it.T, out, scratch);
      const int32_t* gs = sel.data() + (int64_t(i) * kvh + h) * kmax;
      bool same = int(out.size()) == it.nsel;
      for (int j = 0; same && j < it.nsel; ++j) same = gs[j] == out[size_t(j)];
      bad += !same;
      ++checked;
    }
  }
  return bad;
}

void test_sparse(Ctx& C, Rng& r, const SparseGeo& sg) {
  CacheSpec spec;
  spec.sparse_layers = 2;
  spec.kv_heads = sg.kvh;
  spec.head_dim = sg.d;
  spec.q_heads = sg.qh;
  spec.block_size = sg.bs;
  spec.kernel_size = sg.ks;
  spec.kernel_stride = sg.st;
  spec.init_blocks = sg.init;
  spec.local_blocks = sg.local;
  spec.topk = sg.topk;
  spec.max_pages = 400;
  spec.max_slots = 4;
  spec.attn_scale = 1.0f / std::sqrt(float(sg.d));
  C.cpu.create_caches(spec);
  C.gpu.create_caches(spec);
  const int64_t qw = int64_t(sg.qh) * sg.d, kw = int64_t(sg.kvh) * sg.d;

  // Sequences: A long prompt in chunks (sparse), B short (dense), C crossing dense_len in decode.
  struct Seq {
    int slot;
    int64_t len = 0;
    std::vector<int32_t> pages;
    int64_t prompt_total;
  };
  int64_t a_total = 0;
  for (auto c : sg.a_chunks) a_total += c;
  std::vector<Seq> seqs = {{0, 0, {}, a_total}, {1, 0, {}, 70}, {2, 0, {}, sg.dense_len - 2}};
  // Non-contiguous page tables: a shuffled pool dealt out to the sequences.
  std::vector<int32_t> pool(size_t(spec.max_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), r.g);
  size_t next_page = 0;
  for (auto& s : seqs) {
    const int64_t need = (s.prompt_total + 16 + sg.bs - 1) / sg.bs;
    for (int64_t i = 0; i < need; ++i) s.pages.push_back(pool[next_page++]);
  }
  // Calls: per sequence the number of new tokens (0: not in the call).
  std::vector<std::array<int64_t, 3>> calls;
  calls.push_back({sg.a_chunks[0], 70, 0});
  calls.push_back({sg.a_chunks.size() > 1 ? sg.a_chunks[1] : 1, 0, sg.dense_len - 2});
  for (size_t i = 2; i < sg.a_chunks.size(); ++i) calls.push_back({sg.a_chunks[i], 1, 1});
  for (int i = 0; i < 4; ++i) calls.push_back({1, 1, 1});

  // Keys with a per-block component along a direction shared with the queries, so that block
  // relevance is well separated (the CPU reference does not round stage-1 scores to bf16).
  std::vector<std::vector<float>> dir(size_t(sg.kvh));
  for (auto& u : dir) {
    u.resize(size_t(sg.d));
    for (auto& x : u) x = r.normal();
  }
  std::vector<float> beta(4096);
  for (auto& b : beta) b = 0.6f * r.normal();

  double worst_dense = 0, worst_sparse_ok = 0;
  int64_t sparse_rows = 0, sparse_bad = 0, sel_checked = 0, sel_bad = 0;
  bool dense_ok = true;
  for (size_t ci = 0; ci < calls.size(); ++ci) {
    BatchInfo b;
    // Rows packed C, A, B; entries listed A, B, C.
    int64_t row = 0;
    std::vector<int64_t> start(3, 0);
    for (int si : {2, 0, 1}) {
      start[size_t(si)] = row;
      row += calls[ci][size_t(si)];
    }
    std::vector<int> entry_of(3, -1);
    for (int si = 0; si < 3; ++si) {
      if (calls[ci][size_t(si)] == 0) continue;
      Seq& s = seqs[size_t(si)];
      SeqEntry e;
      e.slot = s.slot;
      e.start = start[size_t(si)];
      e.n_new = calls[ci][size_t(si)];
      e.cached = s.len;
      const int64_t T = s.len + e.n_new;
      // Prompt chunks decide with the final prompt length; decode with the length after the step.
      e.sparse = std::max(T, s.len < s.prompt_total ? s.prompt_total : T) >= sg.dense_len;
      e.pages = s.pages;
      entry_of[size_t(si)] = int(b.seqs.size());
      b.seqs.push_back(e);
    }
    const int64_t N = row;
    for (int64_t i = 0; i < N; ++i) b.tokens.push_back(1), b.positions.push_back(0);
    C.cpu.begin_batch(b);
    C.gpu.begin_batch(b);

    // Inputs.
    std::vector<float> q(size_t(N * qw)), k(size_t(N * kw)), v(size_t(N * kw));
    for (int si = 0; si < 3; ++si) {
      if (calls[ci][size_t(si)] == 0) continue;
      const auto& e = b.seqs[size_t(entry_of[size_t(si)])];
      for (int64_t t = 0; t < e.n_new; ++t) {
        const int64_t rr = e.start + t, p = e.cached + t;
        const float bb = beta[size_t(p / sg.bs) % beta.size()];
        for (int h = 0; h < sg.kvh; ++h)
          for (int x = 0; x < sg.d; ++x) {
            k[size_t(rr * kw + h * sg.d + x)] = round_bf16(0.5f * r.normal() + bb * dir[size_t(h)][size_t(x)]);
            v[size_t(rr * kw + h * sg.d + x)] = round_bf16(r.normal());
          }
        for (int hq = 0; hq < sg.qh; ++hq) {
          const int h = hq / (sg.qh / sg.kvh);
          for (int x = 0; x < sg.d; ++x)
            q[size_t(rr * qw + hq * sg.d + x)] = round_bf16(0.7f * r.normal() + 0.5f * dir[size_t(h)][size_t(x)]);
        }
      }
    }
    // Which rows need selection (sparse regime, more past blocks than the budget).
    const sparse::BlockGeometry geo = sparse::BlockGeometry::from(spec);
    std::vector<char> row_sparse(size_t(N), 0);
    for (const auto& e : b.seqs)
      for (int64_t t = 0; t < e.n_new; ++t)
        row_sparse[size_t(e.start + t)] = e.sparse && (e.cached + t) / sg.bs + 1 > geo.budget(e.cached + e.n_new);

    for (int layer : {1, 0}) {
      Mat qc = C.cmat(N, qw, &q), kc = C.cmat(N, kw, &k), vc = C.cmat(N, kw, &v), oc = C.cmat(N, qw);
      Mat qg = C.gmat(DType::BF16, N, qw, &q), kg = C.gmat(DType::BF16, N, kw, &k), vg = C.gmat(DType::BF16, N, kw, &v),
          og = C.gmat(DType::BF16, N, qw);
      C.cpu.sparse_attention(layer, qc, kc, vc, oc);
      C.gpu.sparse_attention(layer, qg, kg, vg, og);
      const auto gout = C.gget(og), cout = C.cget(oc);
      std::vector<float> gd, cd;
      for (int64_t rr = 0; rr < N; ++rr) {
        std::vector<float> gr(gout.begin() + rr * qw, gout.begin() + (rr + 1) * qw);
        std::vector<float> cr(cout.begin() + rr * qw, cout.begin() + (rr + 1) * qw);
        if (row_sparse[size_t(rr)]) {
          const double e = rel_err(gr, cr);
          ++sparse_rows;
          if (e < 3e-2)
            worst_sparse_ok = std::max(worst_sparse_ok, e);
          else
            ++sparse_bad;
        } else {
          gd.insert(gd.end(), gr.begin(), gr.end());
          cd.insert(cd.end(), cr.begin(), cr.end());
        }
      }
      if (!gd.empty()) {
        const double e = rel_err(gd, cd);
        worst_dense = std::max(worst_dense, e);
        dense_ok &= e < 2e-2;
      }
      if (layer == 1) sel_bad += check_selection(C.gpu, spec, layer, b, q, sel_checked);
      C.keep.clear();
    }
    for (int si = 0; si < 3; ++si) seqs[size_t(si)].len += calls[ci][size_t(si)];
  }
  check(dense_ok, strf("sparse_attention %s: dense/all-blocks rows", sg.name), strf("worst rel %.2e", worst_dense));
  check(sparse_rows > 0 && sparse_bad * 20 <= sparse_rows,
        strf("sparse_attention %s: InfLLM-v2 rows vs CPU", sg.name),
        strf("%lld/%lld rows within 3e-2 (worst %.2e)", (long long)(sparse_rows - sparse_bad), (long long)sparse_rows,
             worst_sparse_ok));
  check(sel_checked > 0 && sel_bad * 200 <= sel_checked, strf("sparse selection %s: exact vs host recompute", sg.name),
        strf("%lld/%lld lists identical", (long long)(sel_checked - sel_bad), (long long)sel_checked));
}

// CUDA graphs: the tiny model decoded through the engine with graphs on and off on two backends
// (same counter-RNG weights, same fed tokens) must give the same logits at every step, over page
// boundaries, K1/K2 growth (every 4/16 tokens) and the dense→sparse switch (256 tokens), for one
// sequence and for 4 sequences of different lengths.
struct GraphRun {
  std::vector<std::vector<float>> logits;  // every decode step's logits, in order
  Backend::GraphStats stats;
  size_t graphs = 0;
};

GraphRun run_graph_scenario(bool graphs, const std::vector<int64_t>& prompts, int steps) {
  CudaBackend gpu(0);
  gpu.set_graphs(graphs);
  ModelConfig cfg = preset_config("tiny");
  cfg.random_weights = true;
  ModelWeights w = random_weights(cfg, gpu, 1234);
  Model model(cfg, std::move(w), gpu, {.max_batch_tokens = 256, .max_logit_rows = 8});
  int64_t longest = *std::max_element(prompts.begin(), prompts.end());
  Engine e(model, {.max_sequences = int(prompts.size()), .max_context = longest + steps + 8});
  std::mt19937 rng(99);
  auto tok = [&] { return int32_t(rng() % uint32_t(cfg.vocab_size)); };
  std::vector<int> seqs;
  for (int64_t len : prompts) {
    int s = e.open();
    seqs.push_back(s);
    std::vector<int32_t> t(static_cast<size_t>(len));
    for (auto& x : t) x = tok();
    for (int64_t off = 0; off < len; off += 256) {
      const int64_t n = std::min<int64_t>(256, len - off);
      Engine::Request r{s, std::span<const int32_t>(t).subspan(size_t(off), size_t(n)), -1, false, off + n == len};
      e.step(std::span(&r, 1));
    }
  }
  GraphRun out;
  for (int i = 0; i < steps; ++i) {
    std::vector<int32_t> next(seqs.size());
    for (auto& x : next) x = tok();
    std::vector<Engine::Request> reqs;
    for (size_t k = 0; k < seqs.size(); ++k) reqs.push_back({seqs[k], std::span<const int32_t>(&next[k], 1)});
    auto res = e.step(reqs);
    for (auto& r : res) out.logits.push_back(std::move(r));
  }
  out.stats = gpu.graph_stats();
  out.graphs = gpu.graph_count();
  return out;
}

void test_graphs() {
  struct Case {
    const char* name;
    std::vector<int64_t> prompts;
    int steps;
  };
  const std::vector<Case> cases = {{"batch 1 (200 -> 340)", {200}, 140},
                                   {"batch 4 (100/180/230/250 +110)", {100, 180, 230, 250}, 110}};
  for (const auto& c : cases) {
    GraphRun eager = run_graph_scenario(false, c.prompts, c.steps);
    GraphRun graph = run_graph_scenario(true, c.prompts, c.steps);
    double worst = 0;
    size_t identical = 0;
    bool shapes = eager.logits.size() == graph.logits.size() && !eager.logits.empty();
    for (size_t i = 0; shapes && i < eager.logits.size(); ++i) {
      const double e = rel_err(graph.logits[i], eager.logits[i]);
      worst = std::max(worst, e);
      identical += graph.logits[i] == eager.logits[i];
    }
    check(shapes && worst <= 1e-6, strf("cuda graphs %s: logits == eager", c.name),
          strf("worst rel %.2e, %zu/%zu steps bit-identical", worst, identical, eager.logits.size()));
    check(graph.stats.replays > 0 && eager.stats.replays == 0 && eager.stats.captures == 0,
          strf("cuda graphs %s: replayed", c.name),
          strf("%lld replays, %lld captures, %lld eager, %zu graphs held", (long long)graph.stats.replays,
               (long long)graph.stats.captures, (long long)graph.stats.eager, graph.graphs));
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--bench") == 0) return run_bench(argc, argv);
  if (!cuda_device_available()) {
    std::printf("no CUDA device: nothing to test\n0 passed, 1 failed\n");
    return 1;
  }
  try {
    Ctx C;
    std::printf("device: %s\n", C.gpu.device_name().c_str());
    Rng r(20260515);
    test_memory(C, r);
    test_matmul(C, r);
    test_rows_ops(C, r);
    test_lightning(C, r);
    const std::vector<SparseGeo> geos = {
        {"tiny d16 G2 bs16", 16, 2, 4, 16, 8, 4, 1, 4, 4, {100, 100, 100}, 150},
        {"small d64 G2 bs64", 64, 2, 4, 64, 32, 16, 1, 8, 8, {500, 500, 500}, 1100},
        {"9b-like d128 G16 bs64", 128, 2, 32, 64, 32, 16, 1, 4, 4, {300, 300, 300, 200}, 600},
        {"d32 G32 bs32", 32, 1, 32, 32, 16, 8, 1, 2, 2, {200, 200}, 200},
    };
    for (const auto& g : geos) test_sparse(C, r, g);
    test_graphs();
  } catch (const std::exception& e) {
    std::printf("[FAIL] exception: %s\n", e.what());
    ++g_fail;
  }
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
