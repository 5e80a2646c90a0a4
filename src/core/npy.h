// Minimal .npy reader/writer for float32 and int32 arrays (logits dumps and golden files).
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace sala {

struct NpyArray {
  Shape shape;
  std::vector<float> data;  // converted to f32 (from <f4, <f8, <i4, <i8)
};

void write_npy(const std::filesystem::path& path, std::span<const float> data, const Shape& shape);
NpyArray read_npy(const std::filesystem::path& path);

}  // namespace sala
