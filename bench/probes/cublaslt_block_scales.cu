// Probe (twenty-ninth session): cuBLASLt's block-scaled fp8 GEMMs on this GPU against its outer-
// vector fp8 GEMM (what --fp8-prefill uses) and bf16. Question asked: would int4 g128 weights, whose
// codes minus zero points (−15..15) are exact e4m3 values, prefill faster through fp8 with one scale
// per 128-k block (VEC128, the group scale) and block-scaled activations (robust to outlier
// channels) than through --int8-prefill? Answer on an H100 (bench/results/2026-11-27-block-scaled-fp8-probe.md):
// VEC128 x VEC128 runs at 0.9–1.03 PFLOP/s against outer-vector fp8's 1.18–1.37 and bf16's 0.76–0.85,
// too slow to pay for the passes around it. It also checks the scale layouts against a host sum.
//
// Build and run on the GPU machine:
//   nvcc -O2 -arch=sm_90a -std=c++17 -o /tmp/probe bench/probes/cublaslt_block_scales.cu -lcublasLt && /tmp/probe
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cuda_fp8.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>
#define CK(x) do { auto e_ = (x); if (e_ != 0) { printf("ERR %s = %d line %d\n", #x, int(e_), __LINE__); exit(1);} } while (0)

static cublasLtHandle_t lt;
static void* ws; static size_t wsb = 64u << 20;

struct Res { bool ok; float ms; };

Res run(cudaDataType_t abt, int amode, int bmode, int M, int N, int K, void* A, void* B, void* D, void* as, void* bs, bool time) {
  cublasLtMatmulDesc_t d; CK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
  CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
  if (abt != CUDA_R_16BF) {
    CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof amode));
    CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof bmode));
    CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof as));
    CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof bs));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  CK(cublasLtMatrixLayoutCreate(&la, abt, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&lb, abt, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, M, N, M));
  cublasLtMatmulPreference_t p; CK(cublasLtMatmulPreferenceCreate(&p));
  CK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
  cublasLtMatmulHeuristicResult_t h; int found = 0;
  auto st = cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, ld, ld, p, 1, &h, &found);
  Res r{false, 0};
  if (st != 0 || found == 0) { printf("  no algo (status %d found %d)\n", int(st), found); return r; }
  float alpha = 1, beta = 0;
  auto go = [&] { return cublasLtMatmul(lt, d, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &h.algo, ws, wsb, 0); };
  auto s2 = go(); if (s2 != 0) { printf("  matmul status %d\n", int(s2)); return r; }
  CK(cudaDeviceSynchronize());
  r.ok = true;
  if (time) {
    for (int i = 0; i < 5; ++i) go();
    std::vector<float> v; cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int i = 0; i < 15; ++i) { cudaEventRecord(e0); go(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); v.push_back(ms); }
    std::sort(v.begin(), v.end()); r.ms = v[v.size() / 2];
  }
  return r;
}

int main() {
  CK(cublasLtCreate(&lt)); CK(cudaMalloc(&ws, wsb));
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  // correctness of layouts: small M=256, N=128, K=512
  {
    int M = 256, N = 128, K = 512, KB = K / 128;
    std::vector<float> a(size_t(M) * K), b(size_t(N) * K);
    for (auto& v : a) v = nd(rng); for (auto& v : b) v = nd(rng);
    std::vector<__nv_fp8_e4m3> a8(a.size()), b8(b.size());
    for (size_t i = 0; i < a.size(); ++i) a8[i] = __nv_fp8_e4m3(a[i]);
    for (size_t i = 0; i < b.size(); ++i) b8[i] = __nv_fp8_e4m3(b[i]);
    // scale for (row m, block kb): distinct values
    auto sa = [&](int m, int kb) { return 1.f + 0.01f * m + 0.5f * kb; };
    auto sb = [&](int nn, int kb) { return 1.f + 0.02f * nn + 0.25f * kb; };
    void *dA, *dB, *dD, *dsa, *dsb;
    CK(cudaMalloc(&dA, a.size())); CK(cudaMalloc(&dB, b.size())); CK(cudaMalloc(&dD, size_t(M) * N * 2));
    CK(cudaMalloc(&dsa, M * KB * 4)); CK(cudaMalloc(&dsb, N * KB * 4));
    CK(cudaMemcpy(dA, a8.data(), a.size(), cudaMemcpyHostToDevice)); CK(cudaMemcpy(dB, b8.data(), b.size(), cudaMemcpyHostToDevice));
    for (int order = 0; order < 2; ++order) {  // 0: [kb][m] (m fastest), 1: [m][kb]
      std::vector<float> hsa(M * KB), hsb(N * KB);
      for (int m = 0; m < M; ++m) for (int kb = 0; kb < KB; ++kb) hsa[order ? m * KB + kb : kb * M + m] = sa(m, kb);
      for (int nn = 0; nn < N; ++nn) for (int kb = 0; kb < KB; ++kb) hsb[order ? nn * KB + kb : kb * N + nn] = sb(nn, kb);
      CK(cudaMemcpy(dsa, hsa.data(), hsa.size() * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dsb, hsb.data(), hsb.size() * 4, cudaMemcpyHostToDevice));
      Res r = run(CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, M, N, K, dA, dB, dD, dsa, dsb, false);
      if (!r.ok) { printf("vec128 x vec128: unsupported\n"); break; }
      std::vector<__nv_bfloat16> D(size_t(M) * N); CK(cudaMemcpy(D.data(), dD, D.size() * 2, cudaMemcpyDeviceToHost));
      double err = 0, ref2 = 0;
      for (int nn = 0; nn < N; nn += 7) for (int m = 0; m < M; m += 5) {
        double s = 0;
        for (int k = 0; k < K; ++k) s += double(float(a8[size_t(m) * K + k])) * sa(m, k / 128) * double(float(b8[size_t(nn) * K + k])) * sb(nn, k / 128);
        double g = float(D[size_t(nn) * M + m]); err += (g - s) * (g - s); ref2 += s * s;
      }
      printf("vec128 x vec128, scale order %s: rel err %.3e\n", order ? "[m][kb]" : "[kb][m]", sqrt(err / ref2));
    }
    // vec128 (activations, B) x blk128x128 (weights, A)
    {
      int MB = M / 128;
      auto sab = [&](int m, int kb) { return 1.f + 0.3f * (m / 128) + 0.5f * kb; };
      for (int order = 0; order < 2; ++order) {
        std::vector<float> hsa(MB * KB), hsb(N * KB);
        for (int mb = 0; mb < MB; ++mb) for (int kb = 0; kb < KB; ++kb) hsa[order ? mb * KB + kb : kb * MB + mb] = sab(mb * 128, kb);
        for (int nn = 0; nn < N; ++nn) for (int kb = 0; kb < KB; ++kb) hsb[order ? nn * KB + kb : kb * N + nn] = sb(nn, kb);
        CK(cudaMemcpy(dsa, hsa.data(), hsa.size() * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dsb, hsb.data(), hsb.size() * 4, cudaMemcpyHostToDevice));
        Res r = run(CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, M, N, K, dA, dB, dD, dsa, dsb, false);
        if (!r.ok) { printf("blk x vec128: unsupported\n"); break; }
        std::vector<__nv_bfloat16> D(size_t(M) * N); CK(cudaMemcpy(D.data(), dD, D.size() * 2, cudaMemcpyDeviceToHost));
        double err = 0, ref2 = 0;
        for (int nn = 0; nn < N; nn += 7) for (int m = 0; m < M; m += 5) {
          double s = 0;
          for (int k = 0; k < K; ++k) s += double(float(a8[size_t(m) * K + k])) * sab(m, k / 128) * double(float(b8[size_t(nn) * K + k])) * sb(nn, k / 128);
          double g = float(D[size_t(nn) * M + m]); err += (g - s) * (g - s); ref2 += s * s;
        }
        printf("blk128 x vec128, order %d: rel err %.3e\n", order, sqrt(err / ref2));
      }
    }
  }
  // timing
  int shapes[][3] = {{4096, 4096, 4096}, {16384, 4096, 4096}, {4096, 4096, 16384}, {73448/8*8, 4096, 4096}};
  for (auto& s : shapes) {
    int M = s[0], N = s[1], K = s[2];
    void *dA, *dB, *dD, *dsa, *dsb;
    CK(cudaMalloc(&dA, size_t(M) * K * 2)); CK(cudaMalloc(&dB, size_t(N) * K * 2)); CK(cudaMalloc(&dD, size_t(M) * N * 2));
    CK(cudaMalloc(&dsa, size_t(M) * K / 128 * 4 + 4096)); CK(cudaMalloc(&dsb, size_t(N) * K / 128 * 4 + 4096));
    {  // random bytes: e4m3 codes without NaN (mask 0x77: exponent ≤ 14... sign dropped), bf16 likewise finite
      std::vector<uint8_t> h(size_t(std::max(M, N)) * K * 2);
      std::mt19937 r2(7);
      for (auto& v : h) v = uint8_t(r2()) & 0x77;
      for (size_t i = 0; i < h.size(); i += 2) h[i] ^= (r2() & 0x80);
      CK(cudaMemcpy(dA, h.data(), size_t(M) * K * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dB, h.data(), size_t(N) * K * 2, cudaMemcpyHostToDevice));
    }
    std::vector<float> ones(size_t(std::max(M, N)) * K / 128 + 1024, 1.f);
    CK(cudaMemcpy(dsa, ones.data(), size_t(M) * K / 128 * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dsb, ones.data(), size_t(N) * K / 128 * 4, cudaMemcpyHostToDevice));
    double fl = 2.0 * M * N * K;
    Res b = run(CUDA_R_16BF, 0, 0, M, N, K, dA, dB, dD, nullptr, nullptr, true);
    Res o = run(CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, M, N, K, dA, dB, dD, dsa, dsb, true);
    Res v = run(CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, M, N, K, dA, dB, dD, dsa, dsb, true);
    Res bv = run(CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, M, N, K, dA, dB, dD, dsa, dsb, true);
    printf("M=%d N=%d K=%d: bf16 %.3f ms (%.0f TF/s)  fp8 outer %.3f (%.0f)  vec128x2 %.3f (%.0f)  blk x vec128 %.3f (%.0f)\n", M, N, K,
           b.ms, fl / b.ms / 1e9, o.ms, fl / o.ms / 1e9, v.ms, v.ok ? fl / v.ms / 1e9 : 0., bv.ms, bv.ok ? fl / bv.ms / 1e9 : 0.);
    cudaFree(dA); cudaFree(dB); cudaFree(dD); cudaFree(dsa); cudaFree(dsb);
  }
}
