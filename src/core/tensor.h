// Non-owning views of typed, row-major tensors in host memory (weights in an mmap, buffers, ...).
#pragma once
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sala {

using Shape = std::vector<int64_t>;

inline int64_t shape_numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}
std::string shape_str(const Shape& s);  // "[4096, 128]"

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  std::span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(data), nbytes()}; }
};

}  // namespace sala
