// sala_cuda_tests --bench [--json FILE]: speed-of-light measurements of the CUDA backend's ops.
// Each line: what, time (median of 5 batches of repeats, CUDA events), achieved GB/s or TFLOP/s,
// and the fraction of the measured ceiling (device-to-device copy bandwidth; cuBLAS's own large
// bf16 GEMM rate for matrix work). Weights rotate through enough copies to defeat the 50 MB L2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/quant_gemv_ring.h"
#include "core/dtype.h"

using namespace sala;

namespace sala::cuda {
void set_qgemv_tuning(int nt_variant, bool trigger);  // quant_gemv.cu (tests and benchmarks)
void set_qgemv_small_variant(int v);
void run_sync_latency_bench();  // sync_latency.cu
void run_stream_floor_bench();  // stream_floor.cu
void launch_read_tiles(const void* buf, int64_t bytes, int ctas, int stages, uint32_t* sink, cudaStream_t st);  // read_rate.cu
}

namespace {

struct Result {
  std::string name;
  double us;
  double gbs;     // achieved bytes/s (1e9), 0 if not meaningful
  double tflops;  // achieved FLOP/s (1e12), 0 if not meaningful
  double frac;    // fraction of the relevant ceiling
};

// GB/s of `bytes` moved in `us` microseconds.
double rate(int64_t bytes, double us) { return double(bytes) / (us * 1e-6) / 1e9; }

// Median over 5 batches of `reps` calls, microseconds per call.
double time_us(CudaBackend& be, int reps, const std::function<void(int)>& fn) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 2; ++i) fn(i);  // warm-up
  be.synchronize();
  std::vector<double> t;
  for (int batch = 0; batch < 5; ++batch) {
    cudaEventRecord(a, be.stream());
    for (int i = 0; i < reps; ++i) fn(i);
    cudaEventRecord(b, be.stream());
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(double(ms) * 1000.0 / reps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[2];
}

std::vector<float> host_rand(size_t n, float std, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& f : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    f = std * (float((x >> 11) & 0xFFFFFF) / 16777216.0f * 2.f - 1.f) * 1.7f;
  }
  return v;
}

}  // namespace

// One sparse layer of the 9B geometry (InfLLM-v2 block 64, kernel 32 / stride 16, top-64 + 32 local).
CacheSpec sparse_9b_spec(int max_pages, int max_slots) {
  CacheSpec spec;
  spec.sparse_layers = 1;
  spec.kv_heads = 2, spec.head_dim = 128, spec.q_heads = 32;
  spec.block_size = 64, spec.kernel_size = 32, spec.kernel_stride = 16;
  spec.init_blocks = 1, spec.local_blocks = 32, spec.topk = 64;
  spec.max_pages = max_pages;
  spec.max_slots = max_slots;
  spec.attn_scale = 1.0f / std::sqrt(128.f);
  return spec;
}

int run_bench(int argc, char** argv) {
  std::string json;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0) json = argv[i + 1];
  CudaBackend be(0);
  std::vector<Result> res;
  auto add = [&](Result r) {
    std::printf("%-52s %10.2f us %9.1f GB/s %8.2f TFLOP/s  %5.1f%%\n", r.name.c_str(), r.us, r.gbs, r.tflops,
                100.0 * r.frac);
    std::fflush(stdout);
    res.push_back(r);
  };
  std::printf("device: %s, %d SMs\n", be.device_name().c_str(), be.props().multiProcessorCount);

  // Ceiling 1: device-to-device copy (bytes read + written).
  double bw = 0;
  {
    const size_t bytes = size_t(1) << 30;
    auto src = be.alloc(bytes), dst = be.alloc(bytes);
    cudaMemsetAsync(src->data(), 1, bytes, be.stream());
    const double us = time_us(be, 5, [&](int) {
      cudaMemcpyAsync(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice, be.stream());
    });
    bw = 2.0 * double(bytes) / (us * 1e-6) / 1e9;
    add({"memcpy D2D 1 GiB (read+write)", us, bw, 0, 1.0});
  }

  // Ceiling 2 + prefill products: cuBLAS bf16 GEMM.
  double gemm_peak = 0;
  {
    struct S {
      int64_t n, out, in;
    };
    for (S s : {S{4096, 4096, 4096}, S{512, 4096, 4096}, S{512, 16384, 4096}, S{512, 4096, 16384}, S{64, 4096, 4096},
                S{16, 4096, 4096}}) {
      Weight w = be.random_weight(s.out, s.in, 0.f, 0.02f, 7);
      auto xb = be.alloc(size_t(s.n * s.in) * 2), yb = be.alloc(size_t(s.n * s.out) * 2);
      Mat x = xb->mat(DType::BF16, s.n, s.in), y = yb->mat(DType::BF16, s.n, s.out);
      auto xh = host_rand(size_t(s.n * s.in), 1.f, 3);
      be.upload(x, xh.data());
      const double us = time_us(be, 10, [&](int) { be.matmul(x, w, y); });
      const double tf = 2.0 * s.n * s.out * s.in / (us * 1e-6) / 1e12;
      if (s.n == 4096) gemm_peak = tf;
      const double gb = double(s.out * s.in * 2 + s.n * (s.in + s.out) * 2) / (us * 1e-6) / 1e9;
      add({"cuBLAS gemm N=" + std::to_string(s.n) + " " + std::to_string(s.out) + "x" + std::to_string(s.in), us, gb,
           tf, gemm_peak > 0 ? tf / gemm_peak : 1.0});
    }
  }

  // SALA_BENCH_ONLY=long-decode[-1m] runs only the ceilings and the long-context sparse decode (profiling).
  const char* only_env = std::getenv("SALA_BENCH_ONLY");
  const bool all_sections = !only_env || !*only_env;

  // The cost of one dependent step with no work in it (sync_latency.cu); SALA_BENCH_ONLY=sync-latency
  // runs only this.
  const bool sync_only = !all_sections && std::strcmp(only_env, "sync-latency") == 0;
  if (all_sections || sync_only) sala::cuda::run_sync_latency_bench();
  if (sync_only) return 0;

  // SALA_BENCH_ONLY=stream-floor: one token's weight bytes streamed with the step's dependencies,
  // per product launch or in one persistent grid (stream_floor.cu).
  if (!all_sections && std::strcmp(only_env, "stream-floor") == 0) {
    sala::cuda::run_stream_floor_bench();
    return 0;
  }

  // SALA_BENCH_ONLY=read-rate: the decode products' bytes streamed by loads alone, by schedule
  // (read_rate.cu), beside the products themselves on the same bytes (fp8 and bf16), rotating over
  // copies that L2 cannot hold. One wave = 4 CTAs of 8 warps per SM.
  if (!all_sections && std::strcmp(only_env, "read-rate") == 0) {
    const int sms = be.props().multiProcessorCount;
    auto sink = be.alloc(64);
    for (int64_t mib : {128, 64, 16}) {
      const int64_t bytes = mib << 20;
      const int copies = int(std::max<int64_t>(2, 512 / mib));
      std::vector<std::unique_ptr<Buffer>> bufs;
      for (int c = 0; c < copies; ++c) {
        bufs.push_back(be.alloc(size_t(bytes)));
        cudaMemsetAsync(bufs.back()->data(), c + 1, size_t(bytes), be.stream());
      }
      struct S {
        const char* name;
        int ctas, stages;
      };
      const int64_t tiles = bytes / 1024;
      for (S s : {S{"128 KB per CTA", int(tiles / 128), 2}, S{"128 KB per CTA", int(tiles / 128), 4},
                  S{"32 KB per CTA", int(tiles / 32), 2}, S{"one wave, equal shares", 4 * sms, 2},
                  S{"one wave, equal shares", 4 * sms, 4}, S{"half a wave, equal shares", 2 * sms, 4}}) {
        const double us = time_us(be, 20, [&](int i) {
          sala::cuda::launch_read_tiles(bufs[size_t(i % copies)]->data(), bytes, s.ctas, s.stages,
                                        static_cast<uint32_t*>(sink->data()), be.stream());
        });
        std::printf("read %4lld MiB, %-26s %5d CTAs, %d stages: %8.2f us %7.1f GB/s\n", (long long)mib, s.name,
                    s.ctas, s.stages, us, rate(bytes, us));
      }
    }
    // The products (N = 1) on the same bytes: fp8 gate/up + silu·mul (2 × 16384×4096), fp8 and bf16
    // 16384×4096 (q/k/v/z) and 4096×16384 (down), bf16 gate/up as one 32768×4096.
    auto xb = be.alloc(16384 * 2);
    auto xh = host_rand(16384, 1.f, 5);
    struct P {
      const char* name;
      bool fp8, act;
      int64_t out, in;
    };
    for (P p : {P{"fp8 gate/up + silu*mul", true, true, 16384, 4096}, P{"fp8 32768x4096", true, false, 32768, 4096},
                P{"fp8 16384x4096", true, false, 16384, 4096}, P{"fp8 4096x16384", true, false, 4096, 16384},
                P{"bf16 32768x4096", false, false, 32768, 4096}, P{"bf16 16384x4096", false, false, 16384, 4096},
                P{"bf16 4096x16384", false, false, 4096, 16384}}) {
      const int parts = p.act ? 2 : 1;
      const int64_t wbytes = p.out * p.in * (p.fp8 ? 1 : 2) * parts;
      const int copies = int(std::max<int64_t>(2, (int64_t(512) << 20) / wbytes));
      std::vector<Weight> ws;
      for (int c = 0; c < copies * parts; ++c)
        ws.push_back(p.fp8 ? be.random_quantized_weight(WeightFormat::FP8, p.out, p.in, p.in, 0.02f, 11 + c)
                           : be.random_weight(p.out, p.in, 0.f, 0.02f, 11 + c));
      Mat x = xb->mat(DType::BF16, 1, p.in);
      be.upload(x, xh.data());
      auto gb = be.alloc(size_t(p.out) * 2), ub = be.alloc(size_t(p.out) * 2), ab = be.alloc(size_t(p.out) * 2);
      Mat g = gb->mat(DType::BF16, 1, p.out), u = ub->mat(DType::BF16, 1, p.out), a = ab->mat(DType::BF16, 1, p.out);
      const double us = time_us(be, 20, [&](int i) {
        const size_t k = size_t(i % copies) * size_t(parts);
        if (p.act) be.matmul_silu_mul(x, ws[k], ws[k + 1], g, u, a);
        else be.matmul(x, ws[k], g);
      });
      std::printf("product %-26s %8.2f us %7.1f GB/s (%lld MiB)\n", p.name, us, rate(wbytes, us),
                  (long long)(wbytes >> 20));
    }
    return 0;
  }

  // SALA_BENCH_ONLY=ring: the int4 g128 and fp8 decode products of the 9B step alone (N = 1), on the
  // register GEMV, the bulk-copy ring GEMV, and the ring's loads without the decode; rotating over
  // copies that L2 cannot hold.
  if (!all_sections && std::strcmp(only_env, "ring") == 0) {
    auto xb = be.alloc(16384 * 2);
    auto xh = host_rand(16384, 1.f, 5);
    struct P {
      const char* name;
      bool act;
      int64_t out, in;
      WeightFormat f = WeightFormat::Q4;
    };
    // The last two: one copy, read from L2 after the first call — what the decode costs when the
    // bytes are there.
    for (P p : {P{"gate/up + silu*mul 2x16384x4096", true, 16384, 4096}, P{"16384x4096 (q/k/v/z)", false, 16384, 4096},
                P{"4096x16384 (down)", false, 4096, 16384}, P{"4096x4096 (o_proj)", false, 4096, 4096},
                P{"8704x4096 (sparse q/k/v/g)", false, 8704, 4096}, P{"73448x4096 (lm_head)", false, 73448, 4096},
                P{"4096x4096 from L2", false, 4096, 4096}, P{"8704x4096 from L2", false, 8704, 4096},
                P{"fp8 gate/up + silu*mul 2x16384x4096", true, 16384, 4096, WeightFormat::FP8},
                P{"fp8 16384x4096", false, 16384, 4096, WeightFormat::FP8},
                P{"fp8 4096x16384", false, 4096, 16384, WeightFormat::FP8},
                P{"fp8 4096x4096", false, 4096, 4096, WeightFormat::FP8}}) {
      const int parts = p.act ? 2 : 1;
      const bool q4 = p.f == WeightFormat::Q4;  // int4 g128: 0.5 B codes + f16 scale and bias per 128 columns
      const int64_t wbytes = (q4 ? p.out * p.in * 17 / 32 : p.out * p.in) * parts;
      const bool from_l2 = std::strstr(p.name, "L2") != nullptr;
      const int copies = from_l2 ? 1 : int(std::max<int64_t>(2, (int64_t(512) << 20) / wbytes));
      std::vector<Weight> ws;
      for (int c = 0; c < copies * parts; ++c)
        ws.push_back(be.random_quantized_weight(p.f, p.out, p.in, q4 ? 128 : p.in, 0.02f, 11 + c));
      Mat x = xb->mat(DType::BF16, 1, p.in);
      be.upload(x, xh.data());
      auto gb = be.alloc(size_t(p.out) * 2), ub = be.alloc(size_t(p.out) * 2), ab = be.alloc(size_t(p.out) * 2);
      Mat g = gb->mat(DType::BF16, 1, p.out), u = ub->mat(DType::BF16, 1, p.out), a = ab->mat(DType::BF16, 1, p.out);
      for (int mode : {0, 1, 2}) {
        sala::cuda::set_qgemv_ring(mode, -1);
        const double us = time_us(be, 20, [&](int i) {
          const size_t k = size_t(i % copies) * size_t(parts);
          if (p.act) be.matmul_silu_mul(x, ws[k], ws[k + 1], g, u, a);
          else be.matmul(x, ws[k], g);
        });
        std::printf("%s %-36s %-22s %8.2f us %7.1f GB/s\n", q4 ? "int4 g128" : "per row  ", p.name,
                    mode == 0 ? "register GEMV" : mode == 1 ? "ring GEMV" : "ring, loads only", us, rate(wbytes, us));
      }
      sala::cuda::set_qgemv_ring(1, -1);
    }
    return 0;
  }

  // SALA_BENCH_ONLY=gemv-profile: three untimed calls of each decode product of interest (bf16
  // 4096x4096 and 16384x4096, packed fp8/int8/int4 16384x4096, N = 1), for a profiler.
  if (!all_sections && std::strcmp(only_env, "gemv-profile") == 0) {
    struct P {
      WeightFormat f;
      int64_t out, in, group;
    };
    for (P p : {P{WeightFormat::Dense, 4096, 4096, 0}, P{WeightFormat::Dense, 16384, 4096, 0},
                P{WeightFormat::FP8, 16384, 4096, 4096}, P{WeightFormat::Q8, 16384, 4096, 4096},
                P{WeightFormat::Q4, 16384, 4096, 64}}) {
      Weight w = p.f == WeightFormat::Dense ? be.random_weight(p.out, p.in, 0.f, 0.02f, 7)
                                           : be.random_quantized_weight(p.f, p.out, p.in, p.group, 0.02f, 11);
      auto xb = be.alloc(size_t(p.in) * 2), yb = be.alloc(size_t(p.out) * 2);
      Mat x = xb->mat(DType::BF16, 1, p.in), y = yb->mat(DType::BF16, 1, p.out);
      auto xh = host_rand(size_t(p.in), 1.f, 5);
      be.upload(x, xh.data());
      for (int i = 0; i < 3; ++i) be.matmul(x, w, y);
      be.synchronize();
    }
    return 0;
  }

  // SALA_BENCH_ONLY=qgemv-sweep: the packed decode GEMV's launch shapes (N = 1, 8) per format and
  // shape, to choose the automatic one (quant_gemv.cu, qgemv_f).
  if (!all_sections && std::strcmp(only_env, "qgemv-sweep") == 0) {
    struct F {
      const char* name;
      WeightFormat f;
      int64_t group;
    };
    for (F f : {F{"fp8", WeightFormat::FP8, 0}, F{"int8", WeightFormat::Q8, 0}, F{"int4", WeightFormat::Q4, 64}})
      for (auto [out, in] : {std::pair<int64_t, int64_t>{4096, 4096}, {16384, 4096}, {4096, 16384}, {73448, 4096}}) {
        const int64_t group = f.group ? f.group : in;
        std::vector<Weight> ws{be.random_quantized_weight(f.f, out, in, group, 0.02f, 11)};
        const size_t wbytes = ws[0].nbytes();
        const int copies = int(std::max<size_t>(1, (size_t(256) << 20) / wbytes));
        for (int c = 1; c < copies; ++c) ws.push_back(be.random_quantized_weight(f.f, out, in, group, 0.02f, 11 + c));
        for (int n : {1, 8}) {
          auto xb = be.alloc(size_t(n * in) * 2), yb = be.alloc(size_t(n * out) * 2);
          Mat x = xb->mat(DType::BF16, n, in), y = yb->mat(DType::BF16, n, out);
          auto xh = host_rand(size_t(n * in), 1.f, 5);
          be.upload(x, xh.data());
          std::string line = std::string("qgemv sweep ") + f.name + " " + std::to_string(out) + "x" + std::to_string(in) +
                             " N=" + std::to_string(n) + ":";
          for (int v = 0; v <= 21; ++v) {
            if (v >= 9 && v <= 16 && f.f != WeightFormat::Q4) continue;  // late / shared-memory parameters: grouped formats
            sala::cuda::set_qgemv_small_variant(v);
            char buf[64];
            try {
              const double us = time_us(be, 30, [&](int i) { be.matmul(x, ws[size_t(i % copies)], y); });
              std::snprintf(buf, sizeof buf, " v%d %.2f", v, us);
            } catch (const std::exception& e) {  // a shape the device refuses: say so, go on
              std::fprintf(stderr, "qgemv sweep v%d: %s\n", v, e.what());
              std::snprintf(buf, sizeof buf, " v%d error", v);
            }
            line += buf;
          }
          sala::cuda::set_qgemv_small_variant(0);
          std::printf("%s us (%zu MiB)\n", line.c_str(), wbytes >> 20);
        }
      }
    return 0;
  }

  // SALA_BENCH_ONLY=qgemm: packed prompt products (TFLOP/s of 2·N·out·in) — the GEMM that decodes
  // the codes in its load path (its five kernels, quant_gemm.cu) against the dequantize +
  // cuBLAS path and cuBLAS on the bf16 weight. SALA_BENCH_QGEMM="ROWS FORMAT N" (e.g. "16384 fp8
  // 2048") runs one case only, for a profiler.
  if (!all_sections && std::strcmp(only_env, "qgemm") == 0) {
    struct F {
      const char* name;
      WeightFormat f;
      int64_t group;
    };
    long one_rows = 0, one_n = 0;
    char one_fmt[16] = "";
    if (const char* e = std::getenv("SALA_BENCH_QGEMM"))
      if (std::sscanf(e, "%ld %15s %ld", &one_rows, one_fmt, &one_n) != 3)
        throw std::runtime_error("SALA_BENCH_QGEMM: expected \"ROWS FORMAT N\", got \"" + std::string(e) + "\"");
    for (auto [out, in] : {std::pair<int64_t, int64_t>{4096, 4096}, {16384, 4096}, {4096, 16384}}) {
      if (one_rows && out != one_rows) continue;
      const Weight wb = be.random_weight(out, in, 0.f, 0.02f, 11);
      for (F f : {F{"fp8", WeightFormat::FP8, 0}, F{"int8", WeightFormat::Q8, 0}, F{"int4", WeightFormat::Q4, 64}}) {
        if (one_rows && std::strcmp(f.name, one_fmt) != 0) continue;
        const Weight wq = be.random_quantized_weight(f.f, out, in, f.group ? f.group : in, 0.02f, 11);
        for (int n : {32, 64, 128, 256, 512, 2048}) {
          if (one_rows && n != one_n) continue;
          auto xb = be.alloc(size_t(n * in) * 2), yb = be.alloc(size_t(n * out) * 2);
          Mat x = xb->mat(DType::BF16, n, in), y = yb->mat(DType::BF16, n, out);
          auto xh = host_rand(size_t(n * in), 1.f, 5);
          be.upload(x, xh.data());
          const double flop = 2.0 * n * out * in;
          auto tf = [&](double us) { return flop / (us * 1e-6) / 1e12; };
          const int splits = sala::cuda::qgemm_splits(CudaBackend::qweight(wq), n);
          std::string line = std::string("qgemm ") + f.name + " " + std::to_string(out) + "x" + std::to_string(in) +
                             " N=" + std::to_string(n) + (splits > 1 ? " (K split x" + std::to_string(splits) + ")" : "") +
                             ":";
          char buf[96];
          const double bf = time_us(be, 10, [&](int) { be.matmul(x, wb, y); });
          std::snprintf(buf, sizeof buf, " bf16 cuBLAS %.1f us (%.0f TF/s)", bf, tf(bf));
          line += buf;
          if (n <= 64) {  // what matmul runs at these rows (the packed GEMV up to 32; 33–64: see cuda_quant.cpp)
            const double us = time_us(be, 10, [&](int) { be.matmul(x, wq, y); });
            std::snprintf(buf, sizeof buf, ", matmul %s %.1f (%.0f)", n <= 32 ? "GEMV" : "automatic", us, tf(us));
            line += buf;
          }
          const char* names[] = {"dequant+cuBLAS", "",          "staged",          "overlapped",
                                 "skewed",         "pipelined", "warp-specialized"};
          be.set_use_gemv(false);  // these paths at any N (matmul takes ≤ 64 rows on the GEMV)
          for (int mode : {0, 2, 3, 4, 5, 6}) {
            sala::cuda::set_qgemm_mode(mode);
            const double us = time_us(be, 10, [&](int) { be.matmul(x, wq, y); });
            std::snprintf(buf, sizeof buf, ", %s %.1f (%.0f)", names[mode], us, tf(us));
            line += buf;
          }
          be.set_use_gemv(true);
          sala::cuda::set_qgemm_mode(1);
          std::printf("%s\n", line.c_str());
        }
      }
    }
    return 0;
  }

  // SALA_BENCH_ONLY=qgemv-batch: packed products of 16 and 32 rows (batched decode) per format
  // and shape — the kernels for N > 8 (auto; old: the GEMV with 1/2 row blocks per CTA; rb2/4/8:
  // the row-split kernel's row blocks per CTA; split8: it with the columns split 8 ways) against
  // cuBLAS on the bf16 weight.
  if (!all_sections && std::strcmp(only_env, "qgemv-batch") == 0) {
    struct F {
      const char* name;
      WeightFormat f;
      int64_t group;
    };
    for (auto [out, in] : {std::pair<int64_t, int64_t>{4096, 4096}, {16384, 4096}, {32768, 4096}, {4096, 16384}}) {
      const int copies_bf = int(std::max<size_t>(1, (size_t(256) << 20) / size_t(out * in * 2)));
      std::vector<Weight> wb;
      for (int c = 0; c < copies_bf; ++c) wb.push_back(be.random_weight(out, in, 0.f, 0.02f, 11 + c));
      for (F f : {F{"fp8", WeightFormat::FP8, 0}, F{"int8", WeightFormat::Q8, 0}, F{"int4", WeightFormat::Q4, 64}}) {
        const int64_t group = f.group ? f.group : in;
        std::vector<Weight> ws{be.random_quantized_weight(f.f, out, in, group, 0.02f, 11)};
        const size_t wbytes = ws[0].nbytes();
        const int copies = int(std::max<size_t>(1, (size_t(256) << 20) / wbytes));
        for (int c = 1; c < copies; ++c) ws.push_back(be.random_quantized_weight(f.f, out, in, group, 0.02f, 11 + c));
        for (int n : {16, 32}) {
          auto xb = be.alloc(size_t(n * in) * 2), yb = be.alloc(size_t(n * out) * 2);
          Mat x = xb->mat(DType::BF16, n, in), y = yb->mat(DType::BF16, n, out);
          auto xh = host_rand(size_t(n * in), 1.f, 5);
          be.upload(x, xh.data());
          char buf[96];
          const double bf = time_us(be, 20, [&](int i) { be.matmul(x, wb[size_t(i % copies_bf)], y); });
          std::snprintf(buf, sizeof buf, ": bf16 cuBLAS %.2f (%.2f TB/s)", bf, double(out * in * 2) / bf * 1e-6);
          std::string line = std::string("qgemv batch ") + f.name + " " + std::to_string(out) + "x" + std::to_string(in) +
                             " N=" + std::to_string(n) + buf;
          const char* names[] = {"auto", "old1", "old2", "", "rb2", "rb4", "rb8", "split8"};
          for (int v : {0, 1, 2, 4, 5, 6, 7}) {
            sala::cuda::set_qgemv_tuning(v, true);
            try {
              const double us = time_us(be, 20, [&](int i) { be.matmul(x, ws[size_t(i % copies)], y); });
              std::snprintf(buf, sizeof buf, " %s %.2f (%.2f TB/s)", names[v], us, double(wbytes) / us * 1e-6);
            } catch (const std::exception&) {
              std::snprintf(buf, sizeof buf, " %s n/a", names[v]);
            }
            line += buf;
          }
          sala::cuda::set_qgemv_tuning(0, true);
          std::printf("%s us (%zu MiB packed)\n", line.c_str(), wbytes >> 20);
        }
      }
    }
    return 0;
  }

  // Decode products: GEMV at N = 1..8 (bandwidth bound on the weight).
  if (all_sections) {
    struct S {
      int64_t out, in;
    };
    for (S s : {S{4096, 4096}, S{16384, 4096}, S{4096, 16384}, S{73448, 4096}}) {
      const size_t wbytes = size_t(s.out * s.in) * 2;
      const int copies = int(std::max<size_t>(1, (size_t(256) << 20) / wbytes));
      std::vector<Weight> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(be.random_weight(s.out, s.in, 0.f, 0.02f, 11 + c));
      for (int n : {1, 2, 4, 8})
        for (int mode = -1; mode <= 3; ++mode) {  // -1: automatic variant without PDL
          auto xb = be.alloc(size_t(n * s.in) * 2), yb = be.alloc(size_t(n * s.out) * 4);
          Mat x = xb->mat(DType::BF16, n, s.in),
              y = yb->mat(n == 1 && s.out == 73448 ? DType::F32 : DType::BF16, n, s.out);
          auto xh = host_rand(size_t(n * s.in), 1.f, 5);
          be.upload(x, xh.data());
          be.set_gemv_mode(std::max(mode, 0));
          be.set_pdl(mode >= 0);
          const double us = time_us(be, 20, [&](int i) { be.matmul(x, ws[size_t(i % copies)], y); });
          be.set_gemv_mode(0);
          be.set_pdl(true);
          const double gb = double(wbytes) / (us * 1e-6) / 1e9;
          const char* mn[] = {"nopdl", "auto", "fma", "mma4", "mma16"};
          add({std::string("gemv ") + mn[mode + 1] + " N=" + std::to_string(n) + " " + std::to_string(s.out) + "x" +
                   std::to_string(s.in),
               us, gb, 2.0 * n * s.out * s.in / (us * 1e-6) / 1e12, gb / bw});
        }
    }
  }

  // Packed weights (docs/quantization.md): decode GEMV reading the packed bytes (codes + scales,
  // Weight::nbytes) per format, against the copy ceiling; warps per CTA auto / 4 / 16, without
  // the early dependent launch (nodep), batched decode N = 16, 32 (with the bf16 cuBLAS time for
  // the same shape); and the prefill path (row blocks dequantized to bf16 + cuBLAS) at N = 512 against the GEMM peak.
  if (all_sections) {
    struct F {
      const char* name;
      WeightFormat f;
      int64_t group;  // 0: one scale per row
    };
    struct S {
      int64_t out, in;
    };
    for (F f : {F{"fp8", WeightFormat::FP8, 0}, F{"int8", WeightFormat::Q8, 0}, F{"int4 g64", WeightFormat::Q4, 64}})
      for (S s : {S{4096, 4096}, S{16384, 4096}, S{4096, 16384}, S{73448, 4096}}) {
        const int64_t group = f.group ? f.group : s.in;
        std::vector<Weight> ws{be.random_quantized_weight(f.f, s.out, s.in, group, 0.02f, 11)};
        const size_t wbytes = ws[0].nbytes();
        const int copies = int(std::max<size_t>(1, (size_t(256) << 20) / wbytes));
        for (int c = 1; c < copies; ++c) ws.push_back(be.random_quantized_weight(f.f, s.out, s.in, group, 0.02f, 11 + c));
        const std::string shape = std::to_string(s.out) + "x" + std::to_string(s.in);
        for (int n : {1, 2, 8, 16, 32})
          for (int mode : {0, 1, 2, 3}) {  // automatic (8 warps for out <= 8192, else 4), nodep, 4, 16 warps
            if (n != 1 && n != 8 && mode != 0) continue;
            if (n > 8 && (mode != 0 || s.out == 73448)) continue;
            auto xb = be.alloc(size_t(n * s.in) * 2), yb = be.alloc(size_t(n * s.out) * 4);
            Mat x = xb->mat(DType::BF16, n, s.in),
                y = yb->mat(n == 1 && s.out == 73448 ? DType::F32 : DType::BF16, n, s.out);
            auto xh = host_rand(size_t(n * s.in), 1.f, 5);
            be.upload(x, xh.data());
            be.set_gemv_mode(mode == 1 ? 0 : mode);
            // nodep: no early launch of the next kernel (griddepcontrol.launch_dependents), so that
            // back-to-back calls do not overlap: the time of one call alone.
            sala::cuda::set_qgemv_tuning(0, mode != 1);
            const double us = time_us(be, 20, [&](int i) { be.matmul(x, ws[size_t(i % copies)], y); });
            sala::cuda::set_qgemv_tuning(0, true);
            be.set_gemv_mode(0);
            const double gb = double(wbytes) / (us * 1e-6) / 1e9;
            const char* mn[] = {"auto", "nodep", "w4", "w16"};
            add({std::string("qgemv ") + f.name + " " + mn[mode] + " N=" + std::to_string(n) + " " + shape + " (" +
                     std::to_string(wbytes >> 20) + " MiB)",
                 us, gb, 2.0 * n * s.out * s.in / (us * 1e-6) / 1e12, gb / bw});
          }
        if (s.out != 73448 && f.f == WeightFormat::Q4) {
          // bf16 reference at batched decode sizes (cuBLAS): the packed GEMV must not be slower.
          const size_t bbytes = size_t(s.out * s.in) * 2;
          const int bcopies = int(std::max<size_t>(1, (size_t(256) << 20) / bbytes));
          std::vector<Weight> bw16;
          for (int c = 0; c < bcopies; ++c) bw16.push_back(be.random_weight(s.out, s.in, 0.f, 0.02f, 11 + c));
          for (int n : {16, 32}) {
            auto xb = be.alloc(size_t(n * s.in) * 2), yb = be.alloc(size_t(n * s.out) * 2);
            Mat x = xb->mat(DType::BF16, n, s.in), y = yb->mat(DType::BF16, n, s.out);
            auto xh = host_rand(size_t(n * s.in), 1.f, 5);
            be.upload(x, xh.data());
            const double us = time_us(be, 20, [&](int i) { be.matmul(x, bw16[size_t(i % bcopies)], y); });
            const double gb = double(bbytes) / (us * 1e-6) / 1e9;
            add({"qgemv ref: bf16 matmul N=" + std::to_string(n) + " " + shape, us, gb,
                 2.0 * n * s.out * s.in / (us * 1e-6) / 1e12, gb / bw});
          }
        }
        if (s.out != 73448) {
          const int64_t n = 512;
          auto xb = be.alloc(size_t(n * s.in) * 2), yb = be.alloc(size_t(n * s.out) * 2);
          Mat x = xb->mat(DType::BF16, n, s.in), y = yb->mat(DType::BF16, n, s.out);
          auto xh = host_rand(size_t(n * s.in), 1.f, 3);
          be.upload(x, xh.data());
          const double us = time_us(be, 5, [&](int i) { be.matmul(x, ws[size_t(i % copies)], y); });
          const double tf = 2.0 * n * s.out * s.in / (us * 1e-6) / 1e12;
          add({std::string("qgemm ") + f.name + " (dequant+cuBLAS) N=512 " + shape, us,
               double(wbytes) / (us * 1e-6) / 1e9, tf, tf / std::max(gemm_peak, 1.0)});
        }
      }
  }

  // Elementwise and norms at decode and prefill sizes.
  if (all_sections) {
    for (int64_t rows : {int64_t(1), int64_t(512)}) {
      const int64_t cols = rows == 1 ? 16384 : 16384;
      auto ab = be.alloc(size_t(rows * cols) * 2), bb = be.alloc(size_t(rows * cols) * 2),
           ob = be.alloc(size_t(rows * cols) * 2);
      Mat a = ab->mat(DType::BF16, rows, cols), b = bb->mat(DType::BF16, rows, cols), o = ob->mat(DType::BF16, rows, cols);
      auto h = host_rand(size_t(rows * cols), 1.f, 9);
      be.upload(a, h.data());
      be.upload(b, h.data());
      double us = time_us(be, 50, [&](int) { be.silu_mul(a, b, o); });
      double gb = 3.0 * rows * cols * 2 / (us * 1e-6) / 1e9;
      add({"silu_mul " + std::to_string(rows) + "x" + std::to_string(cols), us, gb, 0, gb / bw});
      Weight w = be.random_weight(1, 4096, 1.f, 0.1f, 3);
      Mat x4 = a.reshape(rows * cols / 4096, 4096), y4 = o.reshape(rows * cols / 4096, 4096);
      us = time_us(be, 50, [&](int) { be.rmsnorm(x4, w, 1e-6f, y4); });
      gb = 2.0 * rows * cols * 2 / (us * 1e-6) / 1e9;
      add({"rmsnorm " + std::to_string(x4.rows) + "x4096", us, gb, 0, gb / bw});
    }
  }

  // Lightning: recurrent decode (state streaming) and chunked prefill, 9B geometry, one layer.
  if (all_sections) {
    CacheSpec spec;
    spec.lightning_layers = 1;
    spec.lightning_heads = 32;
    spec.lightning_dim = 128;
    for (int h = 0; h < 32; ++h) spec.log_decay.push_back(-float(std::pow(2.0, -(h + 1) / 4.0)));
    spec.lightning_scale = 1.0f / std::sqrt(128.f);
    spec.max_slots = 64;
    be.create_caches(spec);
    for (int B : {1, 8, 32, 64}) {
      BatchInfo b;
      for (int s = 0; s < B; ++s) {
        SeqEntry e;
        e.slot = s, e.start = s, e.n_new = 1, e.cached = 100;
        b.seqs.push_back(e);
        b.tokens.push_back(1), b.positions.push_back(100);
      }
      be.begin_batch(b);
      auto qb = be.alloc(size_t(B) * 4096 * 2 * 4);
      Mat q = qb->mat(DType::BF16, B, 4096);
      Mat k = Mat{static_cast<uint8_t*>(qb->data()) + size_t(B) * 4096 * 2, DType::BF16, B, 4096};
      Mat v = Mat{static_cast<uint8_t*>(qb->data()) + size_t(B) * 4096 * 4, DType::BF16, B, 4096};
      Mat o = Mat{static_cast<uint8_t*>(qb->data()) + size_t(B) * 4096 * 6, DType::BF16, B, 4096};
      auto h = host_rand(size_t(B) * 4096, 0.1f, 1);
      be.upload(q, h.data()), be.upload(k, h.data()), be.upload(v, h.data());
      const double us = time_us(be, 20, [&](int) { be.lightning_attention(0, q, k, v, o); });
      const double bytes = double(B) * 32 * 128 * 128 * 4 * 2;
      add({"gla decode (recurrent) B=" + std::to_string(B) + " 32x128x128", us, bytes / (us * 1e-6) / 1e9,
           4.0 * B * 32 * 128 * 128 / (us * 1e-6) / 1e12, bytes / (us * 1e-6) / 1e9 / bw});
    }
    for (int L : {512, 4096}) {
      BatchInfo b;
      SeqEntry e;
      e.slot = 0, e.start = 0, e.n_new = L, e.cached = 0;
      b.seqs.push_back(e);
      for (int i = 0; i < L; ++i) b.tokens.push_back(1), b.positions.push_back(i);
      be.begin_batch(b);
      auto qb = be.alloc(size_t(L) * 4096 * 2 * 4);
      Mat q = qb->mat(DType::BF16, L, 4096);
      Mat k = Mat{static_cast<uint8_t*>(qb->data()) + size_t(L) * 4096 * 2, DType::BF16, L, 4096};
      Mat v = Mat{static_cast<uint8_t*>(qb->data()) + size_t(L) * 4096 * 4, DType::BF16, L, 4096};
      Mat o = Mat{static_cast<uint8_t*>(qb->data()) + size_t(L) * 4096 * 6, DType::BF16, L, 4096};
      auto h = host_rand(size_t(L) * 4096, 0.1f, 2);
      be.upload(q, h.data()), be.upload(k, h.data()), be.upload(v, h.data());
      for (bool fma : {false, true}) {
        be.set_gla_fma(fma);
        const double us = time_us(be, 3, [&](int) { be.lightning_attention(0, q, k, v, o); });
        const double flops = double(L) / 64 * 32 * (4.0 * 64 * 128 * 128 + 2.0 * 64 * 64 * 128);
        add({std::string("gla prefill (chunked, ") + (fma ? "fp32 FMA" : "mma hi/lo") + ") L=" + std::to_string(L), us,
             0, flops / (us * 1e-6) / 1e12, flops / (us * 1e-6) / 1e12 / std::max(gemm_peak, 1.0)});
      }
      be.set_gla_fma(false);
    }
  }

  // Sparse layer (9B geometry, one layer): prefill chunks, then decode at several contexts.
  if (all_sections) {
    const CacheSpec spec = sparse_9b_spec(1400, 16);
    be.create_caches(spec);
    const int64_t chunk = 512;
    auto qb = be.alloc(size_t(chunk) * (4096 + 256 + 256 + 4096) * 2);
    Mat q = qb->mat(DType::BF16, chunk, 4096);
    auto h = host_rand(size_t(chunk) * 4096, 1.0f, 4);
    be.upload(q, h.data());
    uint8_t* base = static_cast<uint8_t*>(qb->data()) + size_t(chunk) * 4096 * 2;
    Mat k{base, DType::BF16, chunk, 256}, v{base + chunk * 512, DType::BF16, chunk, 256};
    Mat o{base + chunk * 1024, DType::BF16, chunk, 4096};
    be.upload(k, h.data()), be.upload(v, h.data() + chunk * 256);
    // Sequence 0: 32K tokens (sparse from 8K), sequences 1..8: 4K tokens (dense).
    std::vector<std::vector<int32_t>> pages(9);
    int next = 0;
    for (int i = 0; i < 520; ++i) pages[0].push_back(next++);
    for (int s = 1; s <= 8; ++s)
      for (int i = 0; i < 66; ++i) pages[size_t(s)].push_back(next++);
    auto prefill_call = [&](int seq, int64_t cached, int64_t n, bool sparse) {
      BatchInfo b;
      SeqEntry e;
      e.slot = seq, e.start = 0, e.n_new = n, e.cached = cached, e.sparse = sparse, e.pages = pages[size_t(seq)];
      b.seqs.push_back(e);
      for (int64_t i = 0; i < n; ++i) b.tokens.push_back(1), b.positions.push_back(int32_t(cached + i));
      be.begin_batch(b);
      be.sparse_attention(0, q.slice_rows(0, n), k.slice_rows(0, n), v.slice_rows(0, n), o.slice_rows(0, n));
    };
    cudaEvent_t ea, eb;
    cudaEventCreate(&ea), cudaEventCreate(&eb);
    for (int64_t c = 0; c < 32768; c += chunk) {
      // (chunk 0 and the first sparse chunk 7680 warm up allocations and kernels)
      const bool timed = c == 512 || c == 8192 || c == 16384 || c == 32256;
      if (timed) cudaEventRecord(ea, be.stream());
      prefill_call(0, c, chunk, c + chunk >= 8192);
      if (timed) {
        cudaEventRecord(eb, be.stream());
        cudaEventSynchronize(eb);
        float ms = 0;
        cudaEventElapsedTime(&ms, ea, eb);
        const double us = ms * 1000.0;
        // Dense: 4·n·(c + n/2)·H·d FLOPs; sparse: ≤ 4·n·6144·H·d.
        const double keys = c + chunk >= 8192 ? std::min<double>(6144, double(c) + chunk / 2) : double(c) + chunk / 2;
        const double flops = 4.0 * chunk * keys * 32 * 128;
        add({"sparse-layer prefill chunk 512 @" + std::to_string(c) + (c + chunk >= 8192 ? " (InfLLM-v2)" : " (dense)"),
             us, 0, flops / (us * 1e-6) / 1e12, flops / (us * 1e-6) / 1e12 / std::max(gemm_peak, 1.0)});
      }
    }
    for (int s = 1; s <= 8; ++s)
      for (int64_t c = 0; c < 4096; c += chunk) prefill_call(s, c, chunk, false);
    be.synchronize();
    // Decode: one token; the cache is not grown between repeats (same position re-written).
    auto decode = [&](std::vector<int> seqs, std::vector<int64_t> cached, bool sparse, const std::string& name) {
      BatchInfo b;
      for (size_t i = 0; i < seqs.size(); ++i) {
        SeqEntry e;
        e.slot = seqs[i], e.start = int64_t(i), e.n_new = 1, e.cached = cached[i], e.sparse = sparse;
        e.pages = pages[size_t(seqs[i])];
        b.seqs.push_back(e);
        b.tokens.push_back(1), b.positions.push_back(int32_t(cached[i]));
      }
      be.begin_batch(b);
      const int64_t B = int64_t(seqs.size());
      const double us = time_us(be, 20, [&](int) {
        be.sparse_attention(0, q.slice_rows(0, B), k.slice_rows(0, B), v.slice_rows(0, B), o.slice_rows(0, B));
      });
      double keys = 0;
      for (auto c : cached) keys += sparse ? std::min<double>(double(c) + 1, 96 * 64) : double(c) + 1;
      double bytes = keys * 2 * 256 * 2;
      if (sparse) bytes += double(cached[0]) / 16 * 256 * 2 * 1.25;  // stage-1 K1 + K2 reads
      add({name, us, bytes / (us * 1e-6) / 1e9, 0, bytes / (us * 1e-6) / 1e9 / bw});
    };
    decode({0}, {8190}, false, "sparse-layer decode B=1 T=8191 dense");
    decode({0}, {32767}, false, "sparse-layer decode B=1 T=32768 dense");
    decode({0}, {32767}, true, "sparse-layer decode B=1 T=32768 InfLLM-v2");
    decode({1, 2, 3, 4, 5, 6, 7, 8}, std::vector<int64_t>(8, 4095), false, "sparse-layer decode B=8 T=4096 dense");
    cudaEventDestroy(ea), cudaEventDestroy(eb);
  }

  // Sparse-layer decode at long contexts (one layer, batch 1): the pools hold random bf16 instead
  // of a prefilled context (same bytes and work, no 1M-token prefill). Selection splits: automatic,
  // then forced, to find the best split count per context.
  {
    const CacheSpec spec = sparse_9b_spec(16400, 1);
    be.create_caches(spec);
    be.debug_fill_pools_random(77);
    std::vector<int32_t> pages(size_t(spec.max_pages));
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = int32_t(i);
    auto qb = be.alloc(size_t(4096 + 256 + 256 + 4096) * 2);
    uint8_t* base = static_cast<uint8_t*>(qb->data());
    Mat q{base, DType::BF16, 1, 4096}, k{base + 8192, DType::BF16, 1, 256}, v{base + 8704, DType::BF16, 1, 256};
    Mat o{base + 9216, DType::BF16, 1, 4096};
    auto h = host_rand(4096, 1.0f, 6);
    be.upload(q, h.data()), be.upload(k, h.data()), be.upload(v, h.data() + 256);
    // SALA_BENCH_ONLY=long-decode-1m: 1M with the automatic split only (for a profiler).
    const bool one = !all_sections && std::strcmp(only_env, "long-decode-1m") == 0;
    for (int64_t T : {int64_t(131072), int64_t(524288), int64_t(1048576)})
      for (int splits : {-1, 16, 32, 64, 128}) {
        if (one && (T != 1048576 || splits != -1)) continue;
        be.set_select_splits(splits);
        BatchInfo b;
        SeqEntry e;
        e.slot = 0, e.start = 0, e.n_new = 1, e.cached = T - 1, e.sparse = true, e.pages = pages;
        b.seqs.push_back(e);
        b.tokens.push_back(1), b.positions.push_back(int32_t(T - 1));
        be.begin_batch(b);
        const double us = time_us(be, 20, [&](int) { be.sparse_attention(0, q, k, v, o); });
        const double bytes = 96.0 * 64 * 2 * 256 * 2 + double(T) / 16 * 256 * 2 * 1.25;  // stage 2 + stage-1 K1/K2
        add({"sparse-layer decode B=1 T=" + std::to_string(T / 1024) + "K InfLLM-v2 splits " +
                 (splits < 0 ? std::string("auto") : std::to_string(splits)),
             us, bytes / (us * 1e-6) / 1e9, 0, bytes / (us * 1e-6) / 1e9 / bw});
      }
    be.set_select_splits(-1);
  }

  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f) {
      std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"copy_GBps\": %.1f,\n  \"gemm_TFLOPs\": %.1f,\n  \"results\": [\n",
                   be.device_name().c_str(), bw, gemm_peak);
      for (size_t i = 0; i < res.size(); ++i)
        std::fprintf(f, "    {\"name\": \"%s\", \"us\": %.3f, \"GBps\": %.1f, \"TFLOPs\": %.3f, \"fraction\": %.3f}%s\n",
                     res[i].name.c_str(), res[i].us, res[i].gbs, res[i].tflops, res[i].frac,
                     i + 1 < res.size() ? "," : "");
      std::fprintf(f, "  ]\n}\n");
      std::fclose(f);
    }
  }
  return 0;
}
