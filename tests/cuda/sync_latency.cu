// SALA_BENCH_ONLY=sync-latency (sala_cuda_tests --bench): what one dependent step of a decode token
// costs with no work in it — the floor under the step's fixed part (bench/results/2026-11-26-h100-
// stream-gemv.md reads a 4K batch-1 step as ~0.86 ms of dependent-launch latency plus its bytes).
//
//   chain:   K kernels in one CUDA graph, each CTA reading one value the previous kernel wrote and
//            writing one for the next (an L2 round trip per step, as a norm or a product's x), with
//            programmatic dependent launch (the decode step's launches) or plain stream order;
//   barrier: one resident grid passing K grid-wide barriers (release add on a counter, acquire
//            spin), the dependency a persistent decode kernel would pay instead of a launch.
// Each figure: median of 5 replays of K = 256 steps, µs per step.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"

namespace sala::cuda {

namespace {

constexpr int kSteps = 256;
constexpr int kThreads = 128;

__global__ void chain_kernel(int* buf, int step, int pdl) {
  if (pdl) {
    grid_dep_wait();
    launch_dependents();
  }
  if (threadIdx.x == 0) {
    const int n = int(gridDim.x);
    const int prev = step > 0 ? buf[(step - 1) * n + int(blockIdx.x)] : 0;
    buf[step * n + int(blockIdx.x)] = prev + 1;
  }
}

__global__ void barrier_kernel(unsigned* counter, int* sink, int steps) {
  const unsigned n = gridDim.x;
  int acc = 0;
  for (int k = 0; k < steps; ++k) {
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned v;
      asm volatile("atom.add.release.gpu.u32 %0, [%1], 1;\n" : "=r"(v) : "l"(counter) : "memory");
      const unsigned target = n * unsigned(k + 1);
      do {
        asm volatile("ld.acquire.gpu.u32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
      } while (v < target);
      acc += int(v);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0 && acc == -1) *sink = acc;  // keeps the loop
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// µs per step of a graph of kSteps chained kernels of `ctas` CTAs.
double chain_us(int ctas, bool pdl) {
  cudaStream_t st;
  SALA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int* buf = nullptr;
  SALA_CUDA_CHECK(cudaMalloc(&buf, size_t(kSteps) * ctas * sizeof(int)));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SALA_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int s = 0; s < kSteps; ++s) launch_pdl(pdl, chain_kernel, dim3(ctas), dim3(kThreads), 0, st, buf, s, int(pdl));
  SALA_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  SALA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  SALA_CUDA_CHECK(cudaGraphLaunch(exec, st));  // warm-up
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a, st);
    SALA_CUDA_CHECK(cudaGraphLaunch(exec, st));
    cudaEventRecord(b, st);
    SALA_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(double(ms) * 1000.0 / kSteps);
  }
  int last = 0;
  SALA_CUDA_CHECK(cudaMemcpy(&last, buf + size_t(kSteps - 1) * ctas, sizeof(int), cudaMemcpyDeviceToHost));
  if (last != kSteps) std::printf("sync-latency: chain result %d, expected %d\n", last, kSteps);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(buf);
  cudaStreamDestroy(st);
  return median(t);
}

// µs per grid-wide barrier of one resident grid of `ctas` CTAs.
double barrier_us(int ctas) {
  unsigned* counter = nullptr;
  int* sink = nullptr;
  SALA_CUDA_CHECK(cudaMalloc(&counter, sizeof(unsigned)));
  SALA_CUDA_CHECK(cudaMalloc(&sink, sizeof(int)));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  for (int r = 0; r < 6; ++r) {
    SALA_CUDA_CHECK(cudaMemset(counter, 0, sizeof(unsigned)));
    cudaEventRecord(a);
    barrier_kernel<<<ctas, kThreads>>>(counter, sink, kSteps);
    cudaEventRecord(b);
    SALA_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (r > 0) t.push_back(double(ms) * 1000.0 / kSteps);  // the first is warm-up
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(counter);
  cudaFree(sink);
  return median(t);
}

}  // namespace

void run_sync_latency_bench() {
  int sms = 0;
  SALA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("sync latency (µs per dependent step, median of 5 replays of %d steps)\n", kSteps);
  for (int ctas : {1, sms, 2 * sms, 4 * sms})
    std::printf("  chain of kernels, %4d CTAs: PDL %.2f, stream order %.2f\n", ctas, chain_us(ctas, true),
                chain_us(ctas, false));
  for (int ctas : {sms, 2 * sms}) std::printf("  grid barrier, %4d resident CTAs: %.2f\n", ctas, barrier_us(ctas));
}

}  // namespace sala::cuda
