// CUDA backend: packed weights (docs/quantization.md). Loading uploads the canonical codes and
// tiles them on the device (quant_layout.h), random packed weights are generated on the device,
// and matmul runs the packed decode GEMV for N ≤ 32 (quant_gemv.cu; matmul_group: one grouped
// launch); on Hopper, for 33–256 rows of matrices whose tiles fill the GPU (257–512 of 8-bit
// 64M-weight ones), the GEMM that decodes the codes in its load path (quant_gemm.cu); the GEMV in
// two launches for other products of ≤ 64 rows; above, row blocks dequantized into a fixed bf16
// scratch that cuBLAS multiplies. With --fp8-prefill / --int8-prefill, per-row FP8 / Q8 and Q4
// weights multiply prefill rows in fp8 / int8 instead (cuBLASLt, activations quantized per row:
// W8A8; Q4 and grouped Q8 rows requantized per row to int8).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/w8a8_gemm.h"
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

// Rows a packed product takes on the decode GEMV: one launch of up to 32; up to two (64 rows)
// where the fused GEMM does not take the product (see matmul_packed).
constexpr int64_t kPackedGemvLaunchRows = 32, kPackedGemvMaxRows = 64;

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
  // The decode GEMV has compiled paths for groups of whole tiles and int4's half tiles; other
  // groups run its generic kernel, which is correct but slower: said once rather than silently.
  const int kt = qlayout::tile_k(int(f));
  if (group != cols && qlayout::tile_groups(int(f), group) == 0) {
    static std::once_flag noted;
    std::call_once(noted, [&] {
      std::fprintf(stderr,
                   "note: cuda: %s: %s in groups of %lld columns decodes on the generic grouped kernel (the fast "
                   "ones take groups of a multiple of %d columns%s): expect slower decode\n",
                   name.c_str(), weight_format_name(f), (long long)group, kt,
                   f == WeightFormat::Q4 ? ", or 32" : "");
    });
  }
}

}  // namespace

cuda::QWeight CudaBackend::qweight(const Weight& w) {
  return {int(w.format), w.w.data, w.scales, w.out(), w.in(), w.group, int(w.q8_symmetric), int(w.zero_packed)};
}

// Grouped int4 whose biases are −s·z takes the zero-packed parameter form (quant_layout.h: 4 bytes
// per entry instead of 8, the same products). SALA_CUDA_ZPACK=0 keeps the 8-byte form (A/B runs);
// cuda::set_zero_pack for tests.
static bool g_zero_pack = [] {
  const char* e = std::getenv("SALA_CUDA_ZPACK");
  return !(e && std::string(e) == "0");
}();
void cuda::set_zero_pack(bool on) { g_zero_pack = on; }

Weight CudaBackend::alloc_packed(int fmt, int64_t rows, int64_t cols, int64_t group, bool zpack) {
  const qlayout::TileGeom geo{fmt, rows, cols, group, zpack};
  const size_t code_bytes = size_t(geo.code_bytes()), param_bytes = size_t(geo.param_bytes());
  // Weights --int8-prefill requantizes keep their int8 row scales after the parameters (4 bytes a
  // row; filled by finish_packed once the codes and parameters are in place).
  const bool requantized = fmt == qlayout::kQ4 || (fmt == qlayout::kQ8 && group < cols);
  Weight w;
  w.storage = alloc(align256(code_bytes) + align256(param_bytes) + (requantized ? size_t(rows) * 4 : 0));
  auto* base = static_cast<uint8_t*>(w.storage->data());
  w.w = Mat{base, DType::U8, rows, cols};
  w.format = WeightFormat(fmt);
  w.group = group;
  w.scales = base + align256(code_bytes);
  if (requantized) w.int8_row_scales = base + align256(code_bytes) + align256(param_bytes);
  w.zero_packed = zpack;
  w.packed_bytes = code_bytes + param_bytes;  // padding rows/columns included: a product reads them
  if (qscratch_.capacity() == 0) qscratch_.reserve(qscratch_bytes());
  cuda::qgemm_available();  // probed here, outside any graph capture
  return w;
}

void CudaBackend::finish_packed(const Weight& w) {
  if (w.int8_row_scales) cuda::launch_qrow_int8_scales(qweight(w), static_cast<float*>(w.int8_row_scales), stream_);
}

Weight CudaBackend::load_quantized_weight(const QuantMatrixView& q, const std::string& name) {
  q.validate(name);
  check_packable(q.format, q.rows, q.cols, q.group, name);
  const bool zpack = g_zero_pack && q.group < q.cols &&
                     qlayout::zero_pack_fits(int(q.format), int64_t(q.scales.size()), q.scales.data(),
                                             q.biases.empty() ? nullptr : q.biases.data());
  Weight w = alloc_packed(int(q.format), q.rows, q.cols, q.group, zpack);
  const qlayout::TileGeom geo{int(q.format), q.rows, q.cols, q.group, zpack};
  // Codes: the canonical rows go up as they are and are tiled on the device.
  auto staging = alloc(q.code_bytes());
  SALA_CUDA_CHECK(cudaMemcpyAsync(staging->data(), q.codes.data(), q.code_bytes(), cudaMemcpyHostToDevice, stream_));
  cuda::launch_qtile(qweight(w), staging->data(), w.w.data, stream_);
  // Scales and biases (rows × groups values): interleaved into their tiles on the host.
  std::vector<uint8_t> params(size_t(geo.param_bytes()));
  qlayout::tile_params(geo, q.scales.data(), q.biases.empty() ? nullptr : q.biases.data(), params.data());
  SALA_CUDA_CHECK(cudaMemcpyAsync(w.scales, params.data(), params.size(), cudaMemcpyHostToDevice, stream_));
  finish_packed(w);
  SALA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // staging and params are freed on return
  w.q8_symmetric = q.format == WeightFormat::Q8 && q.group == q.cols && q.biases.size() == q.scales.size() &&
                   std::equal(q.biases.begin(), q.biases.end(), q.scales.begin(),
                              [](float b, float s) { return b == -128.f * s; });
  return w;
}

Weight CudaBackend::random_quantized_weight(WeightFormat format, int64_t rows, int64_t cols, int64_t group, float std,
                                            uint64_t seed) {
  SALA_CHECK(format != WeightFormat::Dense, "cuda random_quantized_weight: dense format");
  if (format == WeightFormat::FP8) group = cols;
  SALA_CHECK(group > 0 && cols % group == 0, "cuda random_quantized_weight: group {} does not divide {} columns", group,
             cols);
  check_packable(format, rows, cols, group, "random weight");
  // Random int4 groups have integer zero points (launch_qrandom): zero-packed like a quantized checkpoint's.
  Weight w = alloc_packed(int(format), rows, cols, group,
                          g_zero_pack && format == WeightFormat::Q4 && group < cols);
  float s, b;
  qlayout::random_params(int(format), std, &s, &b);
  w.q8_symmetric = format == WeightFormat::Q8 && group == cols && b == -128.f * s;  // each row scales both by f
  cuda::launch_qrandom(qweight(w), w.w.data, w.scales, s, b, seed, stream_);
  finish_packed(w);
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

float* CudaBackend::qsplit_workspace(int64_t n, int64_t rows, size_t* floats) {
  *floats = 0;
  if (n <= 8 || n > 32 || rows >= cuda::kQSplitMaxRows || batch_invariant_) return nullptr;
  *floats = size_t(cuda::kQSplitWays) * size_t(n) * size_t(rows);
  return static_cast<float*>(qsplit_.reserve(*floats * 4));
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
  // Batch-invariant backends: one fixed launch shape (8 warps) in launches of ≤ 8 rows, up to 64 rows.
  const int64_t rows_per_launch = batch_invariant_ ? 8 : 32;
  if (const W8A8Path path = w8a8_path(w, N, y); path != W8A8Path::None)
    return matmul_w8a8(quantize_rows(xb, N, in, path), w, y);
  // The GEMM that decodes the codes in its load path (quant_gemm.cu), where it is the faster path:
  // 33–256 rows of matrices whose tiles fill the GPU, 257–512 of 8-bit 64M-weight ones
  // (qgemm_preferred). The decode GEMV takes up to 32 rows per launch (each decoded weight feeds 4
  // n-tiles of 8) and is bound by its instructions, so a second launch (33–64 rows) costs as much
  // again: H100, 64 rows, fp8 4096×4096 39.5 µs on two GEMV launches against 19.9 for the fused
  // GEMM's 64-token tile, 16384×4096 85.7 against 53.6; at 32 rows the one GEMV launch is as fast or
  // faster (bench/results/2026-11-25-h100-qgemm-split.md).
  // A shape or build the GEMM cannot take says why, once, and keeps the GEMV (≤ 64 rows) or the
  // dequantize path.
  const bool gemv_fits = use_gemv_ && N <= kPackedGemvMaxRows;
  const bool fused = !(gemv_fits && (N <= kPackedGemvLaunchRows || batch_invariant_)) && cuda::qgemm_preferred(q, int(N));
  if (fused) {
    const std::string unfit = cuda::qgemm_unfit(q, xb, in);
    if (unfit.empty()) {
      const size_t split_floats = cuda::qgemm_split_floats(q, int(N));  // 4096-row matrices: K split
      float* ws = split_floats ? static_cast<float*>(qgemm_split_.reserve(split_floats * 4)) : nullptr;
      return cuda::launch_qgemm(q, xb, in, y.data, ydt, y.cols, int(N), stream_, ws);
    }
    static std::once_flag qgemm_warned;
    std::call_once(qgemm_warned, [&] {
      std::fprintf(stderr, "note: packed products of %lld rows: %s; they take the %s instead\n", (long long)N,
                   unfit.c_str(), gemv_fits ? "decode GEMV" : "dequantize + cuBLAS path");
    });
  }
  if (gemv_fits) {
    size_t ws_floats = 0;
    float* ws = qsplit_workspace(std::min(N, rows_per_launch), out, &ws_floats);
    for (int64_t n0 = 0; n0 < N; n0 += rows_per_launch)
      cuda::launch_qgemv(q, static_cast<const uint8_t*>(xb) + size_t(n0 * in) * 2, in,
                         static_cast<uint8_t*>(y.data) + size_t(n0 * y.cols) * ysize, ydt, y.cols,
                         int(std::min<int64_t>(rows_per_launch, N - n0)), qgemv_warps(), pdl_ && props_.major >= 9,
                         stream_, ws, ws_floats);
    return;
  }
  // Otherwise: row blocks dequantized to bf16 [rows, in] in the fixed scratch, then cuBLAS writes
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

void CudaBackend::set_fp8_prefill(bool on) {
  if (on) {
    SALA_CHECK(native_fp8(),
               "--fp8-prefill: fp8 tensor cores need compute capability 8.9 or newer; {} has {}.{}", props_.name,
               props_.major, props_.minor);
    if (!cublas_lt_) SALA_CUBLAS_CHECK(cublasLtCreate(&cublas_lt_));
  }
  fp8_prefill_ = on;
}

std::string CudaBackend::fp8_prefill_unfit(const Weight& w, const Mat& y) const {
  if (w.group != w.in()) return fmt::format("an FP8 weight with {} scales per row", w.in() / w.group);
  // cuBLASLt's fp8 operands: leading dimensions multiples of 16 bytes, D of 16 bytes.
  if (w.in() % 16 != 0) return fmt::format("{} input columns are not a multiple of 16", w.in());
  if (w.in() > cuda::kQuantRowsMaxIn)
    return fmt::format("{} input columns exceed the {} of the activation quantizer", w.in(), cuda::kQuantRowsMaxIn);
  if ((y.cols * int64_t(dtype_size(y.dtype))) % 16 != 0 || (reinterpret_cast<uintptr_t>(y.data) & 15) != 0)
    return fmt::format("an output of {} columns ({}) is not 16-byte aligned", y.cols, dtype_name(y.dtype));
  if (size_t(w.in()) * 16 + 256 + 64 > qscratch_.capacity())
    return fmt::format("a row block of {} columns does not fit the {} MiB scratch", w.in(), qscratch_.capacity() >> 20);
  return {};
}

void CudaBackend::set_int8_prefill(bool on) {
  if (on && !cublas_lt_) SALA_CUBLAS_CHECK(cublasLtCreate(&cublas_lt_));
  int8_prefill_ = on;
}

// Bytes of qscratch_ per weight row of a block: the int8 codes, scale and offset.
static size_t int8_block_row_bytes(const Weight& w) { return size_t(w.in()) + 8; }

std::string CudaBackend::int8_prefill_unfit(const Weight& w, const Mat& y) const {
  // cuBLASLt's int8 operands: leading dimensions multiples of 16 bytes.
  if (w.in() % 16 != 0) return fmt::format("{} input columns are not a multiple of 16", w.in());
  if (y.dtype != DType::BF16 && y.dtype != DType::F32) return fmt::format("an output of dtype {}", dtype_name(y.dtype));
  if (w.in() > cuda::kQuantRowsMaxIn)
    return fmt::format("{} input columns exceed the {} of the activation quantizer", w.in(), cuda::kQuantRowsMaxIn);
  if (!(w.format == WeightFormat::Q8 && w.group == w.in()) && !w.int8_row_scales)
    return "the weight has no int8 row scales to requantize with (not loaded by this backend)";
  if (int8_block_row_bytes(w) * 16 + 1024 > qscratch_.capacity())
    return fmt::format("a row block of {} columns does not fit the {} MiB scratch", w.in(), qscratch_.capacity() >> 20);
  return {};
}

namespace {

// cuBLASLt descriptors, destroyed with the scope.
struct LtDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* p) const { cublasLtMatmulDescDestroy(p); }
  void operator()(cublasLtMatrixLayoutOpaque_t* p) const { cublasLtMatrixLayoutDestroy(p); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
template <typename T>
using LtPtr = std::unique_ptr<std::remove_pointer_t<T>, LtDeleter>;

LtPtr<cublasLtMatrixLayout_t> lt_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  SALA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, uint64_t(rows), uint64_t(cols), ld));
  return LtPtr<cublasLtMatrixLayout_t>(l);
}

template <typename V>
void lt_set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  SALA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
}

// A matmul descriptor of D[rows, N] = Aᵀ·B (A: weight rows, K × rows; B: activations, K × N).
LtPtr<cublasLtMatmulDesc_t> lt_tn_desc(cublasComputeType_t compute, cudaDataType_t scale) {
  cublasLtMatmulDesc_t d = nullptr;
  SALA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, compute, scale));
  LtPtr<cublasLtMatmulDesc_t> desc(d);
  lt_set(d, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  lt_set(d, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  return desc;
}

// Algorithms that fit the backend's cuBLAS workspace.
LtPtr<cublasLtMatmulPreference_t> lt_preference() {
  cublasLtMatmulPreference_t p = nullptr;
  SALA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p));
  LtPtr<cublasLtMatmulPreference_t> pref(p);
  const uint64_t ws_bytes = kCublasWorkspace;
  SALA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                         sizeof ws_bytes));
  return pref;
}

// A W8A8 product taken in blocks of weight rows, D[rows, N] = Aᵀ·B with B the quantized
// activations [K = in, N]: a block's layouts and cuBLASLt's first algorithm for them (D written
// in place of C), queried again only when the block height changes (a last, shorter block).
class LtBlockPlan {
 public:
  LtBlockPlan(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cudaDataType_t ab_type, cudaDataType_t d_type,
              int64_t in, int64_t N)
      : lt_(lt), desc_(desc), ab_type_(ab_type), d_type_(d_type), in_(in), N_(N),
        lb_(lt_layout(ab_type, in, N, in)), pref_(lt_preference()) {}
  // A block of `rows` weight rows, D's leading dimension ldd; false when cuBLASLt has no algorithm.
  bool plan(int64_t rows, int64_t ldd) {
    if (rows == rows_ && ldd == ldd_) return true;
    la_ = lt_layout(ab_type_, in_, rows, in_);
    ld_ = lt_layout(d_type_, rows, N_, ldd);
    int found = 0;
    SALA_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, desc_, la_.get(), lb_.get(), ld_.get(), ld_.get(),
                                                     pref_.get(), 1, &heur_, &found));
    rows_ = found > 0 ? rows : 0;
    ldd_ = ldd;
    return found > 0;
  }
  // D = alpha·Aᵀ·B + beta·D for the block last planned.
  void run(const void* alpha, const void* a, const void* b, const void* beta, void* d, void* ws, size_t ws_bytes,
           cudaStream_t st) const {
    SALA_CUBLAS_CHECK(cublasLtMatmul(lt_, desc_, alpha, a, la_.get(), b, lb_.get(), beta, d, ld_.get(), d, ld_.get(),
                                     &heur_.algo, ws, ws_bytes, st));
  }

 private:
  cublasLtHandle_t lt_;
  cublasLtMatmulDesc_t desc_;
  cudaDataType_t ab_type_, d_type_;
  int64_t in_, N_;
  LtPtr<cublasLtMatrixLayout_t> lb_;
  LtPtr<cublasLtMatmulPreference_t> pref_;
  LtPtr<cublasLtMatrixLayout_t> la_, ld_;
  cublasLtMatmulHeuristicResult_t heur_{};
  int64_t rows_ = 0, ldd_ = 0;
};

}  // namespace

// Which W8A8 product (--fp8-prefill, --int8-prefill) takes x [N, in] · wᵀ -> y, if any. A product
// the switched-on option cannot take says why, once, and stays weight-only.
CudaBackend::W8A8Path CudaBackend::w8a8_path(const Weight& w, int64_t N, const Mat& y) const {
  if (N < kW8A8PrefillMinRows) return W8A8Path::None;
  const bool int8 = int8_prefill_ && (w.format == WeightFormat::Q8 || w.format == WeightFormat::Q4);
  const bool fp8 = fp8_prefill_ && w.format == WeightFormat::FP8;
  if (!int8 && !fp8) return W8A8Path::None;
  const std::string unfit = int8 ? int8_prefill_unfit(w, y) : fp8_prefill_unfit(w, y);
  if (unfit.empty()) return int8 ? W8A8Path::Int8 : W8A8Path::Fp8;
  static std::once_flag warned_int8, warned_fp8;
  std::call_once(int8 ? warned_int8 : warned_fp8, [&] {
    std::fprintf(stderr, "warning: %s: %s; such products stay weight-only (bf16 activations)\n",
                 int8 ? "--int8-prefill" : "--fp8-prefill", unfit.c_str());
  });
  return W8A8Path::None;
}

// The activation rows of a W8A8 product in fp8x_: e4m3 or int8 codes, their scales and (int8)
// s·Σq. Valid until the next quantization: the parts of a group share one (matmul_group).
CudaBackend::QuantizedRows CudaBackend::quantize_rows(const void* xb, int64_t N, int64_t in, W8A8Path path) {
  const size_t codes = align256(size_t(N * in)), floats = align256(size_t(N) * 4);
  auto* q = static_cast<uint8_t*>(fp8x_.reserve(codes + 2 * floats));
  auto* scales = reinterpret_cast<float*>(q + codes);
  auto* sums = reinterpret_cast<float*>(q + codes + floats);
  if (path == W8A8Path::Fp8) cuda::launch_quant_rows_fp8(xb, in, N, in, q, scales, stream_);
  else cuda::launch_quant_rows_int8(xb, in, N, in, q, scales, sums, stream_);
  return {q, scales, sums, N, path};
}

void CudaBackend::matmul_w8a8(const QuantizedRows& xq, const Weight& w, Mat y) {
  if (xq.path == W8A8Path::Fp8) matmul_fp8_activations(xq, w, y);
  else matmul_int8_activations(xq, w, y);
}

// y = (x quantized per row to e4m3) · (W's e4m3 codes)ᵀ scaled by s_x[n]·s_w[o] (cuBLASLt outer-
// vector scales, fp32 accumulation). In cuBLASLt's column-major terms: D[rows, N] = Aᵀ·B with A
// the weight rows (K × rows, ld in) and B the quantized x (K × N), so the A scales are the weight's
// per-row scales and the B scales the activations'. Row blocks of W are copied out of the GEMV
// tile layout into qscratch_ (1 byte per weight, with the block's scales after the codes).
void CudaBackend::matmul_fp8_activations(const QuantizedRows& xq, const Weight& w, Mat y) {
  const int64_t in = w.in(), out = w.out(), N = xq.n;
  const int64_t block = std::min<int64_t>(out, int64_t((qscratch_.capacity() - 256) / size_t(in + 4)) / 16 * 16);
  auto* wq = static_cast<uint8_t*>(qscratch_.data());
  float* ws = reinterpret_cast<float*>(wq + align256(size_t(block * in)));

  const LtPtr<cublasLtMatmulDesc_t> desc = lt_tn_desc(CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  lt_set(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_MODE, outer);
  lt_set(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_MODE, outer);
  lt_set(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(ws));
  lt_set(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(xq.scales));
  LtBlockPlan plan(cublas_lt_, desc.get(), CUDA_R_8F_E4M3, y.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F, in, N);
  const float alpha = 1.f, beta = 0.f;
  for (int64_t o0 = 0; o0 < out; o0 += block) {
    const int64_t rows = std::min(block, out - o0);
    cuda::launch_qcanonical(qweight(w), o0, rows, wq, ws, nullptr, stream_);
    SALA_CHECK(plan.plan(rows, y.cols), "--fp8-prefill: cuBLASLt has no fp8 GEMM for [{}, {}] x [{}, {}] -> {} on {}",
               N, in, rows, in, dtype_name(y.dtype), props_.name);
    plan.run(&alpha, wq, xq.codes, &beta, static_cast<uint8_t*>(y.data) + size_t(o0) * dtype_size(y.dtype), cublas_ws_,
             kCublasWorkspace, stream_);
  }
}

// y = fma(c_w, s_x·Σq_x, (acc·s_w)·s_x) with acc = Σ_k q_x·q_w exact in int32. The weight rows as
// int8: per-row Q8 exactly (code − 128, c_w = 128·s + b); Q4 and grouped Q8 requantized — the bf16
// rows the weight-only path multiplies, quantized per row like the activations (c_w = 0; one pass,
// qrequant_int8_kernel). Where it runs (sm_90a, in % 128 == 0), this backend's GEMM (w8a8_gemm.cu)
// reads per-row Q8 tiles as they are and requantized rows written in the same tile layout, and
// scales in its epilogue. Otherwise cuBLASLt's int8 GEMM (it has no float output with per-row and
// per-token scales: bench/results/2026-11-27-cublaslt-int8-probe.md), on row-major copies, with the
// int32 products through int8acc_ and one epilogue pass (w8a8_prefill.cu) — the same bits. In
// cuBLASLt's column-major terms: D[rows, N] = Aᵀ·B, A the weight block's rows (K × rows, ld in), B
// the quantized x. Blocks are bounded by the weight scratch (and for cuBLASLt by kInt8AccBytes of
// int32 products).
void CudaBackend::matmul_int8_activations(const QuantizedRows& xq, const Weight& w, Mat y) {
  constexpr size_t kInt8AccBytes = size_t(128) << 20;
  const int64_t in = w.in(), out = w.out(), N = xq.n;
  const bool exact = w.format == WeightFormat::Q8 && w.group == in;
  const cuda::Dt ydt = y.dtype == DType::BF16 ? cuda::kBF16 : cuda::kF32;
  const std::string unfit = cuda::w8a8_gemm_unfit(in, xq.codes, N);
  const bool own = unfit.empty();
  if (exact && own)  // the weight's own tiles, whole
    return cuda::launch_w8a8_gemm(cuda::w8a8_weight(qweight(w)), xq.codes, N, xq.scales, xq.sums, y.data, ydt, y.cols,
                                  stream_);
  if (!own) {
    static std::once_flag noted;
    std::call_once(noted, [&] {
      std::fprintf(stderr, "note: --int8-prefill: products go through cuBLASLt's int8 GEMM and an int32 epilogue "
                           "pass, not this backend's own GEMM (%s)\n", unfit.c_str());
    });
  }

  // (The tile layout takes whole row blocks: a block's codes span its rows rounded up to 16.)
  int64_t block = std::min<int64_t>((out + 15) / 16 * 16,
                                    int64_t((qscratch_.capacity() - 1024) / int8_block_row_bytes(w)) / 16 * 16);
  if (!own) block = std::max<int64_t>(16, std::min<int64_t>(block, int64_t(kInt8AccBytes / (size_t(N) * 4)) / 16 * 16));
  auto* wq = static_cast<uint8_t*>(qscratch_.data());
  float* ws = reinterpret_cast<float*>(wq + align256(size_t(block * in)));
  float* wc = ws + align256(size_t(block) * 4) / 4;
  auto y_at = [&](int64_t o0) { return static_cast<uint8_t*>(y.data) + size_t(o0) * dtype_size(y.dtype); };
  if (own) {  // requantized blocks in the tile layout
    for (int64_t o0 = 0; o0 < out; o0 += block) {
      const int64_t rows = std::min(block, out - o0);
      cuda::launch_qrequant_int8(qweight(w), static_cast<const float*>(w.int8_row_scales), o0, rows, wq, ws, wc, true,
                                 stream_);
      cuda::launch_w8a8_gemm({wq, rows, in, nullptr, ws}, xq.codes, N, xq.scales, xq.sums, y_at(o0), ydt, y.cols,
                             stream_);
    }
    return;
  }
  auto* acc = static_cast<int32_t*>(int8acc_.reserve(size_t(block * N) * 4));
  const LtPtr<cublasLtMatmulDesc_t> desc = lt_tn_desc(CUBLAS_COMPUTE_32I, CUDA_R_32I);
  LtBlockPlan plan(cublas_lt_, desc.get(), CUDA_R_8I, CUDA_R_32I, in, N);
  const int32_t alpha = 1, beta = 0;
  for (int64_t o0 = 0; o0 < out; o0 += block) {
    const int64_t rows = std::min(block, out - o0);
    if (exact) cuda::launch_qcanonical(qweight(w), o0, rows, wq, ws, wc, stream_);
    else
      cuda::launch_qrequant_int8(qweight(w), static_cast<const float*>(w.int8_row_scales), o0, rows, wq, ws, wc, false,
                                 stream_);
    SALA_CHECK(plan.plan(rows, rows), "--int8-prefill: cuBLASLt has no int8 GEMM for [{}, {}] x [{}, {}] on {}", N,
               in, rows, in, props_.name);
    plan.run(&alpha, wq, xq.codes, &beta, acc, cublas_ws_, kCublasWorkspace, stream_);
    cuda::launch_int8_epilogue(acc, rows, N, ws, wc, xq.scales, xq.sums, y_at(o0), ydt, y.cols, stream_);
  }
}

// The parts' weights share format, in and group, their outputs one dtype (bf16 or f32); N ≤ 32, not
// batch-invariant. The GEMV matmul_packed launches per part, in one grid (the automatic launch shape
// from all the parts' rows).
void CudaBackend::matmul_group_packed(const Mat& x, std::span<const MatmulPart> parts) {
  cuda::QGemvSet set{};
  set.count = int(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) set.part[i] = {qweight(*parts[i].w), parts[i].y.data, parts[i].y.cols};
  int64_t rows = 0;
  for (const MatmulPart& p : parts) rows += p.w->out();
  size_t ws_floats = 0;
  float* ws = qsplit_workspace(x.rows, rows, &ws_floats);
  cuda::launch_qgemv_set(set, packed_input(x), x.cols, parts[0].y.dtype == DType::BF16 ? cuda::kBF16 : cuda::kF32,
                         int(x.rows), qgemv_warps(), pdl_ && props_.major >= 9, stream_, ws, ws_floats);
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
