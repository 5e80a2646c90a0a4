// --int8-prefill's own GEMM for per-row int8 weights (w8a8_gemm.cu), host side.
#pragma once
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace sala::cuda {

// y[n, o] = fma(c_w[o], (s·Σq)_n, (acc·s_w[o])·s_n) with acc = Σ_k q_x[n, k]·(code[o, k] − 128)
// exact in int32, s_w and c_w = 128·s_w + b_w the weight row's scale and offset: the values of
// cuBLASLt's int8 GEMM followed by launch_int8_epilogue, bit for bit, without the int32 products'
// round trip through memory or the weights' row-major copy. xq: int8 [N, in] rows with their scales
// sx and scaled sums sxsum (launch_quant_rows_int8); w: a per-row Q8 weight in the tile layout;
// y: bf16 or f32 rows of stride ldy.
void launch_w8a8_gemm(const QWeight& w, const void* xq, int64_t N, const float* sx, const float* sxsum, void* y, Dt dty,
                      int64_t ldy, cudaStream_t st);
// Why launch_w8a8_gemm cannot take this product (empty: it can): the build, the driver, the weight's
// format or the shapes. SALA_CUDA_W8A8_GEMM=0 turns it off (A/B runs): it then says so.
std::string w8a8_gemm_unfit(const QWeight& w, const void* xq, int64_t N);
void set_w8a8_gemm(bool on);  // tests: the same switch as SALA_CUDA_W8A8_GEMM

}  // namespace sala::cuda
