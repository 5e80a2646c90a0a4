// SALA_BENCH_ONLY=stream-floor (sala_cuda_tests --bench): the floor under a batch-1 decode step's
// products — every weight byte of one 9B token (the 129 products of MiniCPM-SALA's 32 layers and
// lm_head, in step order) streamed by loads alone, with a grid-wide dependency between products as
// the real step has (a product needs the previous one's output). It asks what issue #8's decode
// targets need from a persistent decode kernel: the step today is ~0.86 ms of dependent latency
// plus its bytes at ~3.16 TB/s (bench/results/2026-11-26-h100-stream-gemv.md); 4-bit at 3× of
// bf16 needs the whole int4 step in ≤ 2.22 ms.
//
// One CTA per SM: a producer thread keeps a ring of 16 KB stages filled with bulk copies (each
// completing its stage's "full" mbarrier), four consumer warps xor every byte of a stage and free
// it (its "empty" mbarrier). Product p's 16 KB chunks are shared equally by the CTAs. After its
// share of p the CTA arrives on a grid counter; its consumers wait for all CTAs' arrivals before
// touching p + 1 (the dependency). Modes:
//   launch:    one kernel per product in a CUDA graph with programmatic dependent launch (the
//              producer starts at once, the consumers wait for the previous grid) — today's shape;
//   barrier:   one persistent grid, the producer waits for the grid barrier too (no run-ahead);
//   run-ahead: one persistent grid, the producer streams the next products' bytes while the
//              consumers wait at the barrier, as far as the ring reaches — weights never depend on
//              activations, so a persistent kernel can keep the memory system busy across
//              dependencies.
// `delay` adds a dependent chain of that many µs after every product on CTA 0 before it arrives
// (the norms, GLA and attention steps between products: ~0.5 ms per token in the kernel timeline).
// H100 results (bench/results/2026-11-27-h100-ring-gemv.md): one launch per product is the fastest
// (int4 g128 + lm_head 1.76 ms with the f32 group parameters of then, fp8 + lm_head 3.04, bf16
// 5.94); the decode GEMV built on it: backend/cuda/quant_gemv_ring.cu. int4 is now counted with
// the f16 parameters the backends hold (quant_layout.h).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/quant_decode.cuh"

namespace sala::cuda {

namespace {

constexpr int kChunk = 16384;
constexpr int kConsumerWarps = 4;
constexpr int kThreads = (kConsumerWarps + 1) * 32;
enum Mode { kLaunch = 0, kBarrier = 1, kRunAhead = 2 };

__device__ __forceinline__ void wait_count(const unsigned* counter, unsigned target) {
  unsigned v;
  do {
    asm volatile("ld.acquire.gpu.u32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
  } while (int(v - target) < 0);
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}

// Products [p0, p1) of the chunk prefix `begin` (begin[p] .. begin[p+1] are product p's chunks).
// `base` is the counter's value when this launch's products start (the counter only grows).
__global__ void __launch_bounds__(kThreads, 1)
    stream_floor_kernel(const uint8_t* __restrict__ w, const int64_t* __restrict__ begin, int p0, int p1, int stages,
                        int mode, unsigned* counter, unsigned base, long long delay_cycles, uint32_t* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t ring = smem_addr(smem);
  const uint32_t bars = ring + uint32_t(stages) * kChunk;  // full[s] at bars + 8s, empty[s] at bars + 8(stages + s)
  const int64_t G = gridDim.x, c = blockIdx.x;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(bars + 8 * s, 1);
      mbar_init(bars + 8 * (stages + s), kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (mode == kLaunch) launch_dependents();

  if (warp == kConsumerWarps) {  // producer
    if (lane != 0) return;
    int64_t it = 0;
    for (int p = p0; p < p1; ++p) {
      if (mode == kBarrier && p > p0) wait_count(counter, base + unsigned(G) * unsigned(p - p0));
      const int64_t n = begin[p + 1] - begin[p], k0 = begin[p] + n * c / G, k1 = begin[p] + n * (c + 1) / G;
      for (int64_t k = k0; k < k1; ++k, ++it) {
        const int s = int(it % stages);
        if (it >= stages) mbar_wait(bars + 8 * (stages + s), uint32_t((it / stages - 1) & 1));
        mbar_arrive_expect_tx(bars + 8 * s, kChunk);
        bulk_load(ring + uint32_t(s) * kChunk, w + k * kChunk, kChunk, bars + 8 * s);
      }
    }
    return;
  }

  // consumers
  uint32_t acc = 0;
  int64_t it = 0;
  for (int p = p0; p < p1; ++p) {
    if (mode == kLaunch) {
      grid_dep_wait();
    } else if (p > p0) {
      if (threadIdx.x == 0) wait_count(counter, base + unsigned(G) * unsigned(p - p0));
      asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerWarps * 32) : "memory");
    }
    const int64_t n = begin[p + 1] - begin[p], k0 = begin[p] + n * c / G, k1 = begin[p] + n * (c + 1) / G;
    for (int64_t k = k0; k < k1; ++k, ++it) {
      const int s = int(it % stages);
      mbar_wait(bars + 8 * s, uint32_t((it / stages) & 1));
      const uint4* st = reinterpret_cast<const uint4*>(smem + size_t(s) * kChunk);
#pragma unroll
      for (int j = 0; j < kChunk / 16 / (kConsumerWarps * 32); ++j) {
        const uint4 v = st[j * kConsumerWarps * 32 + int(threadIdx.x)];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bars + 8 * (stages + s));
    }
    asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerWarps * 32) : "memory");
    if (threadIdx.x == 0 && mode != kLaunch) {
      if (c == 0 && delay_cycles > 0) {
        const long long t0 = clock64();
        while (clock64() - t0 < delay_cycles) {
        }
      }
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(counter) : "memory");
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // practically never: keeps the reads
}

// The 129 products of one token in step order, in bytes per weight element `bpe`, each rounded up
// to whole chunks: lightning layers q/k/v/z 16384×4096, o 4096×4096; sparse (minicpm4) layers
// q/k/v/gate 8704×4096, o 4096×4096; every layer gate/up 32768×4096 and down 4096×16384; lm_head
// 73448×4096.
std::vector<int64_t> step_chunks(double bpe) {
  const bool sparse[32] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
                           1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1};
  std::vector<int64_t> begin{0};
  auto add = [&](int64_t out, int64_t in) {
    const auto bytes = int64_t(double(out * in) * bpe);
    begin.push_back(begin.back() + (bytes + kChunk - 1) / kChunk);
  };
  for (bool s : sparse) {
    add(s ? 8704 : 16384, 4096);
    add(4096, 4096);
    add(32768, 4096);
    add(4096, 16384);
  }
  add(73448, 4096);
  return begin;
}

}  // namespace

void run_stream_floor_bench() {
  int sms = 0, clock_khz = 0;
  SALA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  SALA_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  struct Format {
    const char* name;
    double bpe;  // bytes per weight element: codes plus scales (int4 g128: f16 scale and bias per 128, as stored)
  };
  const Format formats[] = {{"bf16", 2.0}, {"fp8", 1.0}, {"int4 g128", 0.5 + 4.0 / 128}};
  const std::vector<int64_t> largest = step_chunks(2.0);
  const size_t bytes = size_t(largest.back()) * kChunk;
  uint8_t* w = nullptr;
  int64_t* begin_d = nullptr;
  unsigned* counter = nullptr;
  uint32_t* sink = nullptr;
  SALA_CUDA_CHECK(cudaMalloc(&w, bytes));
  SALA_CUDA_CHECK(cudaMemset(w, 0x5a, bytes));
  SALA_CUDA_CHECK(cudaMalloc(&begin_d, largest.size() * sizeof(int64_t)));
  SALA_CUDA_CHECK(cudaMalloc(&counter, sizeof(unsigned)));
  SALA_CUDA_CHECK(cudaMemset(counter, 0, sizeof(unsigned)));
  SALA_CUDA_CHECK(cudaMalloc(&sink, sizeof(uint32_t)));
  cudaStream_t st;
  SALA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  SALA_CUDA_CHECK(cudaFuncSetAttribute(stream_floor_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  unsigned base = 0;  // the counter's value; it only grows (wrap-safe comparisons)

  std::printf("stream floor: one 9B token's weight bytes in step order, %d CTAs (one per SM), 16 KB stages;\n"
              "  ms per token, median of 5 after a warm-up, and the bytes' rate\n",
              sms);
  for (const Format& f : formats) {
    const std::vector<int64_t> begin = step_chunks(f.bpe);
    const int np = int(begin.size()) - 1;
    const double gb = double(begin.back()) * kChunk / 1e9;
    SALA_CUDA_CHECK(cudaMemcpy(begin_d, begin.data(), begin.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    struct Run {
      const char* name;
      int mode, stages;
      double delay_us;
    };
    const Run runs[] = {{"launch per product", kLaunch, 12, 0},  {"barrier, no run-ahead", kBarrier, 12, 0},
                        {"run-ahead", kRunAhead, 12, 0},         {"run-ahead", kRunAhead, 4, 0},
                        {"barrier, no run-ahead", kBarrier, 12, 2}, {"run-ahead", kRunAhead, 12, 2},
                        {"run-ahead", kRunAhead, 12, 4}};
    for (const Run& r : runs) {
      const size_t smem = size_t(r.stages) * kChunk + 16 * size_t(r.stages);
      const long long cycles = (long long)(r.delay_us * clock_khz * 1e-3);
      cudaGraphExec_t exec = nullptr;
      if (r.mode == kLaunch) {  // one graph of np launches
        cudaGraph_t graph;
        SALA_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int p = 0; p < np; ++p)
          launch_pdl(true, stream_floor_kernel, dim3(unsigned(sms)), dim3(kThreads), smem, st,
                     static_cast<const uint8_t*>(w), static_cast<const int64_t*>(begin_d), p, p + 1, r.stages,
                     int(kLaunch), counter, 0u, 0LL, sink);
        SALA_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
        SALA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        cudaGraphDestroy(graph);
      }
      auto once = [&] {
        if (exec) {
          SALA_CUDA_CHECK(cudaGraphLaunch(exec, st));
        } else {
          stream_floor_kernel<<<sms, kThreads, smem, st>>>(w, begin_d, 0, np, r.stages, r.mode, counter, base, cycles,
                                                           sink);
          SALA_CUDA_LAUNCH("stream_floor_kernel");
          base += unsigned(sms) * unsigned(np);
        }
      };
      once();  // warm-up
      std::vector<double> t;
      for (int rep = 0; rep < 5; ++rep) {
        cudaEventRecord(a, st);
        once();
        cudaEventRecord(b, st);
        SALA_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(ms);
      }
      std::sort(t.begin(), t.end());
      unsigned seen = 0;
      SALA_CUDA_CHECK(cudaMemcpy(&seen, counter, sizeof(unsigned), cudaMemcpyDeviceToHost));
      if (seen != base) std::printf("stream floor: grid counter %u, expected %u\n", seen, base);
      std::printf("  %-9s %6.2f GB  %-22s ring %2d x 16 KB, delay %.0f us per product: %6.3f ms  %5.2f TB/s\n", f.name,
                  gb, r.name, r.stages, r.delay_us, t[2], gb / t[2]);  // GB per ms = TB/s
      if (exec) cudaGraphExecDestroy(exec);
    }
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(st);
  cudaFree(sink);
  cudaFree(counter);
  cudaFree(begin_d);
  cudaFree(w);
}

}  // namespace sala::cuda
