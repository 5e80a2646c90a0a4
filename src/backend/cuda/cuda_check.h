// Error checking for CUDA runtime / cuBLAS calls, usable from .cu and .cpp files alike (no fmt here:
// the message is formatted in cuda_util.cpp). Every failing call throws sala::Error naming the call.
#pragma once
#include <cuda_runtime.h>

namespace sala::cuda {

[[noreturn]] void cuda_fail(const char* call, cudaError_t err, const char* file, int line);
[[noreturn]] void cublas_fail(const char* call, int status, const char* file, int line);
[[noreturn]] void cuda_fail_msg(const char* msg, const char* file, int line);

}  // namespace sala::cuda

#define SALA_CUDA_CHECK(call)                                                          \
  do {                                                                                 \
    cudaError_t sala_err_ = (call);                                                    \
    if (sala_err_ != cudaSuccess) ::sala::cuda::cuda_fail(#call, sala_err_, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch configuration error, if any.
#define SALA_CUDA_LAUNCH(name)                                                         \
  do {                                                                                 \
    cudaError_t sala_err_ = cudaGetLastError();                                        \
    if (sala_err_ != cudaSuccess) ::sala::cuda::cuda_fail(name, sala_err_, __FILE__, __LINE__); \
  } while (0)

#define SALA_CUDA_REQUIRE(cond, msg)                                                   \
  do {                                                                                 \
    if (!(cond)) ::sala::cuda::cuda_fail_msg(msg, __FILE__, __LINE__);                 \
  } while (0)
