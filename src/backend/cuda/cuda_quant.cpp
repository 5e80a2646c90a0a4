// CUDA backend: packed weights (docs/quantization.md). Loading uploads the canonical codes and
// tiles them on the device (quant_layout.h), random packed weights are generated on the device,
// and matmul runs the packed decode GEMV for N ≤ 64 (q8/fp8) / 128 (q4) (quant_gemv.cu; matmul_group:
// one grouped launch for N ≤ 32) and, above, dequantizes row blocks into a fixed bf16 scratch that
// cuBLAS multiplies (prefill is compute bound: the extra pass costs ~2.6 bytes per weight against
// 2·N FLOPs per weight of tensor-core work).
#include <cublas_v2.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/quant_layout.h"
#include "core/error.h"

#define SALA_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                             \
    cublasStatus_t st_ = (call);                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS) ::sala::cuda::cublas_fail(#call, int(st_), __FILE__, __LINE__); \
  } while (0)

namespace sala {

namespace {

// Dequantized row blocks for cuBLAS. Allocated once at the first packed load and never grown, so
// its address stays fixed for CUDA graphs; 128 MiB holds a whole 16384×4096 or 4096×16384
// matrix, one GEMM each (32 MiB slabs: 4K prefill fp8 25615 → 29455 tok/s, int4 27396 → 29317,
// same H200; bench/results/2026-11-25-h200-quant-r2.md). SALA_CUDA_QSCRATCH_MIB (32–1024) sets
// another size: A/B runs of the prefill path.
constexpr size_t kQScratchBytes = size_t(128) << 20;
size_t qscratch_bytes() {
  static const size_t bytes = [] {
    const char* e = std::getenv("SALA_CUDA_QSCRATCH_MIB");
    const long mib = e ? std::atol(e) : 0;
    return mib >= 32 && mib <= 1024 ? size_t(mib) << 20 : kQScratchBytes;
  }();
  return bytes;
}

constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }

cuda::QWeight qweight(const Weight& w) {
  return {int(w.format), w.w.data, static_cast<const float*>(w.scales), w.out(), w.in(), w.group};
}

// What the tile layout and the GEMV need; checked at load with the tensor's name.
void check_packable(WeightFormat f, int64_t rows, int64_t cols, int64_t group, const std::string& name) {
  SALA_CHECK(cols % 4 == 0, "cuda: {}: packed {} weights need a multiple of 4 input columns (got {})", name,
             weight_format_name(f), cols);
  SALA_CHECK(group == cols || group % 16 == 0,
             "cuda: {}: {} group size {} is not a multiple of 16 (one mma step of the packed GEMV must lie in one "
             "group)",
             name, weight_format_name(f), group);
  SALA_CHECK(size_t(cols) * 2 * 16 <= qscratch_bytes() && rows < (int64_t(1) << 31),
             "cuda: {}: packed matrix [{}, {}] too large", name, rows, cols);
}

}  // namespace

Weight CudaBackend::alloc_packed(int fmt, int64_t rows, int64_t cols, int64_t group) {
  const qlayout::TileGeom geo{fmt, rows, cols, group};
  const size_t code_bytes = size_t(geo.code_bytes()), param_bytes = size_t(geo.param_floats()) * 4;
  Weight w;
  w.storage = alloc(align256(code_bytes) + param_bytes);
  auto* base = static_cast<uint8_t*>(w.storage->data());
  w.w = Mat{base, DType::U8, rows, cols};
  w.format = WeightFormat(fmt);
  w.group = group;
  w.scales = base + align256(code_bytes);
  w.packed_bytes = code_bytes + param_bytes;  // padding rows/columns included: a product reads them
  if (qscratch_.capacity() == 0) qscratch_.reserve(qscratch_bytes());
  return w;
}

Weight CudaBackend::load_quantized_weight(const QuantMatrixView& q, const std::string& name) {
  q.validate(name);
  check_packable(q.format, q.rows, q.cols, q.group, name);
  Weight w = alloc_packed(int(q.format), q.rows, q.cols, q.group);
  const qlayout::TileGeom geo{int(q.format), q.rows, q.cols, q.group};
  // Codes: the canonical rows go up as they are and are tiled on the device.
  auto staging = alloc(q.code_bytes());
  SALA_CUDA_CHECK(cudaMemcpyAsync(staging->data(), q.codes.data(), q.code_bytes(), cudaMemcpyHostToDevice, stream_));
  cuda::launch_qtile(qweight(w), staging->data(), w.w.data, stream_);
  // Scales and biases (rows × groups values): interleaved into float4 tiles on the host.
  std::vector<float> params(size_t(geo.param_floats()));
  qlayout::tile_params(geo, q.scales.data(), q.biases.empty() ? nullptr : q.biases.data(), params.data());
  SALA_CUDA_CHECK(cudaMemcpyAsync(w.scales, params.data(), params.size() * 4, cudaMemcpyHostToDevice, stream_));
  SALA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // staging and params are freed on return
  return w;
}

Weight CudaBackend::random_quantized_weight(WeightFormat format, int64_t rows, int64_t cols, int64_t group, float std,
                                            uint64_t seed) {
  SALA_CHECK(format != WeightFormat::Dense, "cuda random_quantized_weight: dense format");
  if (format == WeightFormat::FP8) group = cols;
  SALA_CHECK(group > 0 && cols % group == 0, "cuda random_quantized_weight: group {} does not divide {} columns", group,
             cols);
  check_packable(format, rows, cols, group, "random weight");
  Weight w = alloc_packed(int(format), rows, cols, group);
  float s, b;
  qlayout::random_params(int(format), std, &s, &b);
  cuda::launch_qrandom(qweight(w), w.w.data, static_cast<float*>(w.scales), s, b, seed, stream_);
  SALA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return w;
}

const void* CudaBackend::packed_input(const Mat& x) {
  SALA_CHECK(x.dtype == DType::BF16 || x.dtype == DType::F32 || x.dtype == DType::F16,
             "cuda matmul: input dtype {} unsupported", dtype_name(x.dtype));
  if (x.dtype == DType::BF16 && (reinterpret_cast<uintptr_t>(x.data) & 7) == 0) return x.data;
  // The kernels read bf16 rows with 8-byte loads: other inputs go through one bf16 copy.
  void* tmp = x_bf16_.reserve(size_t(x.rows * x.cols) * 2);
  const cuda::Dt dt = x.dtype == DType::F32 ? cuda::kF32 : x.dtype == DType::F16 ? cuda::kF16 : cuda::kBF16;
  cuda::launch_convert(x.data, dt, tmp, cuda::kBF16, x.rows * x.cols, stream_);
  return tmp;
}

// Warps per CTA of the decode GEMV: gemv_mode_ 2/3 pick 4/16 as for the bf16 GEMV; batch-invariant
// backends one fixed shape (8); otherwise automatic (0).
int CudaBackend::qgemv_warps() const { return batch_invariant_ ? 8 : gemv_mode_ == 2 ? 4 : gemv_mode_ == 3 ? 16 : 0; }

void CudaBackend::matmul_packed(const Mat& x, const Weight& w, Mat y) {
  SALA_CHECK(y.dtype == DType::BF16 || y.dtype == DType::F32, "cuda matmul: output dtype {} unsupported",
             dtype_name(y.dtype));
  const cuda::QWeight q = qweight(w);
  const int64_t N = x.rows, in = w.in(), out = w.out();
  const void* xb = packed_input(x);
  const cuda::Dt ydt = y.dtype == DType::BF16 ? cuda::kBF16 : cuda::kF32;
  const size_t ysize = dtype_size(y.dtype);
  // Decode GEMV, up to 32 rows per launch (each decoded weight feeds 4 n-tiles of 8). Beyond, more
  // launches re-read the packed bytes: worth it while their codes add up to no more than a bf16
  // weight (2 bytes): up to 128 rows of q4, 64 of q8/fp8 — still ≥ 2× fewer bytes than the
  // dequantize + cuBLAS path below (packed + 2 written + 2 read per weight).
  // Batch-invariant backends: one fixed launch shape (8 warps) in launches of ≤ 8 rows, up to 64 rows.
  const int64_t rows_per_launch = batch_invariant_ ? 8 : 32;
  const int64_t launches = (N + rows_per_launch - 1) / rows_per_launch;
  const double code_bytes = w.format == WeightFormat::Q4 ? 0.5 : 1.0;
  if (use_gemv_ && (batch_invariant_ ? N <= 64 : double(launches) * code_bytes <= 2.0)) {
    for (int64_t n0 = 0; n0 < N; n0 += rows_per_launch)
      cuda::launch_qgemv(q, static_cast<const uint8_t*>(xb) + size_t(n0 * in) * 2, in,
                         static_cast<uint8_t*>(y.data) + size_t(n0 * y.cols) * ysize, ydt, y.cols,
                         int(std::min<int64_t>(rows_per_launch, N - n0)), qgemv_warps(), pdl_ && props_.major >= 9,
                         stream_);
    return;
  }
  // Larger N: row blocks dequantized to bf16 [rows, in] in the fixed scratch, then cuBLAS writes
  // y[:, o0 : o0 + rows] (column-major view: yᵀ[o0 + r, n] at y + o0 with leading dimension y.cols).
  const int64_t block = std::max<int64_t>(16, int64_t(qscratch_.capacity() / (size_t(in) * 2)) / 16 * 16);
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t o0 = 0; o0 < out; o0 += block) {
    const int64_t rows = std::min(block, out - o0);
    cuda::launch_qdequant(q, o0, rows, qscratch_.data(), stream_);
    SALA_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(N), int(in), &alpha,
                                   qscratch_.data(), CUDA_R_16BF, int(in), xb, CUDA_R_16BF, int(in), &beta,
                                   static_cast<uint8_t*>(y.data) + size_t(o0) * ysize,
                                   y.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F, int(y.cols), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
  }
}

// The parts' weights share format, in and group, their outputs one dtype (bf16 or f32); N ≤ 32, not
// batch-invariant. The GEMV matmul_packed launches per part, in one grid (the automatic launch shape
// from all the parts' rows).
void CudaBackend::matmul_group_packed(const Mat& x, std::span<const MatmulPart> parts) {
  cuda::QGemvSet set{};
  set.count = int(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) set.part[i] = {qweight(*parts[i].w), parts[i].y.data, parts[i].y.cols};
  cuda::launch_qgemv_set(set, packed_input(x), x.cols, parts[0].y.dtype == DType::BF16 ? cuda::kBF16 : cuda::kF32,
                         int(x.rows), qgemv_warps(), pdl_ && props_.major >= 9, stream_);
}

// Packed gate and up at ≤ 8 rows: one launch with silu(g)·u in the epilogue (launch_qgemv_act; the
// shape the unfused pair takes above 8192 rows, so the 9B MLP gets the unfused values bit for bit).
// Otherwise — dense weights, more rows, batch-invariant or fixed-warp test modes, f32 buffers —
// the grouped GEMV and silu_mul.
void CudaBackend::matmul_silu_mul(const Mat& x, const Weight& gate, const Weight& up, Mat g, Mat u, Mat act) {
  const bool fused = use_gemv_ && !batch_invariant_ && gemv_mode_ == 0 && x.rows >= 1 && x.rows <= 8 &&
                     gate.packed() && up.packed() && gate.format == up.format && gate.group == up.group &&
                     gate.out() == up.out() && gate.in() == up.in() && x.cols == gate.in() &&
                     g.dtype == DType::BF16 && u.dtype == DType::BF16 && act.dtype == DType::BF16 &&
                     act.rows == x.rows && act.cols == gate.out();
  if (!fused) return Backend::matmul_silu_mul(x, gate, up, g, u, act);
  cuda::launch_qgemv_act(qweight(gate), qweight(up), packed_input(x), x.cols, act.data, act.cols, int(x.rows),
                         pdl_ && props_.major >= 9, stream_);
}

}  // namespace sala
