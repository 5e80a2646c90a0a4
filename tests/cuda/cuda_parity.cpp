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
#include <deque>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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
#include "engine/scheduler.h"
#include "engine/speculative.h"
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
// Fused decode ops: matmul_group (grouped GEMV; must equal per-part matmul bit for bit, and the
// CPU within bf16 error) and add_rmsnorm (must equal add_scaled + rmsnorm on the GPU bit for bit).
void test_fused_ops(Ctx& C, Rng& r) {
  struct G {
    int64_t n, in;
    std::vector<int64_t> outs;
  };
  const std::vector<G> groups = {{1, 4096, {4096, 256, 256, 4096}}, {1, 256, {200, 72}},      {2, 512, {96, 96, 40}},
                                 {3, 1024, {300, 17, 64, 1000}},    {8, 4096, {16384, 16384}}, {5, 72, {40, 40}},
                                 {12, 256, {64, 128}}};
  for (const G& g : groups) {
    std::vector<Weight> wc, wg;
    auto x = randn(r, size_t(g.n * g.in));
    Mat xc = C.cmat(g.n, g.in, &x), xg = C.gmat(DType::BF16, g.n, g.in, &x);
    std::vector<Backend::MatmulPart> pc, pg, single;
    for (int64_t out : g.outs) {
      auto w = randn(r, size_t(out * g.in), 1.0f / std::sqrt(float(g.in)));
      TensorView tv{w.data(), DType::F32, {out, g.in}};
      wc.push_back(C.cpu.load_weight(tv));
      wg.push_back(C.gpu.load_weight(tv));
    }
    for (size_t i = 0; i < g.outs.size(); ++i) {
      pc.push_back({&wc[i], C.cmat(g.n, g.outs[i])});
      pg.push_back({&wg[i], C.gmat(DType::BF16, g.n, g.outs[i])});
      single.push_back({&wg[i], C.gmat(DType::BF16, g.n, g.outs[i])});
    }
    for (int mode = 0; mode <= 3; ++mode) {
      C.gpu.set_gemv_mode(mode);
      for (auto& p : pg) C.poison(p.y);
      C.gpu.matmul_group(xg, pg);
      C.cpu.matmul_group(xc, pc);
      double worst = 0;
      bool same = true;
      for (size_t i = 0; i < pg.size(); ++i) {
        C.gpu.matmul(xg, *single[i].w, single[i].y);
        const auto got = C.gget(pg[i].y);
        worst = std::max(worst, rel_err(got, C.cget(pc[i].y)));
        same = same && got == C.gget(single[i].y);
      }
      check(worst < 1e-2 && same,
            strf("matmul_group mode %d N=%lld in=%lld parts=%zu", mode, (long long)g.n, (long long)g.in, pg.size()),
            strf("rel %.2e, %s per-part matmul", worst, same ? "equal to" : "DIFFERS from"));
    }
    C.gpu.set_gemv_mode(0);
    C.keep.clear();
  }

  for (int64_t rows : {1, 3, 64})
    for (int64_t cols : {1024, 4096, 2560, 96}) {
      auto h = randn(r, size_t(rows * cols)), a = randn(r, size_t(rows * cols)), w = randn(r, size_t(cols), 0.2f, 1.f);
      TensorView tv{w.data(), DType::F32, {cols}};
      Weight wc = C.cpu.load_vector(tv), wg = C.gpu.load_vector(tv);
      const float alpha = 0.37f;
      Mat hc = C.cmat(rows, cols, &h), ac = C.cmat(rows, cols, &a), yc = C.cmat(rows, cols);
      C.cpu.add_scaled(hc, ac, alpha);
      C.cpu.rmsnorm(hc, wc, 1e-6f, yc);
      Mat hg = C.gmat(DType::BF16, rows, cols, &h), ag = C.gmat(DType::BF16, rows, cols, &a),
          yg = C.gmat(DType::BF16, rows, cols);
      Mat h2 = C.gmat(DType::BF16, rows, cols, &h), y2 = C.gmat(DType::BF16, rows, cols);
      C.gpu.add_rmsnorm(hg, ag, alpha, wg, 1e-6f, yg);
      C.gpu.add_scaled(h2, ag, alpha);
      C.gpu.rmsnorm(h2, wg, 1e-6f, y2);
      const auto gh = C.gget(hg), gy = C.gget(yg);
      const double eh = rel_err(gh, C.cget(hc)), ey = rel_err(gy, C.cget(yc));
      const bool same = gh == C.gget(h2) && gy == C.gget(y2);
      check(eh < 1e-2 && ey < 1e-2 && same, strf("add_rmsnorm %lldx%lld", (long long)rows, (long long)cols),
            strf("rel h %.2e y %.2e, %s unfused", eh, ey, same ? "equal to" : "DIFFERS from"));
      C.keep.clear();
    }

  // qk_norm_rope: q and k per-head norms (+ RoPE) in one launch; vs CPU and vs the unfused GPU ops
  // (RoPE's products may contract into FMAs differently, so "close", not bitwise).
  for (int hd : {16, 64, 128, 256})
    for (bool rope : {true, false}) {
      const int64_t rows = 5, qh = 4, kh = 2;
      BatchInfo b;
      for (int64_t i = 0; i < rows; ++i) {
        b.tokens.push_back(0);
        b.positions.push_back(int32_t(i == 0 ? 0 : r.uniform(0, 500000)));
      }
      C.cpu.begin_batch(b);
      C.gpu.begin_batch(b);
      auto q = randn(r, size_t(rows * qh * hd)), k = randn(r, size_t(rows * kh * hd));
      auto qn = randn(r, size_t(hd), 0.2f, 1.f), kn = randn(r, size_t(hd), 0.2f, 1.f);
      TensorView tq{qn.data(), DType::F32, {hd}}, tk{kn.data(), DType::F32, {hd}};
      Weight qnc = C.cpu.load_vector(tq), knc = C.cpu.load_vector(tk), qng = C.gpu.load_vector(tq),
             kng = C.gpu.load_vector(tk);
      Mat qc = C.cmat(rows, qh * hd, &q), kc = C.cmat(rows, kh * hd, &k);
      Mat qg = C.gmat(DType::BF16, rows, qh * hd, &q), kg = C.gmat(DType::BF16, rows, kh * hd, &k);
      Mat q2 = C.gmat(DType::BF16, rows, qh * hd, &q), k2 = C.gmat(DType::BF16, rows, kh * hd, &k);
      C.cpu.qk_norm_rope(qc, kc, qnc, knc, 1e-6f, hd, rope, 10000.0);
      C.gpu.qk_norm_rope(qg, kg, qng, kng, 1e-6f, hd, rope, 10000.0);
      C.gpu.Backend::qk_norm_rope(q2, k2, qng, kng, 1e-6f, hd, rope, 10000.0);  // the unfused ops
      const auto gq = C.gget(qg), gk = C.gget(kg);
      const double eq = rel_err(gq, C.cget(qc)), ek = rel_err(gk, C.cget(kc));
      const double uq = rel_err(gq, C.gget(q2)), uk = rel_err(gk, C.gget(k2));
      check(eq < 1e-2 && ek < 1e-2 && uq < 2e-3 && uk < 2e-3,
            strf("qk_norm_rope head_dim %d rope %d", hd, int(rope)),
            strf("rel q %.2e k %.2e; vs unfused %.2e %.2e", eq, ek, uq, uk));
      C.keep.clear();
    }

  // rmsnorm_gate (lightning o_norm + sigmoid gate), in place like the model calls it.
  for (int64_t rows : {1, 7})
    for (int64_t cols : {4096, 1024, 96}) {
      auto x = randn(r, size_t(rows * cols)), z = randn(r, size_t(rows * cols)), w = randn(r, size_t(cols), 0.2f, 1.f);
      TensorView tv{w.data(), DType::F32, {cols}};
      Weight wc = C.cpu.load_vector(tv), wg = C.gpu.load_vector(tv);
      Mat xc = C.cmat(rows, cols, &x), zc = C.cmat(rows, cols, &z);
      Mat xg = C.gmat(DType::BF16, rows, cols, &x), zg = C.gmat(DType::BF16, rows, cols, &z);
      Mat x2 = C.gmat(DType::BF16, rows, cols, &x);
      C.cpu.rmsnorm_gate(xc, wc, 1e-6f, zc, xc);
      C.gpu.rmsnorm_gate(xg, wg, 1e-6f, zg, xg);
      C.gpu.Backend::rmsnorm_gate(x2, wg, 1e-6f, zg, x2);
      const auto g = C.gget(xg);
      const double e = rel_err(g, C.cget(xc));
      const bool same = g == C.gget(x2);
      check(e < 1e-2 && same, strf("rmsnorm_gate %lldx%lld", (long long)rows, (long long)cols),
            strf("rel %.2e, %s unfused", e, same ? "equal to" : "DIFFERS from"));
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
// lightning_block on recurrent calls (decode, verify; CUDA: the q/k norms + RoPE inside the GLA
// launch) against the same GPU ops unfused (the Backend:: default calling the separate launches) —
// the same bits, since the fused prologue keeps qk_norm_rope_bf16's arithmetic — and against the
// CPU. The fused launches are counted: a silent fall-back to the separate ops fails the check.
void test_lightning_block(Ctx& C, Rng& r) {
  for (int d : {128, 64})
    for (bool rope : {true, false}) {
      const int H = 4096 / d;
      CacheSpec spec;
      spec.lightning_layers = 2;
      spec.lightning_heads = H;
      spec.lightning_dim = d;
      spec.log_decay = slopes_log_decay(H);
      spec.lightning_scale = 1.0f / std::sqrt(float(d));
      spec.max_slots = 6;
      C.cpu.create_caches(spec);
      C.gpu.create_caches(spec);
      for (int s = 0; s < 6; ++s) C.cpu.reset_state(s), C.gpu.reset_state(s);
      auto qn = randn(r, size_t(d), 0.2f, 1.f), kn = randn(r, size_t(d), 0.2f, 1.f),
           on = randn(r, size_t(H * d), 0.2f, 1.f);
      TensorView tq{qn.data(), DType::F32, {d}}, tk{kn.data(), DType::F32, {d}}, to{on.data(), DType::F32, {H * d}};
      Weight qnc = C.cpu.load_vector(tq), knc = C.cpu.load_vector(tk), onc = C.cpu.load_vector(to);
      Weight qng = C.gpu.load_vector(tq), kng = C.gpu.load_vector(tk), ong = C.gpu.load_vector(to);
      // Three sequences per call (decode steps and verify-sized calls), packed in the order seq 1,
      // seq 0, seq 2; the fused launch on slots 0-2, the separate ops on slots 3-5.
      const std::vector<std::array<int64_t, 3>> calls = {{1, 1, 1}, {1, 5, 2}, {3, 1, 1}, {1, 1, 1}};
      std::array<int64_t, 3> len{0, 0, 0};
      bool same = true;
      double worst = 0;
      const int64_t fused_before = C.gpu.fused_gla_launches();
      for (const auto& call : calls) {
        auto batch = [&](int slot0) {
          BatchInfo b;
          const int order[3] = {1, 0, 2};
          std::array<int64_t, 3> start{};
          int64_t row = 0;
          for (int oi : order) start[size_t(oi)] = row, row += call[size_t(oi)];
          for (int si = 0; si < 3; ++si) {
            SeqEntry e;
            e.slot = slot0 + si;
            e.start = start[size_t(si)];
            e.n_new = call[size_t(si)];
            e.cached = len[size_t(si)];
            b.seqs.push_back(e);
          }
          for (int64_t i = 0; i < row; ++i) b.tokens.push_back(1), b.positions.push_back(int32_t(1000 * len[0] + 17 * i));
          return b;
        };
        const BatchInfo b0 = batch(0), b3 = batch(3);
        const int64_t N = int64_t(b0.tokens.size()), w = int64_t(H) * d;
        auto q = randn(r, size_t(N * w)), k = randn(r, size_t(N * w)), v = randn(r, size_t(N * w)),
             z = randn(r, size_t(N * w));
        Mat zg = C.gmat(DType::BF16, N, w, &z), zc = C.cmat(N, w, &z);
        Backend::LightningNorms ng, nc;
        ng.q_norm = &qng, ng.k_norm = &kng, ng.o_norm = &ong, ng.z = &zg;
        nc.q_norm = &qnc, nc.k_norm = &knc, nc.o_norm = &onc, nc.z = &zc;
        ng.rope = nc.rope = rope;
        ng.theta = nc.theta = 10000.0;
        ng.head_dim = nc.head_dim = d;
        ng.eps = nc.eps = 1e-6f;
        C.gpu.begin_batch(b0);
        Mat og = C.gmat(DType::BF16, N, w);
        C.gpu.lightning_block(1, C.gmat(DType::BF16, N, w, &q), C.gmat(DType::BF16, N, w, &k),
                              C.gmat(DType::BF16, N, w, &v), ng, og);
        C.gpu.begin_batch(b3);
        Mat o2 = C.gmat(DType::BF16, N, w);
        C.gpu.Backend::lightning_block(1, C.gmat(DType::BF16, N, w, &q), C.gmat(DType::BF16, N, w, &k),
                                       C.gmat(DType::BF16, N, w, &v), ng, o2);
        C.cpu.begin_batch(b0);
        Mat oc = C.cmat(N, w);
        C.cpu.lightning_block(1, C.cmat(N, w, &q), C.cmat(N, w, &k), C.cmat(N, w, &v), nc, oc);
        const auto got = C.gget(og);
        same = same && got == C.gget(o2);
        worst = std::max(worst, rel_err(got, C.cget(oc)));
        for (int si = 0; si < 3; ++si) len[size_t(si)] += call[size_t(si)];
        C.keep.clear();
      }
      const size_t sf = size_t(H) * d * d;
      std::vector<float> s0(sf), s3(sf);
      for (int si = 0; si < 3; ++si) {
        C.gpu.download_state(si, 1, s0.data());
        C.gpu.download_state(3 + si, 1, s3.data());
        same = same && s0 == s3;
      }
      const int64_t fused = C.gpu.fused_gla_launches() - fused_before;
      check(same && worst < 2e-2 && fused == int64_t(calls.size()),
            strf("lightning_block recurrent d%d rope %d", d, int(rope)),
            strf("%lld fused launches, %s unfused (out, states); rel vs cpu %.2e", (long long)fused,
                 same ? "equal to" : "DIFFERS from", worst));
    }
}

// ------------------------------------------------------------------------------------------------
// Exact lightning rollback (spec §6.2): the CUDA op against the CPU op from identical fp32
// snapshots (states copied GPU -> CPU first), keep 0 (a copy), partial and full, slot ==
// snapshot_slot (in place), k/v as row slices (as Engine::rollback passes the captured rows); the
// GPU result against the recurrent GLA kernel fed the same kept tokens from the snapshot; nothing
// else touched; argument errors.
bool throws(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error&) {
    return true;
  }
  return false;
}

void test_rollback(Ctx& C, Rng& r) {
  struct Geo {
    int H, Hkv, d;
  };
  bool first = true;
  for (Geo geo : {Geo{4, 4, 16}, Geo{8, 2, 32}, Geo{4, 2, 64}, Geo{32, 32, 128}}) {
    const int L = 3, slots = 4;
    CacheSpec spec;
    spec.lightning_layers = L;
    spec.lightning_heads = geo.H;
    spec.lightning_dim = geo.d;
    spec.log_decay = slopes_log_decay(geo.H);
    spec.lightning_scale = 1.0f / std::sqrt(float(geo.d));
    spec.max_slots = slots;
    C.cpu.create_caches(spec);
    C.gpu.create_caches(spec);
    for (int s = 0; s < slots; ++s) C.cpu.reset_state(s), C.gpu.reset_state(s);
    const int64_t qw = int64_t(geo.H) * geo.d, kw = int64_t(geo.Hkv) * geo.d;
    const size_t sf = size_t(geo.H) * geo.d * geo.d;
    const std::string name = strf("lightning_rollback H%d/%d d%d", geo.H, geo.Hkv, geo.d);

    // Non-trivial states in slots 0..2 of every layer: one 70-token (chunked) call per slot.
    {
      BatchInfo b;
      for (int s = 0; s < 3; ++s) {
        SeqEntry e;
        e.slot = s, e.start = 70 * s, e.n_new = 70, e.cached = 0;
        b.seqs.push_back(e);
      }
      for (int i = 0; i < 210; ++i) b.tokens.push_back(1), b.positions.push_back(i % 70);
      C.gpu.begin_batch(b);
      for (int l = 0; l < L; ++l) {
        auto q = randn(r, size_t(210 * qw)), k = randn(r, size_t(210 * kw)), v = randn(r, size_t(210 * kw));
        Mat qg = C.gmat(DType::BF16, 210, qw, &q), kg = C.gmat(DType::BF16, 210, kw, &k),
            vg = C.gmat(DType::BF16, 210, kw, &v), og = C.gmat(DType::BF16, 210, qw);
        C.gpu.lightning_attention(l, qg, kg, vg, og);
      }
      C.keep.clear();
    }
    auto gstate = [&](int s, int l) {
      std::vector<float> h(sf);
      C.gpu.download_state(s, l, h.data());
      return h;
    };
    auto cstate = [&](int s, int l) { return std::vector<float>(C.cpu.state(s, l), C.cpu.state(s, l) + sf); };
    auto sync_cpu = [&] {
      for (int s = 0; s < slots; ++s)
        for (int l = 0; l < L; ++l) {
          auto h = gstate(s, l);
          std::copy(h.begin(), h.end(), C.cpu.state(s, l));
        }
    };

    // 14 captured rows; the op sees rows [2, 14) like a verify call packed after another sequence.
    const int64_t T = 12, off = 2;
    auto k = randn(r, size_t((T + off) * kw)), v = randn(r, size_t((T + off) * kw));
    Mat kc = C.cmat(T + off, kw, &k).slice_rows(off, T), vc = C.cmat(T + off, kw, &v).slice_rows(off, T);
    Mat kg = C.gmat(DType::BF16, T + off, kw, &k).slice_rows(off, T);
    Mat vg = C.gmat(DType::BF16, T + off, kw, &v).slice_rows(off, T);

    struct Case {
      int64_t keep;
      int slot, snap, layer;
    };
    const std::vector<Case> cases = {{0, 0, 1, 1}, {1, 0, 1, 1}, {3, 0, 2, 0}, {7, 3, 1, 2},
                                     {T, 0, 1, 1}, {5, 1, 1, 1}, {T, 2, 2, 2}, {0, 1, 1, 0}};
    for (const Case& c : cases) {
      sync_cpu();
      std::vector<std::vector<float>> before;
      for (int s = 0; s < slots; ++s)
        for (int l = 0; l < L; ++l) before.push_back(gstate(s, l));
      C.cpu.lightning_rollback(c.layer, c.slot, c.snap, kc, vc, c.keep);
      C.gpu.lightning_rollback(c.layer, c.slot, c.snap, kg, vg, c.keep);
      const double e = rel_err(gstate(c.slot, c.layer), cstate(c.slot, c.layer));
      bool others = true;
      for (int s = 0; s < slots; ++s)
        for (int l = 0; l < L; ++l)
          if (s != c.slot || l != c.layer) others &= gstate(s, l) == before[size_t(s * L + l)];
      const bool ok = (c.keep == 0 ? e == 0.0 : e < 1e-5) && others;
      check(ok,
            strf("%s keep %lld slot %d <- %d layer %d%s", name.c_str(), (long long)c.keep, c.slot, c.snap, c.layer,
                 c.slot == c.snap ? " (in place)" : ""),
            strf("rel %.2e vs cpu, others %s", e, others ? "untouched" : "CHANGED"));
    }

    // Against the recurrence: the snapshot (slot 1, layer 1) advanced by the recurrent kernel over
    // the same kept rows (in slot 3) equals rollback(keep) into slot 0.
    double worst = 0;
    for (int64_t keep : {int64_t(1), int64_t(4), T}) {
      C.gpu.copy_state(1, 3);
      BatchInfo b;
      SeqEntry e;
      e.slot = 3, e.start = 0, e.n_new = keep, e.cached = 100;
      b.seqs.push_back(e);
      for (int64_t i = 0; i < keep; ++i) b.tokens.push_back(1), b.positions.push_back(int32_t(100 + i));
      C.gpu.begin_batch(b);
      auto q = randn(r, size_t(keep * qw));
      Mat qg = C.gmat(DType::BF16, keep, qw, &q), og = C.gmat(DType::BF16, keep, qw);
      C.gpu.lightning_attention(1, qg, kg.slice_rows(0, keep), vg.slice_rows(0, keep), og);
      C.gpu.lightning_rollback(1, 0, 1, kg, vg, keep);
      worst = std::max(worst, rel_err(gstate(0, 1), gstate(3, 1)));
    }
    check(worst < 1e-5, name + " == recurrent kernel over the kept tokens", strf("worst rel %.2e", worst));

    if (first) {  // argument errors name the problem instead of corrupting states
      first = false;
      Mat kf = C.gmat(DType::F32, T, kw, &k);
      const bool all = throws([&] { C.gpu.lightning_rollback(1, 0, 1, kg, vg, T + 1); }) &&   // keep > rows
                       throws([&] { C.gpu.lightning_rollback(L, 0, 1, kg, vg, 1); }) &&       // layer
                       throws([&] { C.gpu.lightning_rollback(1, slots, 1, kg, vg, 1); }) &&   // slot
                       throws([&] { C.gpu.lightning_rollback(1, 0, -1, kg, vg, 1); }) &&      // snapshot slot
                       throws([&] { C.gpu.lightning_rollback(1, 0, 1, kg, vg, -1); }) &&      // negative keep
                       throws([&] { C.gpu.lightning_rollback(1, 0, 1, kf, vg, 1); }) &&       // k/v dtypes differ
                       throws([&] { C.gpu.lightning_rollback(1, 0, 1, kg.reshape(T * kw / 8, 8),
                                                             vg.reshape(T * kw / 8, 8), 1); });  // width % d
      check(all, name + " argument errors throw");
    }
    C.keep.clear();
  }
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
  bool dense_ok = true, gate_same = true;
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
      if (layer == 1) {  // the output gate in the attention stores == sigmoid_mul after (the call repeats: same cache)
        auto z = randn(r, size_t(N * qw));
        Mat zg = C.gmat(DType::BF16, N, qw, &z), gated = C.gmat(DType::BF16, N, qw), after = C.gmat(DType::BF16, N, qw);
        C.gpu.sparse_block(layer, qg, kg, vg, &zg, gated);
        C.gpu.sigmoid_mul(og, zg, after);
        gate_same = gate_same && C.gget(gated) == C.gget(after);
      }
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
  check(gate_same, strf("sparse_block %s: gate in the stores == sigmoid_mul after", sg.name));
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
    for (size_t k = 0; k < res.size(); ++k) out.logits.emplace_back(res[k].begin(), res[k].end());
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

// ------------------------------------------------------------------------------------------------
// Speculative decoding through the engine and the scheduler on CUDA: the tiny preset with
// counter-RNG weights (identical on every backend object), bf16 activations.
struct TinyGpu {
  CudaBackend gpu;
  ModelConfig cfg;
  std::unique_ptr<Model> model;
  explicit TinyGpu(bool batch_invariant = false) : gpu(0, batch_invariant), cfg(preset_config("tiny")) {
    cfg.random_weights = true;
    model = std::make_unique<Model>(cfg, random_weights(cfg, gpu, 1234), gpu,
                                    ModelLimits{.max_batch_tokens = 512, .max_logit_rows = 64});
  }
};

std::vector<int32_t> tiny_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(5, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(g);
  return t;
}

// The prompt in chunks of 256, every chunk in the regime of the whole prompt (as the scheduler
// prefills); the logits after its last token.
std::vector<float> prefill(Engine& e, int s, const std::vector<int32_t>& prompt) {
  const int64_t n = int64_t(prompt.size());
  std::vector<float> last;
  for (int64_t at = 0; at < n; at += 256) {
    const int64_t take = std::min<int64_t>(256, n - at);
    Engine::Request r{s, std::span(prompt).subspan(size_t(at), size_t(take)), n, false, at + take == n};
    auto out = e.step(std::span(&r, 1));
    if (at + take == n) last.assign(out[0].begin(), out[0].end());
  }
  return last;
}

// Engine::rollback on CUDA: verify 5 tokens, keep the first `keep` (optionally after a self-draft
// pass that is rolled back to the snapshot first); the lightning states (per head) and the next
// step's logits must equal a run that only ever saw the kept tokens. The two runs use different
// call shapes (a 5-token verify vs a keep-token call), so they agree up to bf16 kernel rounding,
// not bitwise; a wrong rollback (a rejected token left in a state, a missing decay) is far larger
// in the fast-decaying heads, hence the per-head maximum.
void test_engine_rollback() {
  struct Case {
    int prompt, keep;
    bool draft;
  };
  // 40: dense regime; 318 + 5 crosses the page boundary at 320 and K1/K2 chunk ends (sparse).
  const std::vector<Case> cases = {{40, 0, false},  {40, 1, false},  {40, 3, false},  {40, 5, false}, {40, 2, true},
                                   {318, 0, false}, {318, 1, false}, {318, 4, false}, {318, 2, true}};
  for (const Case& c : cases) {
    TinyGpu A, B;
    const int V = A.cfg.vocab_size;
    const auto prompt = tiny_tokens(c.prompt, V, 3);
    const auto verify = tiny_tokens(5, V, 4);
    const int32_t next = 77;
    Engine ea(*A.model, {.max_sequences = 1, .max_context = 1024});
    Engine eb(*B.model, {.max_sequences = 1, .max_context = 1024});
    const int sa = ea.open(), sb = eb.open();  // both in lightning slot 0 (the snapshot takes slot 1)
    prefill(ea, sa, prompt);
    prefill(eb, sb, prompt);
    ea.begin_speculation(sa);
    if (c.draft) {
      for (int i = 0; i < 3; ++i) {
        Engine::Request r{sa, std::span(&verify[size_t(i)], 1)};
        ea.step(std::span(&r, 1), 2);
      }
      ea.rollback(sa, c.prompt);
    }
    Engine::Request rv{sa, verify, -1, true};
    ea.step(std::span(&rv, 1));
    ea.rollback(sa, c.prompt + c.keep);
    if (c.keep > 0) {
      Engine::Request rk{sb, std::span(verify).first(size_t(c.keep))};
      eb.step(std::span(&rk, 1));
    }
    const int L = A.cfg.count(MixerKind::Lightning), H = A.cfg.lightning_heads, d = A.cfg.lightning_head_dim;
    const size_t hs = size_t(d) * d;
    double state_err = 0;
    std::vector<float> ga(size_t(H) * hs), gb(ga.size());
    for (int l = 0; l < L; ++l) {
      A.gpu.download_state(0, l, ga.data());
      B.gpu.download_state(0, l, gb.data());
      for (int h = 0; h < H; ++h)
        state_err = std::max(state_err, rel_err(std::vector<float>(ga.begin() + h * hs, ga.begin() + (h + 1) * hs),
                                                std::vector<float>(gb.begin() + h * hs, gb.begin() + (h + 1) * hs)));
    }
    Engine::Request na{sa, std::span(&next, 1)}, nb{sb, std::span(&next, 1)};
    const auto la = ea.step(std::span(&na, 1))[0], lb = eb.step(std::span(&nb, 1))[0];
    const double logit_err = rel_err(la, lb);
    check(ea.length(sa) == eb.length(sb) && state_err < 1e-2 && logit_err < 2e-2,
          strf("engine rollback prompt %d keep %d%s", c.prompt, c.keep, c.draft ? " after a draft pass" : ""),
          strf("states rel %.2e (worst head), next logits rel %.2e", state_err, logit_err));
  }
}

std::vector<std::vector<int32_t>> scheduler_generate(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                                     int n, SpeculativeOptions so, SpeculativeStats* stats) {
  Engine e(model, {.max_sequences = int(prompts.size()), .max_context = 1024});
  SchedulerOptions opt;
  opt.speculative = so;
  Scheduler sch(e, opt);
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest req;
    req.prompt = prompts[i];
    req.sampling.temperature = 0;
    req.max_tokens = n;
    req.ignore_eos = true;
    req.on_token = [&out, i](const SampledToken& t) {
      out[i].push_back(t.id);
      return true;
    };
    sch.submit(std::move(req));
  }
  sch.run();
  if (stats) *stats = sch.stats().speculative;
  return out;
}

// Teacher forcing: plain single-token decoding of prompt + tokens; each token must be the argmax of
// the logits before it, or within 1% of the row's largest |logit| of the maximum (a near tie that
// bf16 rounding of a multi-token verify call may resolve the other way).
struct Forced {
  int exact = 0, near = 0, bad = 0;
  std::string first_bad;
};
Forced teacher_force(Model& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens) {
  Engine e(model, {.max_sequences = 1, .max_context = 1024});
  const int s = e.open();
  std::vector<float> row = prefill(e, s, prompt);
  Forced f;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const size_t am = size_t(std::max_element(row.begin(), row.end()) - row.begin());
    float big = 0;
    for (float x : row) big = std::max(big, std::fabs(x));
    const float t = row[size_t(tokens[i])];
    if (size_t(tokens[i]) == am) {
      ++f.exact;
    } else if (t >= row[am] - 1e-2f * big) {
      ++f.near;
    } else if (f.bad++ == 0) {
      f.first_bad = strf("token %zu: %d (logit %.5f) but argmax %zu (%.5f)", i, tokens[i], t, am, row[am]);
    }
    Engine::Request r{s, std::span(&tokens[i], 1)};
    row = e.step(std::span(&r, 1))[0];
  }
  return f;
}

// Greedy speculative output (self-draft and prompt lookup) against plain greedy decoding, 300
// tokens: prompt 20 crosses dense_len 256 while decoding (the verify is shortened at the switch),
// prompt 300 decodes in the sparse regime; alone and both in one batch.
// A speculative configuration of the greedy tests, and its outputs for every prompt: each prompt
// alone (statistics summed), or all of them in one batch.
struct SpecMode {
  const char* name;
  SpeculativeOptions o;
  bool batched;
};
std::vector<std::vector<int32_t>> speculative_outputs(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                                      int n, const SpecMode& m, SpeculativeStats& st) {
  if (m.batched) return scheduler_generate(model, prompts, n, m.o, &st);
  std::vector<std::vector<int32_t>> outs;
  for (const auto& p : prompts) {
    SpeculativeStats one;
    outs.push_back(scheduler_generate(model, {p}, n, m.o, &one)[0]);
    st.rounds += one.rounds, st.drafted += one.drafted, st.accepted += one.accepted, st.emitted += one.emitted;
  }
  return outs;
}

void test_speculative_greedy() {
  TinyGpu T;
  const int V = T.cfg.vocab_size, n = 300;
  const std::vector<std::vector<int32_t>> prompts = {tiny_tokens(20, V, 21), tiny_tokens(300, V, 22)};
  std::vector<std::vector<int32_t>> plain;
  for (const auto& p : prompts) plain.push_back(scheduler_generate(*T.model, {p}, n, {}, nullptr)[0]);
  const std::vector<SpecMode> modes = {
      {"self L2 K4", {.mode = SpeculativeMode::Self, .draft_layers = 2, .draft_tokens = 4}, false},
      {"self L1 K7", {.mode = SpeculativeMode::Self, .draft_layers = 1, .draft_tokens = 7}, false},
      {"lookup K4", {.mode = SpeculativeMode::Lookup, .draft_layers = 8, .draft_tokens = 4}, false},
      {"self L2 K4, batch of 2", {.mode = SpeculativeMode::Self, .draft_layers = 2, .draft_tokens = 4}, true},
      {"lookup K4, batch of 2", {.mode = SpeculativeMode::Lookup, .draft_layers = 8, .draft_tokens = 4}, true},
  };
  for (const SpecMode& m : modes) {
    SpeculativeStats st;
    const auto outs = speculative_outputs(*T.model, prompts, n, m, st);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Forced f = teacher_force(*T.model, prompts[i], outs[i]);
      size_t same = 0;
      while (same < outs[i].size() && same < plain[i].size() && outs[i][same] == plain[i][same]) ++same;
      const bool identical = outs[i] == plain[i];
      check(int(outs[i].size()) == n && f.bad == 0,
            strf("speculative greedy %s, prompt %zu", m.name, prompts[i].size()),
            strf("%s; argmax %d, near tie %d, wrong %d%s", identical ? "identical to plain" :
                 strf("same as plain for %zu tokens", same).c_str(), f.exact, f.near, f.bad,
                 f.bad ? (" (" + f.first_bad + ")").c_str() : ""));
    }
    // The drafts must have been exercised: rounds with accepted drafts mean rollbacks with keep > 1.
    const bool lookup = m.o.mode == SpeculativeMode::Lookup;
    check(st.rounds > 0 && st.drafted > 0 && (lookup || st.accepted > 0),
          strf("speculative greedy %s: drafts verified", m.name),
          strf("%lld rounds, acceptance %.3f (%lld/%lld), %.2f tokens per round", (long long)st.rounds,
               st.acceptance(), (long long)st.accepted, (long long)st.drafted, st.tokens_per_round()));
  }
}

// Batch-invariant backend (`--deterministic`): speculative greedy must equal plain greedy token for
// token, in both regimes, alone and in a batch of 2 (the verify rows computed exactly as decode
// rows), and a sequence decoded in a batch equals it decoded alone.
void test_batch_invariant_greedy() {
  TinyGpu T(/*batch_invariant=*/true);
  const int V = T.cfg.vocab_size, n = 300;
  const std::vector<std::vector<int32_t>> prompts = {tiny_tokens(20, V, 21), tiny_tokens(300, V, 22)};
  std::vector<std::vector<int32_t>> plain;
  for (const auto& p : prompts) plain.push_back(scheduler_generate(*T.model, {p}, n, {}, nullptr)[0]);
  const auto together = scheduler_generate(*T.model, prompts, n, {}, nullptr);
  for (size_t i = 0; i < prompts.size(); ++i)
    check(together[i] == plain[i], strf("batch-invariant: prompt %zu in a batch of 2 == alone", prompts[i].size()),
          strf("%zu tokens", plain[i].size()));
  const std::vector<SpecMode> modes = {
      {"self L2 K4", {.mode = SpeculativeMode::Self, .draft_layers = 2, .draft_tokens = 4}, false},
      {"self L1 K7", {.mode = SpeculativeMode::Self, .draft_layers = 1, .draft_tokens = 7}, false},
      {"lookup K4", {.mode = SpeculativeMode::Lookup, .draft_layers = 8, .draft_tokens = 4}, false},
      {"lookup K8 adaptive", {.mode = SpeculativeMode::Lookup, .draft_layers = 8, .draft_tokens = 8, .adaptive = true},
       false},
      {"self L2 K4, batch of 2", {.mode = SpeculativeMode::Self, .draft_layers = 2, .draft_tokens = 4}, true},
  };
  for (const SpecMode& m : modes) {
    SpeculativeStats st;
    const auto outs = speculative_outputs(*T.model, prompts, n, m, st);
    for (size_t i = 0; i < prompts.size(); ++i) {
      size_t same = 0;
      while (same < outs[i].size() && same < plain[i].size() && outs[i][same] == plain[i][same]) ++same;
      check(outs[i] == plain[i], strf("batch-invariant speculative greedy %s, prompt %zu == plain", m.name,
                                      prompts[i].size()),
            strf("same for %zu of %zu tokens; %lld rounds, %lld/%lld drafts accepted", same, plain[i].size(),
                 (long long)st.rounds, (long long)st.accepted, (long long)st.drafted));
    }
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
    // SALA_CUDA_TESTS=quant: only the packed-weight checks (a kernel's quick loop on the device).
    const char* only = std::getenv("SALA_CUDA_TESTS");
    const bool quant_only = only && std::strcmp(only, "quant") == 0;
    if (!quant_only) test_memory(C, r), test_matmul(C, r);
    { void test_quant_parity(int&, int&); test_quant_parity(g_pass, g_fail); }  // cuda_quant_parity.cpp
    if (quant_only) {
      std::printf("%d passed, %d failed (SALA_CUDA_TESTS=quant)\n", g_pass, g_fail);
      return g_fail ? 1 : 0;
    }
    test_fused_ops(C, r);
    test_rows_ops(C, r);
    test_lightning(C, r);
    test_lightning_block(C, r);
    test_rollback(C, r);
    const std::vector<SparseGeo> geos = {
        {"tiny d16 G2 bs16", 16, 2, 4, 16, 8, 4, 1, 4, 4, {100, 100, 100}, 150},
        {"small d64 G2 bs64", 64, 2, 4, 64, 32, 16, 1, 8, 8, {500, 500, 500}, 1100},
        {"9b-like d128 G16 bs64", 128, 2, 32, 64, 32, 16, 1, 4, 4, {300, 300, 300, 200}, 600},
        {"d32 G32 bs32", 32, 1, 32, 32, 16, 8, 1, 2, 2, {200, 200}, 200},
    };
    for (const auto& g : geos) test_sparse(C, r, g);  // selection split chosen per batch (auto)
    // Both selection paths on every geometry: one fused CTA per (token, head), and the scoring
    // split over CTAs (3: uneven ranges; 16: splits with no tiles at short contexts).
    std::deque<std::string> names;
    for (int splits : {1, 3, 16}) {
      C.gpu.set_select_splits(splits);
      for (SparseGeo g : geos) {
        g.name = names.emplace_back(strf("%s, select splits %d", g.name, splits)).c_str();
        test_sparse(C, r, g);
      }
    }
    C.gpu.set_select_splits(-1);
    test_graphs();
    test_engine_rollback();
    test_speculative_greedy();
    test_batch_invariant_greedy();
  } catch (const std::exception& e) {
    std::printf("[FAIL] exception: %s\n", e.what());
    ++g_fail;
  }
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
