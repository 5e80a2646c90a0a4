// Packed weights on the GPU (called from cuda_parity.cpp's main): the CUDA packed matmul against
// the CPU packed matmul (the f32 reference) for every format at N = 1, 2, 3, 8 (decode GEMV, one
// n-tile, every warp count), 9, 16, 17, 24, 25, 32 (2 or 4 n-tiles per decoded weight, one or two
// row blocks per CTA), 33, 64 (the fused GEMM where its tiles fill the GPU, else two GEMV
// launches) and 512 (bf16 dequantization + cuBLAS), x/y dtypes; the prompt GEMM against the
// dequantize + cuBLAS path; matmul_group (grouped GEMV launch) against per-part matmul; matmul_silu_mul (the
// activation in the GEMV's epilogue) against the unfused pair and the CPU; the device tiling against
// the host's (quant_layout.h); random packed weights; load errors; whole quantized models (CPU vs
// GPU, packed vs dequantized, CUDA graphs on vs off).
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/quant_gemv_ring.h"
#include "backend/cuda/w8a8_gemm.h"
#include "backend/quant_layout.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/replay.h"
#include "io/safetensors.h"
#include "model/loader.h"
#include "model/presets.h"
#include "model/quant.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"

using namespace sala;
namespace fs = std::filesystem;

namespace sala::cuda {
void set_qgemv_tuning(int nt_variant, bool trigger);  // quant_gemv.cu (tests and benchmarks)
void set_qgemv_small_variant(int v);
void set_qgemv_prefetch(bool on);
}

namespace {

int* g_pass = nullptr;
int* g_fail = nullptr;

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
  (ok ? *g_pass : *g_fail)++;
}

std::vector<float> randn(size_t n, uint64_t seed, float std = 1.f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = round_bf16(std * normal01(seed, i));
  return v;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += double(a[i] - ref[i]) * double(a[i] - ref[i]);
    den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<float> run_matmul(Backend& b, const Weight& w, const std::vector<float>& x, int64_t n, DType xd, DType yd) {
  auto xb = b.alloc(size_t(n * w.in()) * dtype_size(xd) + 16), yb = b.alloc(size_t(n * w.out()) * dtype_size(yd) + 16);
  Mat xm = xb->mat(xd, n, w.in()), ym = yb->mat(yd, n, w.out());
  b.upload(xm, x.data());
  std::vector<float> y(size_t(n * w.out()), std::nanf(""));
  b.upload(ym, y.data());  // poison
  b.matmul(xm, w, ym);
  b.download(ym, y.data());
  return y;
}

struct Fmt {
  const char* name;
  QuantFormat format;
  int group;
  bool zero_points;
  int bits;
};

const Fmt kFormats[] = {
    {"fp8", QuantFormat::FP8, 0, false, 4},          {"int8", QuantFormat::INT8, 0, false, 4},
    {"int4 g64 zp", QuantFormat::INT4, 64, true, 4}, {"int4 g32 sym", QuantFormat::INT4, 32, false, 4},
    {"mlx4 g64", QuantFormat::MLX, 64, false, 4},    {"mlx8 g32", QuantFormat::MLX, 32, false, 8},
    {"mlx8 g48", QuantFormat::MLX, 48, false, 8},    {"int4 g128 zp", QuantFormat::INT4, 128, true, 4},
    {"mlx4 g128", QuantFormat::MLX, 128, false, 4},
};

// The parameter form the CUDA backend takes for a test format: grouped int4 (quantized, with zero
// points or symmetric, or random with integer zero points) zero-packed; MLX and weights of one
// group per row (in = group) the 8-byte (per row: f32) form.
bool expect_zero_packed(const Fmt& f, int64_t in) { return f.format == QuantFormat::INT4 && f.group < in; }

// The CUDA packed format of a test format (int4 zero points and symmetric: both Q4).
WeightFormat packed_format(const Fmt& f) {
  return f.format == QuantFormat::FP8                                        ? WeightFormat::FP8
         : f.format == QuantFormat::INT8 || (f.format == QuantFormat::MLX && f.bits == 8) ? WeightFormat::Q8
                                                                                           : WeightFormat::Q4;
}

// Random canonical packed data (big shapes: quantize_matrix's fp8 search would take seconds).
// zero_points (Q4): scales of 7 significant bits and biases −s·z, z 7 or 8, as `sala quantize`
// writes int4 with zero points; otherwise biases anywhere (affine, as MLX).
PackedMatrix random_packed(WeightFormat f, int64_t rows, int64_t cols, int64_t group, uint64_t seed,
                           bool zero_points = false) {
  PackedMatrix p;
  p.format = f, p.rows = rows, p.cols = cols, p.group = group;
  p.codes.resize(size_t(rows) * size_t(f == WeightFormat::Q4 ? cols / 2 : cols));
  for (size_t i = 0; i < p.codes.size(); ++i) {
    uint8_t b = uint8_t(splitmix64(seed * 0x9e3779b97f4a7c15ull + i));
    if (f == WeightFormat::FP8 && (b & 0x7f) == 0x7f) b = 0;
    p.codes[i] = b;
  }
  const size_t np = size_t(rows * (cols / group));
  float s0, b0;
  qlayout::random_params(int(f), 1.0f / std::sqrt(float(cols)), &s0, &b0);
  for (size_t i = 0; i < np; ++i) {
    const float u = 0.75f + 0.5f * uniform01(seed, i);
    if (f == WeightFormat::Q4 && zero_points) {
      const float s = qlayout::int4_scale_7_bits(s0 * u);
      p.scales.push_back(s);
      p.biases.push_back(-s * float(7 + (splitmix64(seed + i) & 1)));
      continue;
    }
    p.scales.push_back(s0 * u);
    if (f != WeightFormat::FP8) p.biases.push_back(b0 * u);
  }
  return p;
}

void test_matmuls(CpuBackend& cpu, CudaBackend& gpu) {
  struct S {
    int64_t out, in;
    bool big;
  };
  // 72×200: per-row formats whose last tile is partial (200 % 32 != 0). 8200×256, 32800×64: the
  // automatic N ≤ 8 launch shape changes past 8192, 16384 and 32768 rows. 16400×512, 32800×256:
  // the batched (9–32 rows) kernel's 4 and 8 row blocks per CTA (4096×4096, 1000×16384: 2).
  const S shapes[] = {{64, 64 * 3, false}, {200, 384, false},    {129, 768, false},   {72, 200, false},
                      {8200, 256, false},  {32800, 64, false},  {16400, 512, false}, {32800, 256, false},
                      {4096, 4096, true},  {1000, 16384, true}};
  for (const Fmt& f : kFormats)
    for (const S& s : shapes) {
      if (f.group && s.in % f.group) continue;
      // Big shapes: int4 with tile groups in both parameter forms (int4: zero-packed; MLX 4-bit: 8
      // bytes), and group 32 (two groups per tile; at in = 16384 its parameters take more than 48 KB
      // of shared memory).
      if (s.big && ((f.format == QuantFormat::MLX && f.bits != 4) ||
                    (f.format == QuantFormat::INT4 && !f.zero_points && f.group != 32)))
        continue;
      PackedMatrix pm;
      if (s.big) {  // the format's packed form directly
        pm = random_packed(packed_format(f), s.out, s.in, f.group ? f.group : s.in, 31 + uint64_t(s.out),
                           f.format == QuantFormat::INT4);
      } else {
        const auto w = randn(size_t(s.out * s.in), 31 + uint64_t(s.out), 1.0f / std::sqrt(float(s.in)));
        pm = pack_matrix(quantize_matrix(w.data(), s.out, s.in, f.format, f.group, f.zero_points, f.bits));
      }
      const Weight wc = cpu.load_quantized_weight(pm.view(), f.name), wg = gpu.load_quantized_weight(pm.view(), f.name);
      const std::string shape = strf("%lldx%lld", (long long)s.out, (long long)s.in);
      check(wg.zero_packed == expect_zero_packed(f, s.in), strf("parameter form %s %s", f.name, shape.c_str()),
            wg.zero_packed ? "zero-packed" : "8-byte");
      if (!s.big) {  // the device tiling equals the host's
        const qlayout::TileGeom geo{int(pm.format), pm.rows, pm.cols, pm.group, wg.zero_packed};
        std::vector<uint8_t> host(size_t(geo.code_bytes())), dev(host.size());
        qlayout::tile_codes(geo, pm.codes.data(), host.data());
        std::vector<uint8_t> hp(size_t(geo.param_bytes())), dp(hp.size());
        qlayout::tile_params(geo, pm.scales.data(), pm.biases.empty() ? nullptr : pm.biases.data(), hp.data());
        gpu.synchronize();
        cudaMemcpy(dev.data(), wg.w.data, dev.size(), cudaMemcpyDeviceToHost);
        cudaMemcpy(dp.data(), wg.scales, dp.size(), cudaMemcpyDeviceToHost);
        check(host == dev && hp == dp, strf("packed tiles %s %s == host layout", f.name, shape.c_str()),
              strf("%zu code bytes, %zu params", host.size(), hp.size()));
      }
      for (int64_t n : {1, 2, 3, 8, 9, 16, 17, 24, 25, 32, 33, 64, 512}) {
        if (s.big && (n == 3 || n == 16 || n == 24 || n == 25 || n == 64)) continue;
        const auto x = randn(size_t(n * s.in), 7 + uint64_t(n));
        const auto ref = run_matmul(cpu, wc, x, n, DType::F32, DType::F32);
        // GEMV (N ≤ 32; ≤ 64 where the fused GEMM does not take the product) with f32 output: exact
        // products of exact bf16 values, fp32 sums: tight. cuBLAS and the fused GEMM multiply the
        // bf16-rounded dequantized weight: bf16 tolerance.
        const cuda::QWeight qw = CudaBackend::qweight(wg);
        const bool gemv = n <= 32 || (n <= 64 && !cuda::qgemm_preferred(qw, int(n)));
        const double tol32 = gemv ? (pm.format == WeightFormat::Q4 ? 5e-5 : 2e-5) : 1e-2;
        double e = rel_err(run_matmul(gpu, wg, x, n, DType::BF16, DType::F32), ref);
        check(e < tol32, strf("packed matmul %s N=%lld %s y:f32", f.name, (long long)n, shape.c_str()),
              strf("rel %.2e", e));
        e = rel_err(run_matmul(gpu, wg, x, n, DType::BF16, DType::BF16), ref);
        check(e < 1e-2, strf("packed matmul %s N=%lld %s y:bf16", f.name, (long long)n, shape.c_str()),
              strf("rel %.2e", e));
        if (n <= 32 && !s.big) {
          e = rel_err(run_matmul(gpu, wg, x, n, DType::F32, DType::F32), ref);  // x converted to bf16 first
          check(e < tol32, strf("packed matmul %s N=%lld %s x:f32", f.name, (long long)n, shape.c_str()),
                strf("rel %.2e", e));
        }
        if (n > 8 && n <= 32) {
          for (int v : {1, 2}) {  // one or two row blocks per CTA (automatic: two, where the batched kernel does not take the shape)
            cuda::set_qgemv_tuning(v, v == 1);  // (and without / with the early dependent launch)
            e = rel_err(run_matmul(gpu, wg, x, n, DType::BF16, DType::F32), ref);
            cuda::set_qgemv_tuning(0, true);
            check(e < tol32, strf("packed matmul %s N=%lld %s %d row block(s)/CTA", f.name, (long long)n,
                                  shape.c_str(), v),
                  strf("rel %.2e", e));
          }
          // The row-split batched kernel with 2, 4 and 8 row blocks per CTA and the column split
          // (7: 8 row blocks, columns over 8 CTAs, a reduction kernel), where its chunks divide in.
          for (int v : {4, 5, 6, 7}) {
            cuda::set_qgemv_tuning(v, true);
            try {
              e = rel_err(run_matmul(gpu, wg, x, n, DType::BF16, DType::F32), ref);
            } catch (const std::exception& ex) {
              e = std::string(ex.what()).find("does not take this shape") != std::string::npos ? -1.0 : INFINITY;
            }
            cuda::set_qgemv_tuning(0, true);
            // 8 row blocks per CTA: one warp sums a whole row in one fp32 chain (int8: Σx·q with
            // q up to 255 against b·Σx, b = −128·s): 2.5e-5 at 16384 columns, H200.
            if (e >= 0)
              check(e < std::max(tol32, 5e-5), strf("packed matmul %s N=%lld %s batched, %d row blocks/CTA%s", f.name,
                                    (long long)n, shape.c_str(), v == 4 ? 2 : v == 5 ? 4 : 8,
                                    v == 7 ? ", columns split" : ""),
                    strf("rel %.2e", e));
          }
        }
        if (n <= 8 && !s.big) {
          for (int v = 1; v <= 21; ++v) {  // every fixed N ≤ 8 launch shape (tiles/stage, warps, CTAs/SM, late or shared-memory params, row blocks)
            cuda::set_qgemv_small_variant(v);
            e = rel_err(run_matmul(gpu, wg, x, n, DType::BF16, DType::F32), ref);
            cuda::set_qgemv_small_variant(0);
            check(e < tol32, strf("packed matmul %s N=%lld %s launch shape %d", f.name, (long long)n, shape.c_str(), v),
                  strf("rel %.2e", e));
          }
          for (int mode : {2, 3}) {  // 4 and 16 warps per CTA (automatic picks 8 or 4)
            gpu.set_gemv_mode(mode);
            e = rel_err(run_matmul(gpu, wg, x, n, DType::BF16, DType::F32), ref);
            gpu.set_gemv_mode(0);
            check(e < tol32, strf("packed matmul %s N=%lld %s %d warps", f.name, (long long)n, shape.c_str(),
                                  mode == 2 ? 4 : 16),
                  strf("rel %.2e", e));
          }
          gpu.set_use_gemv(false);  // small N through dequantization + cuBLAS
          cuda::set_qgemm_mode(0);
          e = rel_err(run_matmul(gpu, wg, x, n, DType::BF16, DType::F32), ref);
          cuda::set_qgemm_mode(1);
          gpu.set_use_gemv(true);
          check(e < 1e-2, strf("packed matmul(cuBLAS) %s N=%lld %s", f.name, (long long)n, shape.c_str()),
                strf("rel %.2e", e));
        }
      }
    }
}

// The parts' outputs of one matmul_group and of one matmul per part (outputs poisoned first).
struct GroupRun {
  std::vector<std::vector<float>> grouped, single;
};
GroupRun run_group(Backend& b, const std::vector<Weight>& ws, const std::vector<float>& x, int64_t n, DType xd,
                   DType yd) {
  const int64_t in = ws[0].in();
  auto xb = b.alloc(size_t(n * in) * dtype_size(xd));
  Mat xm = xb->mat(xd, n, in);
  b.upload(xm, x.data());
  std::vector<std::unique_ptr<Buffer>> keep;
  std::vector<Backend::MatmulPart> parts;
  for (const Weight& w : ws) {
    keep.push_back(b.alloc(size_t(n * w.out()) * dtype_size(yd)));
    parts.push_back({&w, keep.back()->mat(yd, n, w.out())});
    const std::vector<float> poison(size_t(n * w.out()), std::nanf(""));
    b.upload(parts.back().y, poison.data());
  }
  b.matmul_group(xm, parts);
  GroupRun r;
  for (const auto& p : parts) {
    r.grouped.emplace_back(size_t(p.y.rows * p.y.cols));
    b.download(p.y, r.grouped.back().data());
    b.matmul(xm, *p.w, p.y);
    r.single.emplace_back(r.grouped.back().size());
    b.download(p.y, r.single.back().data());
  }
  return r;
}

// matmul_group over packed parts (one grouped GEMV launch): bit for bit the per-part matmul where
// both run the same launch shape, and the CPU within the GEMV tolerance. The small set (240 rows)
// gets its parts' automatic shape; the large one (10240 rows) a larger matrix's (other warps per
// CTA for N ≤ 8: another fp32 summation order), so there only fixed warp counts must agree.
// The prompt GEMM that decodes codes in its load path (quant_gemm.cu) against the dequantize +
// cuBLAS path (the same bf16 weights: f32 outputs differ only in the order of the fp32 sums) and
// the CPU: its five kernels (staged, overlapped, skewed, pipelined, warp-specialized), token counts
// around its 256-token tile, row counts around its 128-row tile, per-row and grouped formats.
void test_qgemm(CpuBackend& cpu, CudaBackend& gpu) {
  if (!cuda::qgemm_available()) {
    check(false, "qgemm: sm_90a code", "this build or GPU has no wgmma kernel (CMAKE_CUDA_ARCHITECTURES=90a, Hopper)");
    return;
  }
  struct C {
    const char* name;
    WeightFormat f;
    int64_t out, in, group;
  };
  const C cases[] = {{"fp8", WeightFormat::FP8, 1000, 4096, 4096},   {"int8", WeightFormat::Q8, 4096, 4096, 4096},
                     {"q8 g64", WeightFormat::Q8, 200, 384, 64},       {"int4 g64", WeightFormat::Q4, 1000, 4096, 64},
                     {"int4 g128", WeightFormat::Q4, 129, 1024, 128},  {"fp8", WeightFormat::FP8, 136, 64, 64},
                     {"int4 g64", WeightFormat::Q4, 4096, 16384, 64},  {"int4 g64", WeightFormat::Q4, 16384, 128, 64},
                     {"fp8", WeightFormat::FP8, 4096, 16384, 16384}};  // 300 rows: the warp-specialized kernel
  for (const C& c : cases) {
    const PackedMatrix pm = random_packed(c.f, c.out, c.in, c.group, 77 + uint64_t(c.out));
    const Weight wc = cpu.load_quantized_weight(pm.view(), c.name), wg = gpu.load_quantized_weight(pm.view(), c.name);
    const cuda::QWeight qw = CudaBackend::qweight(wg);
    gpu.set_use_gemv(false);  // N = 40 too: matmul's ≤ 64-row GEMV would take it otherwise
    for (int64_t n : {40, 65, 256, 300, 1100}) {
      if (c.in == 16384 && n != 256 && n != 300) continue;
      // Where one token tile's row tiles would leave SMs idle, K is split over several CTAs.
      const int splits = cuda::qgemm_splits(qw, int(n));
      const std::string shape = strf("%s %lldx%lld%s", c.name, (long long)c.out, (long long)c.in,
                                     splits > 1 ? strf(" (K split x%d)", splits).c_str() : "");
      const auto x = randn(size_t(n * c.in), 91 + uint64_t(n));
      const auto ref = run_matmul(cpu, wc, x, n, DType::F32, DType::F32);
      cuda::set_qgemm_mode(0);  // dequantize + cuBLAS
      const auto deq = run_matmul(gpu, wg, x, n, DType::BF16, DType::F32);
      const auto deq16 = run_matmul(gpu, wg, x, n, DType::BF16, DType::BF16);
      for (int mode : {1, 2, 3, 4, 5, 6}) {  // 1: the automatic choice (qgemm_preferred, else dequantize)
        cuda::set_qgemm_mode(mode);
        // The split count depends on the kernel (CTAs per SM): the name says the one that ran.
        const int vsplits = cuda::qgemm_splits(qw, int(n));
        const auto y = run_matmul(gpu, wg, x, n, DType::BF16, DType::F32);
        const auto y16 = run_matmul(gpu, wg, x, n, DType::BF16, DType::BF16);
        const char* names[] = {"", "automatic", "staged", "overlapped", "skewed", "pipelined", "warp-specialized"};
        const std::string vname = vsplits == splits ? names[mode] : strf("%s (K split x%d)", names[mode], vsplits);
        const char* v = vname.c_str();
        double e = rel_err(y, deq);
        check(e < 2e-5, strf("qgemm %s N=%lld %s == dequant+cuBLAS (f32)", shape.c_str(), (long long)n, v),
              strf("rel %.2e", e));
        e = rel_err(y16, deq16);
        check(e < 4e-3, strf("qgemm %s N=%lld %s == dequant+cuBLAS (bf16)", shape.c_str(), (long long)n, v),
              strf("rel %.2e", e));
        e = rel_err(y, ref);
        check(e < 1e-2, strf("qgemm %s N=%lld %s vs CPU", shape.c_str(), (long long)n, v), strf("rel %.2e", e));
      }
      cuda::set_qgemm_mode(1);
    }
    gpu.set_use_gemv(true);
  }
  // A 4096-row matrix at one token tile splits K (32 row tiles alone would idle most SMs) and, so
  // filled, is the automatic choice; one of 16384 rows needs no split.
  const cuda::QWeight q4k{int(WeightFormat::FP8), nullptr, nullptr, 4096, 4096, 4096};
  const cuda::QWeight q16k{int(WeightFormat::FP8), nullptr, nullptr, 16384, 4096, 4096};
  check(cuda::qgemm_splits(q4k, 256) >= 4 && cuda::qgemm_split_floats(q4k, 256) > 0 &&
            cuda::qgemm_splits(q16k, 256) == 1 && cuda::qgemm_split_floats(q16k, 256) == 0 &&
            cuda::qgemm_preferred(q4k, 128) && !cuda::qgemm_preferred(q4k, 1100),
        "qgemm: K split where row tiles are few", strf("4096 rows: x%d", cuda::qgemm_splits(q4k, 256)));
  // 257–512 rows: the fused GEMM (warp-specialized) only for 8-bit weights of 64M-weight matrices.
  const cuda::QWeight q16k4{int(WeightFormat::Q4), nullptr, nullptr, 16384, 4096, 64};
  check(cuda::qgemm_preferred(q16k, 512) && !cuda::qgemm_preferred(q16k, 513) && !cuda::qgemm_preferred(q4k, 300) &&
            !cuda::qgemm_preferred(q16k4, 300) && cuda::qgemm_preferred(q16k4, 256),
        "qgemm: 257-512 rows for 8-bit 16384x4096 only", "");
  // Shapes it does not take say why (and matmul takes the dequantize path).
  const PackedMatrix odd = random_packed(WeightFormat::Q4, 64, 96, 32, 5);
  const Weight wo = gpu.load_quantized_weight(odd.view(), "int4 g32");
  const cuda::QWeight qo = CudaBackend::qweight(wo);
  const std::string why = cuda::qgemm_unfit(qo, wo.w.data, 96);
  check(why.find("multiple of 64") != std::string::npos, "qgemm: 96 columns, groups of 32 not taken", why);
}

void test_matmul_group(CpuBackend& cpu, CudaBackend& gpu) {
  const int64_t in = 256;
  std::vector<Weight> mixed;  // a small part of each format: a set that runs part by part
  for (const Fmt& f : {kFormats[0], kFormats[1], kFormats[2]})  // fp8, int8, int4 g64
    for (bool big : {false, true}) {
      const std::vector<int64_t> outs = big ? std::vector<int64_t>{4096, 1024, 1024, 4096}
                                            : std::vector<int64_t>{96, 32, 32, 80};
      std::vector<Weight> wc, wg;
      for (size_t i = 0; i < outs.size(); ++i) {
        PackedMatrix pm;
        if (big) {
          pm = random_packed(packed_format(f), outs[i], in, f.group ? f.group : in, 41 + i);
        } else {
          const auto w = randn(size_t(outs[i] * in), 41 + i, 1.0f / std::sqrt(float(in)));
          pm = pack_matrix(quantize_matrix(w.data(), outs[i], in, f.format, f.group, f.zero_points, f.bits));
        }
        wc.push_back(cpu.load_quantized_weight(pm.view(), f.name));
        wg.push_back(gpu.load_quantized_weight(pm.view(), f.name));
      }
      if (!big) mixed.push_back(wg[0]);
      const double tol32 = packed_format(f) == WeightFormat::Q4 ? 5e-5 : 2e-5;
      for (int64_t n : {1, 8, 16, 32}) {
        const auto x = randn(size_t(n * in), 5 + uint64_t(n));
        std::vector<std::vector<float>> ref;
        for (const Weight& w : wc) ref.push_back(run_matmul(cpu, w, x, n, DType::F32, DType::F32));
        double worst32 = 0, worst16 = 0;
        std::string differs;
        const std::pair<DType, DType> dts[] = {
            {DType::BF16, DType::F32}, {DType::BF16, DType::BF16}, {DType::F32, DType::F32}};  // x f32: converted
        for (const auto& [xd, yd] : dts)
          for (int mode : {0, 2, 3}) {  // automatic, 4 and 16 warps per CTA
            gpu.set_gemv_mode(mode);
            const GroupRun r = run_group(gpu, wg, x, n, xd, yd);
            gpu.set_gemv_mode(0);
            for (size_t i = 0; i < wg.size(); ++i) {
              double& worst = yd == DType::F32 ? worst32 : worst16;
              worst = std::max(worst, rel_err(r.grouped[i], ref[i]));
              if (r.grouped[i] != r.single[i] && (!big || mode != 0 || n > 8))
                differs += strf(" x:%s y:%s mode %d part %zu;", std::string(dtype_name(xd)).c_str(),
                                std::string(dtype_name(yd)).c_str(), mode, i);
            }
          }
        check(worst32 < tol32 && worst16 < 1e-2 && differs.empty(),
              strf("packed matmul_group %s N=%lld rows %s", f.name, (long long)n,
                   big ? "4096,1024,1024,4096" : "96,32,32,80"),
              strf("rel f32 %.2e bf16 %.2e; %s", worst32, worst16,
                   differs.empty() ? "equal to per-part matmul" : ("DIFFERS from per-part matmul:" + differs).c_str()));
      }
    }
  const GroupRun r = run_group(gpu, mixed, randn(size_t(8 * in), 77), 8, DType::BF16, DType::F32);
  check(r.grouped == r.single, "packed matmul_group fp8 + int8 + int4 (part by part)",
        r.grouped == r.single ? "equal to per-part matmul" : "DIFFERS from per-part matmul");
}

// The FP8 decode GEMV copying its CTA's whole code block into shared memory before the dependency
// wait (PA: 4096×4096 and smaller per-row fp8 matrices at N = 1): bit for bit the GEMV that
// streams two stages (set_qgemv_prefetch(false)), and close to the CPU; 4008 columns end in a
// partial tile.
void test_qgemv_prefetch(CpuBackend& cpu, CudaBackend& gpu) {
  struct Shape {
    int64_t out, in;
  };
  // 1028 (not a multiple of 8): x's staged row ends mid 16-byte piece, the codes come after it.
  for (const Shape& sh : {Shape{4096, 4096}, Shape{1040, 2048}, Shape{96, 4008}, Shape{2048, 1028}}) {
    const PackedMatrix pm = random_packed(WeightFormat::FP8, sh.out, sh.in, sh.in, 401 + uint64_t(sh.out));
    const Weight wc = cpu.load_quantized_weight(pm.view(), "fp8"), wg = gpu.load_quantized_weight(pm.view(), "fp8");
    const auto x = randn(size_t(sh.in), 402);
    const auto ref = run_matmul(cpu, wc, x, 1, DType::F32, DType::F32);
    cuda::set_qgemv_prefetch(true);
    const auto pa = run_matmul(gpu, wg, x, 1, DType::BF16, DType::F32);
    cuda::set_qgemv_prefetch(false);
    const auto streamed = run_matmul(gpu, wg, x, 1, DType::BF16, DType::F32);
    cuda::set_qgemv_prefetch(true);
    const double e = rel_err(pa, ref);
    check(pa == streamed && e < 2e-5,
          strf("fp8 GEMV, whole block prefetched, %lldx%lld", (long long)sh.out, (long long)sh.in),
          strf("rel %.2e; %s", e, pa == streamed ? "equal to the streamed GEMV" : "DIFFERS from the streamed GEMV"));
  }
}

// The one-row GEMV fed through a shared-memory ring (quant_gemv_ring.cu): where it applies (int4:
// columns a multiple of 2048, groups of 64..2048 dividing 2048; per-row fp8, int8, symmetric int8
// and int8 in groups of 32..1024 (the MLX 8-bit layout): columns a multiple of 1024), against the
// CPU and the register GEMV it replaces (set_qgemv_ring(0)); int4 with 0, 2 and all chunks requested before the dependency wait,
// every format with those chunks requested at once and paced 20000 cycles apart (bit for bit the default); rows
// that end mid row block (1000, 4100); grouped parts (units across parts) bit for bit the
// per-part launches; the fused gate/up + silu·mul bit for bit the unfused pair, every format.
void test_qgemv_ring(CpuBackend& cpu, CudaBackend& gpu) {
  struct Shape {
    int64_t out, in, group;
  };
  // One weight at N = 1: the ring taken (and not at N = 2; `sym`: symmetric int8 detected), within
  // tol32 of the CPU (f32 y) and of the register GEMV, 1e-2 (bf16 y), with each of `pres` chunks
  // before the dependency wait (−1: the format's default).
  auto ring_case = [&](const PackedMatrix& pm, const char* name, double tol32, std::initializer_list<int> pres,
                       bool sym, uint64_t seed) {
    const Weight wc = cpu.load_quantized_weight(pm.view(), name), wg = gpu.load_quantized_weight(pm.view(), name);
    cuda::QGemvSet set{};
    set.part[0] = {CudaBackend::qweight(wg), nullptr, 0};
    set.count = 1;
    const bool applies = cuda::qgemv_ring_applies(set, 1) && !cuda::qgemv_ring_applies(set, 2) && (!sym || set.part[0].w.sym);
    const auto x = randn(size_t(pm.cols), seed);
    const auto ref = run_matmul(cpu, wc, x, 1, DType::F32, DType::F32);
    double worst = 0, worst16 = 0;
    for (int pre : pres) {
      cuda::set_qgemv_ring(1, pre);
      worst = std::max(worst, rel_err(run_matmul(gpu, wg, x, 1, DType::BF16, DType::F32), ref));
      worst16 = std::max(worst16, rel_err(run_matmul(gpu, wg, x, 1, DType::BF16, DType::BF16), ref));
    }
    cuda::set_qgemv_ring(1, -1);  // the default
    const auto ring = run_matmul(gpu, wg, x, 1, DType::BF16, DType::F32);
    // The chunks before the wait requested at once and 10 µs apart: the same products bit for bit.
    cuda::set_qgemv_ring(1, -1, 0);
    const bool pace_same = run_matmul(gpu, wg, x, 1, DType::BF16, DType::F32) == ring;
    cuda::set_qgemv_ring(1, -1, 20000);
    const bool slow_pace_same = run_matmul(gpu, wg, x, 1, DType::BF16, DType::F32) == ring;
    cuda::set_qgemv_ring(0, -1);
    const auto reg = run_matmul(gpu, wg, x, 1, DType::BF16, DType::F32);
    cuda::set_qgemv_ring(1, -1);
    const double vs_reg = rel_err(ring, reg);
    const bool grouped = pm.group != pm.cols;
    check(applies && worst < tol32 && worst16 < 1e-2 && vs_reg < tol32 && pace_same && slow_pace_same,
          strf("%s ring GEMV %lldx%lld%s", name, (long long)pm.rows, (long long)pm.cols,
               grouped ? strf(" g%lld", (long long)pm.group).c_str() : ""),
          strf("%s; rel f32 %.2e bf16 %.2e; vs register GEMV %.2e; paced 0 / 20000 cycles %s", applies ? "ring taken" : "RING NOT TAKEN", worst,
               worst16, vs_reg, pace_same && slow_pace_same ? "equal" : "DIFFER"));
  };
  for (const Shape& sh : {Shape{1000, 2048, 64}, Shape{4096, 4096, 128}, Shape{24, 4096, 2048}, Shape{4100, 8192, 256},
                          Shape{300, 16384, 128}, Shape{4096, 16384, 64}})
    for (bool zp : {false, true})  // 8-byte and zero-packed parameters
      ring_case(random_packed(WeightFormat::Q4, sh.out, sh.in, sh.group, 501 + uint64_t(sh.out), zp),
                zp ? "int4 zero-packed" : "int4", 5e-5, {0, 2, 1000}, false, 502 + uint64_t(sh.in));
  // Per-row fp8, int8 (affine) and symmetric int8 (biases −128·scale: decoded as q − 128).
  for (const Shape& sh : {Shape{1000, 1024, 1024}, Shape{4096, 4096, 4096}, Shape{4100, 16384, 16384}})
    for (int kind = 0; kind < 3; ++kind) {
      PackedMatrix pm = random_packed(kind == 0 ? WeightFormat::FP8 : WeightFormat::Q8, sh.out, sh.in, sh.in,
                                      601 + uint64_t(sh.out) + uint64_t(kind));
      if (kind == 2)
        for (size_t i = 0; i < pm.biases.size(); ++i) pm.biases[i] = -128.f * pm.scales[i];
      ring_case(pm, kind == 0 ? "fp8" : kind == 1 ? "int8" : "int8 sym", 2e-5, {-1}, kind == 2, 602 + uint64_t(sh.in));
    }
  // int8 in groups (the MLX 8-bit layout): groups of 32 (one per tile) up to 1024 (one per chunk).
  for (const Shape& sh : {Shape{1000, 1024, 32}, Shape{4096, 4096, 64}, Shape{300, 16384, 64}, Shape{4100, 8192, 1024}})
    ring_case(random_packed(WeightFormat::Q8, sh.out, sh.in, sh.group, 701 + uint64_t(sh.out)), "int8", 2e-5, {-1}, false,
              702 + uint64_t(sh.in));
  {  // not taken: int4 with columns not a multiple of 2048 or groups of 32; int8 in groups of 48
    const PackedMatrix a = random_packed(WeightFormat::Q4, 64, 1024, 64, 511), b = random_packed(WeightFormat::Q4, 64, 4096, 32, 512),
                       c = random_packed(WeightFormat::Q8, 64, 3072, 48, 513);
    const Weight wa = gpu.load_quantized_weight(a.view(), "int4"), wb = gpu.load_quantized_weight(b.view(), "int4"),
                 wc8 = gpu.load_quantized_weight(c.view(), "int8 g48");
    cuda::QGemvSet sa{}, sb{}, sc{};
    sa.part[0] = {CudaBackend::qweight(wa), nullptr, 0}, sa.count = 1;
    sb.part[0] = {CudaBackend::qweight(wb), nullptr, 0}, sb.count = 1;
    sc.part[0] = {CudaBackend::qweight(wc8), nullptr, 0}, sc.count = 1;
    check(!cuda::qgemv_ring_applies(sa, 1) && !cuda::qgemv_ring_applies(sb, 1) && !cuda::qgemv_ring_applies(sc, 1),
          "ring GEMV not taken: int4 1024 columns, int4 group 32, int8 group 48", "register GEMV");
  }
  // Grouped parts (q/k/v/z-like; zero-packed, as `sala quantize` writes int4) and the MLP pair.
  const int64_t in = 4096;
  std::vector<Weight> wc, wg;
  const int64_t outs[] = {2048, 256, 264, 2048};
  for (size_t i = 0; i < 4; ++i) {
    const PackedMatrix pm = random_packed(WeightFormat::Q4, outs[i], in, 128, 521 + i, true);
    wc.push_back(cpu.load_quantized_weight(pm.view(), "int4"));
    wg.push_back(gpu.load_quantized_weight(pm.view(), "int4"));
  }
  const auto x = randn(size_t(in), 530);
  const GroupRun r = run_group(gpu, wg, x, 1, DType::BF16, DType::F32);
  double worst = 0;
  for (size_t i = 0; i < wc.size(); ++i) worst = std::max(worst, rel_err(r.grouped[i], run_matmul(cpu, wc[i], x, 1, DType::F32, DType::F32)));
  check(r.grouped == r.single && worst < 5e-5, "int4 ring GEMV grouped parts 2048,256,264,2048",
        strf("rel %.2e; %s", worst, r.grouped == r.single ? "equal to per-part matmul" : "DIFFERS from per-part matmul"));
  struct Pair {
    WeightFormat wf;
    int64_t group;
    const char* name;
    bool zp = false;
  };
  for (const Pair& pf : {Pair{WeightFormat::Q4, 128, "int4"}, Pair{WeightFormat::Q4, 128, "int4 zero-packed", true},
                         Pair{WeightFormat::FP8, in, "fp8"}, Pair{WeightFormat::Q8, in, "int8"},
                         Pair{WeightFormat::Q8, 64, "int8 g64"}})
  for (int64_t out : {int64_t(1000), int64_t(4608)}) {
    const WeightFormat wf = pf.wf;
    const int64_t group = pf.group;
    const char* name = pf.name;
    auto run = [&](Backend& b, const Weight& g0, const Weight& u0, DType dt, bool unfused) {
      auto xb = b.alloc(size_t(in) * dtype_size(dt) + 16), gb = b.alloc(size_t(out) * dtype_size(dt) + 16),
           ub = b.alloc(size_t(out) * dtype_size(dt) + 16), ab = b.alloc(size_t(out) * dtype_size(dt) + 16);
      Mat xm = xb->mat(dt, 1, in), g = gb->mat(dt, 1, out), u = ub->mat(dt, 1, out), act = ab->mat(dt, 1, out);
      b.upload(xm, x.data());
      std::vector<float> y(size_t(out), std::nanf(""));
      b.upload(act, y.data());
      if (unfused)
        b.Backend::matmul_silu_mul(xm, g0, u0, g, u, act);
      else
        b.matmul_silu_mul(xm, g0, u0, g, u, act);
      b.download(act, y.data());
      return y;
    };
    const PackedMatrix pg = random_packed(wf, out, in, group, 541, pf.zp), pu = random_packed(wf, out, in, group, 542, pf.zp);
    const Weight gc = cpu.load_quantized_weight(pg.view(), name), uc = cpu.load_quantized_weight(pu.view(), name);
    const Weight gg = gpu.load_quantized_weight(pg.view(), name), ug = gpu.load_quantized_weight(pu.view(), name);
    const auto ref = run(cpu, gc, uc, DType::F32, false);
    const auto fused = run(gpu, gg, ug, DType::BF16, false), unfused = run(gpu, gg, ug, DType::BF16, true);
    const double e = rel_err(fused, ref);
    check(e < 1e-2 && fused == unfused, strf("%s ring GEMV gate/up + silu*mul 2x%lld", name, (long long)out),
          strf("rel %.2e; %s", e, fused == unfused ? "equal to ring GEMV + silu_mul" : "DIFFERS from ring GEMV + silu_mul"));
  }
}

// Zero-packed int4 parameters (quant_layout.h) give the 8-byte form's products bit for bit on every
// path: the same matrix loaded both ways (cuda::set_zero_pack), N from the ring GEMV's 1 through
// the register GEMV, the batched kernel, the fused GEMM to the dequantize path, and --int8-prefill's
// requantization. A grouped launch whose parts mix the two forms (each part's form read at run
// time) against the CPU.
void test_zero_packed(CpuBackend& cpu, CudaBackend& gpu) {
  struct Shape {
    int64_t out, in, group;
  };
  for (const Shape& sh : {Shape{129, 768, 64}, Shape{4096, 4096, 128}, Shape{1000, 16384, 64}, Shape{4100, 8192, 256}}) {
    const PackedMatrix pm = random_packed(WeightFormat::Q4, sh.out, sh.in, sh.group, 801 + uint64_t(sh.out), true);
    const Weight packed = gpu.load_quantized_weight(pm.view(), "int4 zero-packed");
    cuda::set_zero_pack(false);
    const Weight wide = gpu.load_quantized_weight(pm.view(), "int4 8-byte");
    cuda::set_zero_pack(true);
    const std::string shape = strf("%lldx%lld g%lld", (long long)sh.out, (long long)sh.in, (long long)sh.group);
    check(packed.zero_packed && !wide.zero_packed && packed.nbytes() < wide.nbytes(),
          "zero-packed int4 " + shape + " takes fewer bytes",
          strf("%zu against %zu bytes", packed.nbytes(), wide.nbytes()));
    for (int64_t n : {1, 2, 8, 16, 32, 64, 256, 512}) {
      const auto x = randn(size_t(n * sh.in), 803 + uint64_t(n));
      const auto a = run_matmul(gpu, packed, x, n, DType::BF16, DType::F32);
      const auto b = run_matmul(gpu, wide, x, n, DType::BF16, DType::F32);
      check(a == b, strf("zero-packed int4 %s N=%lld equals the 8-byte form", shape.c_str(), (long long)n),
            a == b ? "bit for bit" : strf("DIFFERS: rel %.2e", rel_err(a, b)));
    }
    const auto x = randn(size_t(512 * sh.in), 809);  // --int8-prefill: the rows requantized from the codes
    gpu.set_int8_prefill(true);
    const auto a = run_matmul(gpu, packed, x, 512, DType::BF16, DType::F32);
    const auto b = run_matmul(gpu, wide, x, 512, DType::BF16, DType::F32);
    gpu.set_int8_prefill(false);
    check(a == b, strf("zero-packed int4 %s N=512 --int8-prefill equals the 8-byte form", shape.c_str()),
          a == b ? "bit for bit" : strf("DIFFERS: rel %.2e", rel_err(a, b)));
  }
  const int64_t in = 4096, outs[] = {2048, 256, 264};
  std::vector<Weight> wc, wg;
  for (size_t i = 0; i < 3; ++i) {
    const PackedMatrix pm = random_packed(WeightFormat::Q4, outs[i], in, 128, 811 + i, true);
    wc.push_back(cpu.load_quantized_weight(pm.view(), "int4"));
    cuda::set_zero_pack(i != 1);  // the middle part in the 8-byte form
    wg.push_back(gpu.load_quantized_weight(pm.view(), "int4"));
    cuda::set_zero_pack(true);
  }
  for (int64_t n : {1, 8, 32}) {
    const auto x = randn(size_t(n * in), 820 + uint64_t(n));
    const GroupRun r = run_group(gpu, wg, x, n, DType::BF16, DType::F32);
    double worst = 0;
    for (size_t i = 0; i < wc.size(); ++i)
      worst = std::max(worst, rel_err(r.grouped[i], run_matmul(cpu, wc[i], x, n, DType::F32, DType::F32)));
    check(!wg[1].zero_packed && wg[0].zero_packed && worst < 5e-5,
          strf("int4 grouped parts mixing zero-packed and 8-byte parameters N=%lld", (long long)n),
          strf("rel %.2e against the CPU", worst));
  }
}

// Symmetric int8 (every bias −128·scale, as `sala quantize --format int8` writes it) takes the
// GEMV's decode of q − 128 without the Σx term (quant_gemv.cu kQ8S); the same codes with biases
// half a step off (−127.5·scale) keep the general Q8 decode. Both against the CPU at N = 1 (x
// staged as f16), 3 and 8 (bf16 fragments), 16 and 32 (the batched kernel, columns split where
// rows are few), on the one- and two-row-block shapes (≤ / > 8192 rows) and 16384 columns.
void test_q8_symmetric(CpuBackend& cpu, CudaBackend& gpu) {
  struct Shape {
    int64_t out, in;
  };
  for (const Shape& sh : {Shape{4096, 4096}, Shape{8704, 4096}, Shape{1000, 16384}})
    for (bool sym : {true, false}) {
      PackedMatrix pm = random_packed(WeightFormat::Q8, sh.out, sh.in, sh.in, 501 + uint64_t(sh.out));
      if (!sym)
        for (size_t i = 0; i < pm.biases.size(); ++i) pm.biases[i] = -127.5f * pm.scales[i];
      const Weight wc = cpu.load_quantized_weight(pm.view(), "int8"), wg = gpu.load_quantized_weight(pm.view(), "int8");
      for (int64_t n : {1, 3, 8, 16, 32}) {
        const auto x = randn(size_t(n * sh.in), 502 + uint64_t(n));
        const double e = rel_err(run_matmul(gpu, wg, x, n, DType::BF16, DType::F32),
                                 run_matmul(cpu, wc, x, n, DType::F32, DType::F32));
        check(wg.q8_symmetric == sym && e < 2e-5,
              strf("int8 GEMV N=%lld, %s, %lldx%lld", (long long)n,
                   sym ? "symmetric (q - 128, no sum of x)" : "biases off by half a step", (long long)sh.out,
                   (long long)sh.in),
              strf("rel %.2e; detected %s", e, wg.q8_symmetric ? "symmetric" : "general"));
      }
    }
}

// matmul_silu_mul (the MLP's gate/up with silu·mul; CUDA: fused into the packed GEMV at ≤ 8 rows)
// against the CPU (bf16 tolerance) and against the same backend's unfused grouped GEMV + silu_mul
// (Backend::matmul_silu_mul): bit for bit where both take the same two-row-block launch shape —
// above 8192 rows in all for fp8, int8, int4 in groups of 64 or 32 and MLX 8-bit in groups of 32
// (the 9B MLP's case). 9 rows run unfused.
void test_matmul_silu_mul(CpuBackend& cpu, CudaBackend& gpu) {
  const int64_t in = 384;  // a multiple of every group below (MLX 48)
  for (const Fmt& f : {kFormats[0], kFormats[1], kFormats[2], kFormats[3], kFormats[5], kFormats[6]})
    for (int64_t out : {80, 4608}) {
      Weight wc[2], wg[2];
      for (int i = 0; i < 2; ++i) {
        const auto w = randn(size_t(out * in), 61 + uint64_t(i), 2.0f / std::sqrt(float(in)));
        const PackedMatrix pm = pack_matrix(quantize_matrix(w.data(), out, in, f.format, f.group, f.zero_points, f.bits));
        wc[i] = cpu.load_quantized_weight(pm.view(), f.name);
        wg[i] = gpu.load_quantized_weight(pm.view(), f.name);
      }
      const bool same_shape = out > 4096 && (f.format == QuantFormat::FP8 || f.format == QuantFormat::INT8 ||
                                             (f.format == QuantFormat::INT4 && (f.group == 64 || f.group == 32)) ||
                                             (f.format == QuantFormat::MLX && f.bits == 8 && f.group % 32 == 0));
      for (int64_t n : {1, 3, 8, 9}) {
        const auto x = randn(size_t(n * in), 91 + uint64_t(n));
        auto run = [&](Backend& b, const Weight (&w)[2], DType dt, bool unfused) {
          const size_t ybytes = size_t(n * out) * dtype_size(dt) + 16;
          auto xb = b.alloc(size_t(n * in) * dtype_size(dt) + 16), gb = b.alloc(ybytes), ub = b.alloc(ybytes),
               ab = b.alloc(ybytes);
          Mat xm = xb->mat(dt, n, in), g = gb->mat(dt, n, out), u = ub->mat(dt, n, out), act = ab->mat(dt, n, out);
          b.upload(xm, x.data());
          std::vector<float> y(size_t(n * out), std::nanf(""));
          b.upload(act, y.data());  // poison
          if (unfused)
            b.Backend::matmul_silu_mul(xm, w[0], w[1], g, u, act);
          else
            b.matmul_silu_mul(xm, w[0], w[1], g, u, act);
          b.download(act, y.data());
          return y;
        };
        const auto ref = run(cpu, wc, DType::F32, false);
        const auto fused = run(gpu, wg, DType::BF16, false), unfused = run(gpu, wg, DType::BF16, true);
        const double e = rel_err(fused, ref);
        const bool equal = fused == unfused;
        check(e < 1e-2 && (equal || !same_shape),
              strf("packed matmul_silu_mul %s N=%lld rows 2x%lld", f.name, (long long)n, (long long)out),
              strf("rel %.2e; %s", e,
                   equal ? "equal to grouped GEMV + silu_mul" : same_shape ? "DIFFERS from grouped GEMV + silu_mul"
                                                                   : "other launch shape than unfused"));
      }
    }
}

// --fp8-prefill: cuBLASLt's fp8 GEMM on activations quantized per row (w8a8_prefill.cu) against the
// CPU's W8A8 product (tested there against a scalar reference) on the same bf16 inputs; fewer rows
// and shapes the fp8 GEMM cannot take stay weight-only (the same bits as with the switch off).
void test_fp8_prefill(CpuBackend& cpu, CudaBackend& gpu) {
  struct Case {
    int64_t out, in, n;
    DType yd;
    bool fit;
  };
  const Case cases[] = {{400, 512, 65, DType::BF16, true},    {4096, 4096, 300, DType::BF16, true},
                        {1000, 1024, 129, DType::F32, true},   {4096, 16384, 96, DType::BF16, true},
                        {400, 512, 64, DType::BF16, false},    {96, 520, 80, DType::BF16, false},
                        {64, 16400, 80, DType::BF16, false}};  // rows longer than the activation quantizer's
  for (const Case& c : cases) {
    const PackedMatrix pm = random_packed(WeightFormat::FP8, c.out, c.in, c.in, 7 + uint64_t(c.in));
    const Weight wc = cpu.load_quantized_weight(pm.view(), "fp8"), wg = gpu.load_quantized_weight(pm.view(), "fp8");
    auto x = randn(size_t(c.n * c.in), 3 + uint64_t(c.n));
    for (int64_t k = 0; k < c.in; ++k) x[size_t(c.in + k)] = round_bf16(x[size_t(c.in + k)] * 1e-3f);  // ranges differ
    const std::string name = strf("fp8 prefill [%lld, %lld] N=%lld y %s", (long long)c.out, (long long)c.in,
                                  (long long)c.n, std::string(dtype_name(c.yd)).c_str());
    try {
      gpu.set_fp8_prefill(false);
      const auto off = run_matmul(gpu, wg, x, c.n, DType::BF16, c.yd);
      gpu.set_fp8_prefill(true);
      cpu.set_fp8_prefill(true);
      const auto got = run_matmul(gpu, wg, x, c.n, DType::BF16, c.yd);
      const auto ref = run_matmul(cpu, wc, x, c.n, DType::F32, DType::F32);
      cpu.set_fp8_prefill(false);
      gpu.set_fp8_prefill(false);
      if (!c.fit) {
        check(got == off, name, "stays weight-only (equal to the switch off)");
        continue;
      }
      // Top-1 per row and relative error: bf16 output rounding (~2e-3); f32 output: the fp8 tensor
      // cores' partial sums carry fewer than fp32's bits (cuBLASLt promotes them at intervals; H200:
      // 2.4e-4 at K = 1024, against ~1e-6 for an fp32 summation order).
      int64_t agree = 0;
      for (int64_t r = 0; r < c.n; ++r) {
        const auto row = [&](const std::vector<float>& v) { return v.begin() + r * c.out; };
        agree += std::max_element(row(got), row(got) + c.out) - row(got) ==
                 std::max_element(row(ref), row(ref) + c.out) - row(ref);
      }
      const double e = rel_err(got, ref), e_off = rel_err(got, off);
      check(e < (c.yd == DType::F32 ? 1e-3 : 6e-3) && agree >= c.n * 95 / 100 && e_off > 1e-3, name,
            strf("rel %.2e vs CPU W8A8, top-1 %lld/%lld, rel %.2e vs weight-only", e, (long long)agree, (long long)c.n,
                 e_off));
    } catch (const std::exception& ex) {
      cpu.set_fp8_prefill(false);
      gpu.set_fp8_prefill(false);
      check(false, name, ex.what());
    }
  }
}

// --int8-prefill against the CPU's W8A8 int8 product (tested there against a scalar reference): bit
// for bit, on the same bf16 inputs, for per-row int8 weights (symmetric and affine rows) and for
// int4 / grouped int8 weights requantized per row — through this backend's own GEMM (w8a8_gemm.cu;
// requantized rows in its tile layout) and, switched off, cuBLASLt's int8 GEMM with the int32
// epilogue pass (w8a8_prefill.cu); fewer rows and shapes neither can take stay weight-only (the
// same bits as the switch off).
void test_int8_prefill(CpuBackend& cpu, CudaBackend& gpu) {
  // Where the fused packed GEMMs run (sm_90a), this backend's int8 GEMM runs too: the comparisons
  // below then test it, not cuBLASLt twice.
  if (cuda::qgemm_available()) {
    alignas(16) static const int8_t probe[16] = {};
    const std::string why = cuda::w8a8_gemm_unfit(1024, probe, 300);
    check(why.empty(), "int8 prefill: this backend's int8 GEMM is available", why.empty() ? "yes" : why);
  }
  struct Case {
    WeightFormat f;
    int64_t out, in, n, group;
    DType yd;
    bool affine, fit;
  };
  const WeightFormat Q8 = WeightFormat::Q8, Q4 = WeightFormat::Q4;
  const Case cases[] = {{Q8, 400, 512, 65, 512, DType::BF16, false, true},   {Q8, 4096, 4096, 300, 4096, DType::BF16, true, true},
                        {Q8, 1000, 1024, 129, 1024, DType::F32, true, true}, {Q8, 4096, 16384, 96, 16384, DType::BF16, false, true},
                        {Q8, 1002, 1024, 70, 1024, DType::F32, false, true}, {Q8, 256, 512, 80, 64, DType::BF16, false, true},
                        {Q8, 2000, 4096, 1000, 4096, DType::BF16, true, true},  // four token tiles, a partial row tile
                        {Q8, 1004, 1024, 300, 1024, DType::BF16, false, true},  // bf16 rows not in 16-byte pieces
                        {Q4, 4096, 4096, 200, 64, DType::BF16, false, true}, {Q4, 1000, 1024, 90, 128, DType::F32, false, true},
                        {Q4, 520, 1024, 70, 32, DType::BF16, false, true},  // int4 g32: value by value, not the 64-column tables
                        // 4096 rows: blocks of 8192 weight rows (the int32 products' bound), the second from row 8192
                        {Q4, 8320, 128, 4096, 64, DType::BF16, false, true}, {Q4, 8320, 128, 4096, 32, DType::BF16, false, true},
                        {Q8, 400, 512, 64, 512, DType::BF16, false, false},  {Q4, 400, 512, 64, 64, DType::BF16, false, false},
                        {Q8, 96, 520, 80, 520, DType::BF16, false, false}, {Q8, 64, 16400, 80, 16400, DType::BF16, false, false}};
  for (const Case& c : cases) {
    PackedMatrix pm = random_packed(c.f, c.out, c.in, c.group, 11 + uint64_t(c.in));
    if (c.affine)
      for (size_t i = 0; i < pm.biases.size(); ++i) pm.biases[i] = -120.f * pm.scales[i] + 1e-3f * float(i % 7);
    const Weight wc = cpu.load_quantized_weight(pm.view(), "w"), wg = gpu.load_quantized_weight(pm.view(), "w");
    auto x = randn(size_t(c.n * c.in), 5 + uint64_t(c.n));
    for (int64_t k = 0; k < c.in; ++k) x[size_t(c.in + k)] *= 1e-3f;  // rows of different ranges
    for (int64_t k = 0; k < c.in; ++k) x[size_t(2 * c.in + k)] = 0.f;  // an all-zero row
    for (auto& v : x) v = round_bf16(v);  // the CPU sees the GPU's bf16 inputs
    const std::string name = strf("int8 prefill %s [%lld, %lld] group %lld N=%lld y %s%s", weight_format_name(c.f),
                                  (long long)c.out, (long long)c.in, (long long)c.group, (long long)c.n,
                                  std::string(dtype_name(c.yd)).c_str(), c.affine ? " affine" : "");
    try {
      gpu.set_int8_prefill(false);
      const auto off = run_matmul(gpu, wg, x, c.n, DType::BF16, c.yd);
      gpu.set_int8_prefill(true);
      cpu.set_int8_prefill(true);
      const auto got = run_matmul(gpu, wg, x, c.n, DType::BF16, c.yd);
      const auto ref = run_matmul(cpu, wc, x, c.n, DType::F32, DType::F32);
      cpu.set_int8_prefill(false);
      gpu.set_int8_prefill(false);
      if (!c.fit) {
        check(got == off, name, "stays weight-only (equal to the switch off)");
        continue;
      }
      int64_t differ = 0;
      for (size_t i = 0; i < ref.size(); ++i) differ += (c.yd == DType::BF16 ? round_bf16(ref[i]) : ref[i]) != got[i];
      const double e_off = rel_err(got, off);
      check(differ == 0 && e_off > 1e-4 && e_off < 0.05, name,
            strf("%lld of %zu values differ from the CPU's W8A8 int8; rel %.2e vs weight-only", (long long)differ,
                 ref.size(), e_off));
      {  // the same product through cuBLASLt and the epilogue pass
        cuda::set_w8a8_gemm(false);
        gpu.set_int8_prefill(true);
        const auto lt = run_matmul(gpu, wg, x, c.n, DType::BF16, c.yd);
        gpu.set_int8_prefill(false);
        cuda::set_w8a8_gemm(true);
        check(lt == got, name + " (cuBLASLt)", "equal to this backend's GEMM bit for bit");
      }
    } catch (const std::exception& ex) {
      cpu.set_int8_prefill(false);
      gpu.set_int8_prefill(false);
      cuda::set_w8a8_gemm(true);
      check(false, name, ex.what());
    }
  }
}

// W8A8 products that share their input (matmul_group: q/k/v/gate, MLP gate/up) quantize it once:
// each part bit for bit its own matmul with the option on, for every W8A8 format; a group with a
// part the option cannot take runs part by part (the same bits as its own matmuls).
void test_w8a8_group(CudaBackend& gpu) {
  struct Case {
    const char* name;
    WeightFormat f;
    int64_t group;
    bool fp8;
  };
  const Case cases[] = {{"fp8", WeightFormat::FP8, 1024, true},
                        {"int8", WeightFormat::Q8, 1024, false},
                        {"int4 g64", WeightFormat::Q4, 64, false},
                        {"int8 g128", WeightFormat::Q8, 128, false}};
  const int64_t in = 1024, n = 200;
  const auto x = randn(size_t(n * in), 2024);
  for (const Case& c : cases) {
    std::vector<Weight> ws;
    int seed = 0;
    for (int64_t out : {1024, 256, 512}) {
      const PackedMatrix pm = random_packed(c.f, out, in, c.group, 300 + uint64_t(seed++));
      ws.push_back(gpu.load_quantized_weight(pm.view(), c.name));
    }
    c.fp8 ? gpu.set_fp8_prefill(true) : gpu.set_int8_prefill(true);
    try {
      const GroupRun r = run_group(gpu, ws, x, n, DType::BF16, DType::BF16);
      c.fp8 ? gpu.set_fp8_prefill(false) : gpu.set_int8_prefill(false);
      const GroupRun off = run_group(gpu, ws, x, n, DType::BF16, DType::BF16);
      for (size_t i = 0; i < ws.size(); ++i) {
        const std::string name = strf("W8A8 group %s part %zu [%lld, %lld] N=%lld", c.name, i,
                                      (long long)ws[i].out(), (long long)in, (long long)n);
        check(r.grouped[i] == r.single[i] && rel_err(r.grouped[i], off.single[i]) > 1e-4, name,
              strf("grouped == own matmul: %s; rel %.2e vs weight-only", r.grouped[i] == r.single[i] ? "yes" : "no",
                   rel_err(r.grouped[i], off.single[i])));
      }
    } catch (const std::exception& ex) {
      check(false, strf("W8A8 group %s", c.name), ex.what());
    }
    gpu.set_fp8_prefill(false);
    gpu.set_int8_prefill(false);
  }
  // fp8 with a part of 100 outputs (rows of 200 bytes: cuBLASLt's fp8 output needs 16-byte rows):
  // that part stays weight-only and the group runs part by part.
  gpu.set_fp8_prefill(true);
  try {
    std::vector<Weight> ws;
    for (int64_t out : {256, 100})
      ws.push_back(gpu.load_quantized_weight(random_packed(WeightFormat::FP8, out, in, in, 900 + uint64_t(out)).view(), "fp8"));
    const GroupRun r = run_group(gpu, ws, x, n, DType::BF16, DType::BF16);
    check(r.grouped == r.single, "W8A8 group fp8 with an unfit part", "each part equals its own matmul");
  } catch (const std::exception& ex) {
    check(false, "W8A8 group fp8 with an unfit part", ex.what());
  }
  gpu.set_fp8_prefill(false);
}

void test_random_and_errors(CpuBackend& cpu, CudaBackend& gpu) {
  const int64_t out = 4096, in = 4096;
  const auto x = randn(size_t(8 * in), 3);
  for (WeightFormat f : {WeightFormat::FP8, WeightFormat::Q8, WeightFormat::Q4}) {
    const Weight w = gpu.random_quantized_weight(f, out, in, f == WeightFormat::Q4 ? 64 : in, 0.02f, 9);
    const auto y = run_matmul(gpu, w, x, 8, DType::BF16, DType::F32);
    double ss = 0;
    bool finite = true;
    for (float v : y) ss += double(v) * v, finite = finite && std::isfinite(v);
    const double sd = std::sqrt(ss / double(y.size())), expect = 0.02 * std::sqrt(double(in));
    const double bpp = double(w.nbytes()) / double(out * in);
    check(finite && sd > 0.6 * expect && sd < 1.5 * expect && bpp < (f == WeightFormat::Q4 ? 0.63 : 1.01),
          strf("random packed %s 4096x4096", weight_format_name(f)),
          strf("sd %.3f (expect ~%.3f), %.3f bytes/weight", sd, expect, bpp));
  }
  // Group sizes the GEMV cannot step through: a clear error at load, naming the tensor.
  std::vector<float> w(16 * 64, 0.5f);
  const QuantizedMatrix q = quantize_matrix(w.data(), 16, 64, QuantFormat::MLX, 8, false, 4);
  std::string msg = "(loaded)";
  try {
    gpu.load_quantized_weight(pack_matrix(q).view(), "model.layers.0.mlp.up_proj.weight");
  } catch (const Error& e) {
    msg = e.what();
  }
  check(msg.find("model.layers.0.mlp.up_proj.weight") != std::string::npos && msg.find("multiple of 16") != std::string::npos,
        "packed load: group 8 refused with the tensor's name", msg);
  (void)cpu;
}

// ---- whole models ----

fs::path tmp_dir() {
  const fs::path p = fs::temp_directory_path() / ("sala_cuda_quant_" + std::to_string(::getpid()));
  fs::create_directories(p);
  return p;
}

void write_dequantized(const fs::path& src, const fs::path& dst) {
  fs::create_directories(dst);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  const QuantConfig qc = parse_quant_config(cfg);
  cfg.erase("quantization");
  std::ofstream(dst / "config.json") << cfg.dump(2);
  const ModelConfig mc = ModelConfig::load(src);
  Checkpoint ck(src);
  SafetensorsWriter out;
  std::vector<std::vector<float>> keep;
  for (const TensorSpec& t : expected_tensors(mc)) {
    const std::string base = t.name.substr(0, t.name.size() - 7);
    const bool ours = ck.contains(t.name + "_scale"), mlx = ck.contains(base + ".scales");
    if (!ours && !mlx) {
      out.add(t.name, ck.get(t.name));
      continue;
    }
    keep.emplace_back(size_t(shape_numel(t.shape)));
    const TensorView* zero = ck.contains(t.name + "_zero") ? &ck.get(t.name + "_zero") : nullptr;
    const TensorView* bias = mlx ? &ck.get(base + ".biases") : nullptr;
    dequantize_views(qc.format, qc.group_size, qc.bits, t.shape[0], t.shape[1], ck.get(t.name),
                     ck.get(mlx ? base + ".scales" : t.name + "_scale"), zero, bias, keep.back().data());
    out.add(t.name, TensorView{keep.back().data(), DType::F32, t.shape});
  }
  out.write(dst / "model.safetensors");
}

std::vector<float> model_logits(Backend& b, const fs::path& dir, const std::vector<int32_t>& seq) {
  LoadedModel m = load_model(dir.string(), b, {.max_batch_tokens = 128, .max_logit_rows = 128});
  Engine e(*m.model, {.max_sequences = 1, .max_context = int64_t(seq.size())});
  // Prompt chunks of 128 and 112 (above the GEMV's 64 rows: dequantization + cuBLAS), then 60
  // decode steps (GEMV, CUDA graphs).
  return replay(e, {seq}, {int64_t(seq.size()) - 60, 128, true})[0];
}

double top1(const std::vector<float>& a, const std::vector<float>& b, int V) {
  int agree = 0, rows = int(a.size() / size_t(V));
  for (int r = 0; r < rows; ++r) {
    const float* x = a.data() + size_t(r) * V;
    const float* y = b.data() + size_t(r) * V;
    agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
  }
  return double(agree) / rows;
}

// A random f32 checkpoint of the tiny preset in tmp/f32 (what the model tests quantize).
ModelConfig write_tiny_f32(const fs::path& tmp, uint64_t seed) {
  const ModelConfig cfg = preset_config("tiny");
  RandomCheckpointOptions ro;
  ro.seed = seed;
  ro.dtype = DType::F32;
  write_random_checkpoint(tmp / "f32", cfg, ro);
  return cfg;
}

void test_models() {
  const fs::path tmp = tmp_dir();
  const ModelConfig cfg = write_tiny_f32(tmp, 12);
  std::vector<int32_t> seq(300);  // beyond dense_len: sparse layers decode in the InfLLM-v2 regime
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = int32_t(3 + (i * 97 + 5) % 500);
  const std::pair<const char*, QuantizeOptions> cases[] = {{"fp8", {QuantFormat::FP8, 0, false, 4}},
                                                           {"int8", {QuantFormat::INT8, 0, false, 4}},
                                                           {"int4", {QuantFormat::INT4, 64, true, 4}},
                                                           {"mlx4", {QuantFormat::MLX, 32, false, 4}}};
  for (const auto& [name, opt] : cases) {
    const fs::path q = tmp / name, d = tmp / (std::string(name) + "_deq");
    quantize_checkpoint(tmp / "f32", q, opt);
    write_dequantized(q, d);
    CpuBackend cpu(0);
    const auto ref = model_logits(cpu, q, seq);
    std::vector<float> packed, dense, eager;
    Backend::GraphStats gs;
    {
      CudaBackend gpu(0);
      packed = model_logits(gpu, q, seq);
      gs = gpu.graph_stats();
    }
    {
      CudaBackend gpu(0);
      dense = model_logits(gpu, d, seq);
    }
    {
      CudaBackend gpu(0);
      gpu.set_graphs(false);
      eager = model_logits(gpu, q, seq);
    }
    const int V = cfg.vocab_size;
    double e = rel_err(packed, ref);
    check(e < 5e-2 && top1(packed, ref, V) > 0.95, strf("tiny %s model: cuda packed vs cpu packed", name),
          strf("rel %.2e, top-1 %.3f", e, top1(packed, ref, V)));
    e = rel_err(packed, dense);
    check(e < 3e-2 && top1(packed, dense, V) > 0.95, strf("tiny %s model: cuda packed vs cuda dequantized", name),
          strf("rel %.2e, top-1 %.3f", e, top1(packed, dense, V)));
    check(packed == eager && gs.replays > 0, strf("tiny %s model: graphs == eager, bit for bit", name),
          strf("%lld replays", (long long)gs.replays));
  }
  fs::remove_all(tmp);
}

// 40 sequences decoding together: their 40-row products take the fused GEMM where it fits (forced
// onto the tiny model's small matrices with mode 5; the 9B shape takes it by default), inside CUDA
// graphs. Graphs on == off bit for bit, and close to the CPU.
void test_batched_fused() {
  const fs::path tmp = tmp_dir();
  const ModelConfig cfg = write_tiny_f32(tmp, 13);
  for (const auto& [name, opt] : {std::pair<const char*, QuantizeOptions>{"fp8", {QuantFormat::FP8, 0, false, 4}},
                                  std::pair<const char*, QuantizeOptions>{"int4", {QuantFormat::INT4, 64, true, 4}}}) {
    const fs::path q = tmp / name;
    quantize_checkpoint(tmp / "f32", q, opt);
    std::vector<std::vector<int32_t>> seqs(40, std::vector<int32_t>(24));
    for (size_t s = 0; s < seqs.size(); ++s)
      for (size_t i = 0; i < seqs[s].size(); ++i) seqs[s][i] = int32_t(3 + (s * 131 + i * 97 + 5) % 500);
    auto run = [&](Backend& b) {
      LoadedModel m = load_model(q.string(), b, {.max_batch_tokens = 512, .max_logit_rows = 512});
      Engine e(*m.model, {.max_sequences = int(seqs.size()), .max_context = 64});
      auto per_seq = replay(e, seqs, {8, 8, true});  // one 320-row prompt step, then 16 steps of 40 rows
      std::vector<float> all;
      for (const auto& v : per_seq) all.insert(all.end(), v.begin(), v.end());
      return all;
    };
    CpuBackend cpu(0);
    const auto ref = run(cpu);
    cuda::set_qgemm_mode(5);
    std::vector<float> graphed, eager;
    Backend::GraphStats gs;
    {
      CudaBackend gpu(0);
      graphed = run(gpu);
      gs = gpu.graph_stats();
    }
    {
      CudaBackend gpu(0);
      gpu.set_graphs(false);
      eager = run(gpu);
    }
    cuda::set_qgemm_mode(1);
    check(graphed == eager && gs.replays > 0, strf("tiny %s, 40 sequences, fused GEMM: graphs == eager", name),
          strf("%lld replays", (long long)gs.replays));
    const double e = rel_err(graphed, ref);
    const double t = top1(graphed, ref, cfg.vocab_size);
    check(e < 5e-2 && t > 0.95, strf("tiny %s, 40 sequences, fused GEMM: cuda vs cpu", name),
          strf("rel %.2e, top-1 %.3f", e, t));
  }
  fs::remove_all(tmp);
}

}  // namespace

// One line in cuda_parity.cpp's main calls this; results go into its pass/fail counters.
void test_quant_parity(int& pass, int& fail) {
  g_pass = &pass;
  g_fail = &fail;
  try {
    CpuBackend cpu(0);
    CudaBackend gpu(0);
    test_matmuls(cpu, gpu);
    test_qgemm(cpu, gpu);
    test_matmul_group(cpu, gpu);
    test_qgemv_prefetch(cpu, gpu);
    test_qgemv_ring(cpu, gpu);
    test_q8_symmetric(cpu, gpu);
    test_zero_packed(cpu, gpu);
    test_matmul_silu_mul(cpu, gpu);
    test_fp8_prefill(cpu, gpu);
    test_int8_prefill(cpu, gpu);
    test_w8a8_group(gpu);
    test_random_and_errors(cpu, gpu);
    test_models();
    test_batched_fused();
  } catch (const std::exception& e) {
    check(false, "packed weights: exception", e.what());
  }
}
