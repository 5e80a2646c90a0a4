// Probe (twenty-ninth session): which int8 GEMMs cuBLASLt offers on this GPU for --int8-prefill's
// shape (TN, column-major, N = 4096 tokens): float or bf16 output, per-row alpha vectors, outer-vector
// scales — any of them would spare the int32 products' round trip through memory (15.5 ms of a 4K
// prompt, w8a8_prefill.cu's epilogue). Answer on an H100 with CUDA 13
// (bench/results/2026-11-27-cublaslt-int8-probe.md): only int32 output; every other variant
// CUBLAS_STATUS_NOT_SUPPORTED. Checks the supported ones' values against a host sum.
//
// Build and run on the GPU machine:
//   nvcc -O2 -arch=sm_90a -std=c++17 -o /tmp/probe bench/probes/cublaslt_int8_outputs.cu -lcublasLt && /tmp/probe
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>
#include <cmath>
#define CK(x) do { auto e_ = (x); if (e_ != 0) { printf("ERR %s = %d line %d\n", #x, int(e_), __LINE__); exit(1);} } while (0)
static cublasLtHandle_t lt; static void* ws; static size_t wsb = 64u << 20;
struct V { const char* name; cublasComputeType_t ct; cudaDataType_t st, dt; int scale_mode; int ptr_mode; };
// returns ms (median) or -1 if unsupported
float run(const V& v, int M, int N, int K, void* A, void* B, void* D, void* as, void* bs, void* alpha_dev, bool time) {
  cublasLtMatmulDesc_t d; CK(cublasLtMatmulDescCreate(&d, v.ct, v.st));
  cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
  CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
  if (v.scale_mode >= 0) {
    if (cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &v.scale_mode, sizeof v.scale_mode) ||
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &v.scale_mode, sizeof v.scale_mode) ||
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof as) ||
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof bs)) { printf("  %s: scale attrs rejected\n", v.name); return -1; }
  }
  if (v.ptr_mode >= 0) {
    cublasLtPointerMode_t pm = cublasLtPointerMode_t(v.ptr_mode);
    if (cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm)) { printf("  %s: pointer mode rejected\n", v.name); return -1; }
  }
  cublasLtMatrixLayout_t la, lb, ld;
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8I, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8I, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&ld, v.dt, M, N, M));
  cublasLtMatmulPreference_t p; CK(cublasLtMatmulPreferenceCreate(&p));
  CK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
  cublasLtMatmulHeuristicResult_t h; int found = 0;
  auto st = cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, ld, ld, p, 1, &h, &found);
  if (st != 0 || found == 0) { printf("  %s: no algorithm (status %d)\n", v.name, int(st)); return -1; }
  float alpha_f = 1, beta_f = 0; int32_t alpha_i = 1, beta_i = 0;
  const void* al = v.ptr_mode == CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO ? alpha_dev : (v.st == CUDA_R_32I ? (const void*)&alpha_i : (const void*)&alpha_f);
  const void* be = v.st == CUDA_R_32I ? (const void*)&beta_i : (const void*)&beta_f;
  auto go = [&] { return cublasLtMatmul(lt, d, al, A, la, B, lb, be, D, ld, D, ld, &h.algo, ws, wsb, 0); };
  auto s2 = go(); if (s2 != 0) { printf("  %s: matmul status %d\n", v.name, int(s2)); return -1; }
  CK(cudaDeviceSynchronize());
  if (!time) return 0;
  for (int i = 0; i < 5; ++i) go();
  std::vector<float> ts; cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int i = 0; i < 15; ++i) { cudaEventRecord(e0); go(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms); }
  std::sort(ts.begin(), ts.end()); return ts[ts.size() / 2];
}
int main() {
  CK(cublasLtCreate(&lt)); CK(cudaMalloc(&ws, wsb));
  const int O = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, DV = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
  V vs[] = {
    {"int32 out (current)", CUBLAS_COMPUTE_32I, CUDA_R_32I, CUDA_R_32I, -1, -1},
    {"int8 out, alpha vector", CUBLAS_COMPUTE_32I, CUDA_R_32F, CUDA_R_8I, -1, DV},
    {"f32 out, scalar", CUBLAS_COMPUTE_32I, CUDA_R_32F, CUDA_R_32F, -1, -1},
    {"bf16 out, scalar", CUBLAS_COMPUTE_32I, CUDA_R_32F, CUDA_R_16BF, -1, -1},
    {"f32 out, alpha vector", CUBLAS_COMPUTE_32I, CUDA_R_32F, CUDA_R_32F, -1, DV},
    {"bf16 out, alpha vector", CUBLAS_COMPUTE_32I, CUDA_R_32F, CUDA_R_16BF, -1, DV},
    {"f32 out, outer-vector scales", CUBLAS_COMPUTE_32I, CUDA_R_32F, CUDA_R_32F, O, -1},
    {"bf16 out, outer-vector scales", CUBLAS_COMPUTE_32I, CUDA_R_32F, CUDA_R_16BF, O, -1},
    {"bf16 out, outer-vector scales, compute 32F", CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, O, -1},
  };
  for (int shape = 0; shape < 2; ++shape) {
    int M = shape ? 16384 : 4096, N = 4096, K = 4096;
    void *A, *B, *D, *as, *bs, *av;
    CK(cudaMalloc(&A, size_t(M) * K)); CK(cudaMalloc(&B, size_t(N) * K)); CK(cudaMalloc(&D, size_t(M) * N * 4));
    CK(cudaMalloc(&as, M * 4)); CK(cudaMalloc(&bs, N * 4)); CK(cudaMalloc(&av, M * 4));
    std::vector<int8_t> h(size_t(std::max(M, N)) * K); std::mt19937 r(3); for (auto& x : h) x = int8_t(int(r() % 255) - 127);
    CK(cudaMemcpy(A, h.data(), size_t(M) * K, cudaMemcpyHostToDevice)); CK(cudaMemcpy(B, h.data(), size_t(N) * K, cudaMemcpyHostToDevice));
    std::vector<float> sa(M), sb(N); for (auto& x : sa) x = 1e-3f * (1 + r() % 100); for (auto& x : sb) x = 1e-3f * (1 + r() % 100);
    CK(cudaMemcpy(as, sa.data(), M * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(bs, sb.data(), N * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(av, sa.data(), M * 4, cudaMemcpyHostToDevice));
    printf("M=%d N=%d K=%d\n", M, N, K);
    for (auto& v : vs) {
      float ms = run(v, M, N, K, A, B, D, as, bs, av, true);
      if (ms < 0) continue;
      // correctness of a few entries for the scaled float outputs
      double err = 0, ref = 0;
      if (v.dt == CUDA_R_32F || v.dt == CUDA_R_16BF) {
        std::vector<uint8_t> out(size_t(M) * N * 4); CK(cudaMemcpy(out.data(), D, size_t(M) * N * (v.dt == CUDA_R_32F ? 4 : 2), cudaMemcpyDeviceToHost));
        for (int i = 0; i < 200; ++i) {
          int m = (i * 7919) % M, nn = (i * 104729) % N;
          long acc = 0; for (int k = 0; k < K; ++k) acc += long(h[size_t(m) * K + k]) * h[size_t(nn) * K + k];
          double want = double(acc) * (v.scale_mode >= 0 ? double(sa[m]) * sb[nn] : v.ptr_mode >= 0 ? double(sa[m]) : 1.0);
          size_t idx = size_t(nn) * M + m;
          double got = v.dt == CUDA_R_32F ? double(reinterpret_cast<float*>(out.data())[idx]) : double(float(reinterpret_cast<__nv_bfloat16*>(out.data())[idx]));
          err += (got - want) * (got - want); ref += want * want;
        }
      }
      printf("  %-44s %.3f ms  %5.0f TOPS  rel err %.2e\n", v.name, ms, 2.0 * M * N * K / ms / 1e9, ref > 0 ? std::sqrt(err / ref) : 0.0);
    }
    cudaFree(A); cudaFree(B); cudaFree(D); cudaFree(as); cudaFree(bs); cudaFree(av);
  }
}
