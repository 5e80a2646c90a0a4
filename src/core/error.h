// Errors: one exception type, thrown with context at the boundaries (file, field, value).
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace sala {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws sala::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

#define SALA_CHECK(cond, ...)                 \
  do {                                        \
    if (!(cond)) ::sala::fail(__VA_ARGS__);   \
  } while (0)

}  // namespace sala
