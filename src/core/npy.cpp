#include "core/npy.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace sala {

void write_npy(const std::filesystem::path& path, std::span<const float> data, const Shape& shape) {
  SALA_CHECK(shape_numel(shape) == int64_t(data.size()), "npy {}: {} values for shape {}", path.string(),
             data.size(), shape_str(shape));
  std::string dims;
  for (auto d : shape) dims += fmt::format("{}, ", d);
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  SALA_CHECK(out.good(), "cannot write {}", path.string());
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = uint16_t(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size() * 4));
  SALA_CHECK(out.good(), "error writing {}", path.string());
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  SALA_CHECK(in.good(), "cannot open {}", path.string());
  char magic[8];
  in.read(magic, 8);
  SALA_CHECK(in.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0, "{}: not an .npy file", path.string());
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    in.read(reinterpret_cast<char*>(&h16), 2);
    hlen = h16;
  } else {
    in.read(reinterpret_cast<char*>(&hlen), 4);
  }
  std::string header(hlen, '\0');
  in.read(header.data(), hlen);
  std::smatch m;
  SALA_CHECK(std::regex_search(header, m, std::regex("'descr':\\s*'([<|]?)([fi])(\\d)'")), "{}: bad npy header",
             path.string());
  const char kind = m[2].str()[0];
  const int size = std::stoi(m[3].str());
  SALA_CHECK(header.find("'fortran_order': False") != std::string::npos, "{}: fortran order unsupported",
             path.string());
  SALA_CHECK(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")), "{}: no shape", path.string());
  NpyArray arr;
  std::string dims = m[1].str();
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    arr.shape.push_back(std::stoll(it->str()));
  const size_t n = size_t(shape_numel(arr.shape));
  std::vector<char> raw(n * size_t(size));
  in.read(raw.data(), std::streamsize(raw.size()));
  SALA_CHECK(in.good(), "{}: truncated data", path.string());
  arr.data.resize(n);
  DType t = kind == 'f' ? (size == 4 ? DType::F32 : DType::F64) : (size == 4 ? DType::I32 : DType::I64);
  SALA_CHECK(size == 4 || size == 8, "{}: unsupported element size {}", path.string(), size);
  convert_to_f32(raw.data(), t, arr.data.data(), n);
  return arr;
}

}  // namespace sala
