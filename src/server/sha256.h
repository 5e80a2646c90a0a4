// SHA-256 (FIPS 180-4), streaming, for verifying downloaded model files against the hub's LFS
// checksums without a crypto library dependency.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace sala::server {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex_digest();  // finishes; the object must not be updated afterwards

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view data);

}  // namespace sala::server
