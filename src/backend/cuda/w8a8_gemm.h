// --int8-prefill's own GEMM (w8a8_gemm.cu), host side.
#pragma once
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace sala::cuda {

// The weight side: int8 codes in the 8-bit tile layout (quant_layout.h) of an [out, in] matrix —
// either a per-row Q8 weight's own (code − 128, with its {s, b} parameter tiles: s_w = s, c_w =
// 128·s + b) or rows launch_qrequant_int8 wrote in that layout (signed codes, s_w = scales[o], c_w = 0).
struct W8A8Weight {
  const void* codes;
  int64_t out, in;
  const void* q8_params = nullptr;  // per-row Q8: the weight's float4 parameter tiles
  const float* scales = nullptr;    // requantized rows: one scale per row
};
W8A8Weight w8a8_weight(const QWeight& q8);  // a per-row Q8 weight as it is

// y[n, o] = fma(c_w[o], (s·Σq)_n, (acc·s_w[o])·s_n) with acc = Σ_k q_x[n, k]·q_w[o, k] exact in
// int32: the values of cuBLASLt's int8 GEMM followed by launch_int8_epilogue, bit for bit, without
// the int32 products' round trip through memory or the weights' row-major copy. xq: int8 [N, in]
// rows with their scales sx and scaled sums sxsum (launch_quant_rows_int8); y: bf16 or f32 rows of
// stride ldy.
void launch_w8a8_gemm(const W8A8Weight& w, const void* xq, int64_t N, const float* sx, const float* sxsum, void* y,
                      Dt dty, int64_t ldy, cudaStream_t st);
// Why launch_w8a8_gemm cannot take a product of input width `in` (empty: it can): the build, the
// driver, the shapes. SALA_CUDA_W8A8_GEMM=0 turns it off (A/B runs): it then says so.
std::string w8a8_gemm_unfit(int64_t in, const void* xq, int64_t N);
void set_w8a8_gemm(bool on);  // tests: the same switch as SALA_CUDA_W8A8_GEMM

}  // namespace sala::cuda
