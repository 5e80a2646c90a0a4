// Errors answered to API clients as OpenAI error objects:
//   {"error": {"message": "...", "type": "...", "param": "..."|null, "code": "..."|null}}
// The type follows the status (OpenAI's names where it has them, llama.cpp's otherwise):
//   400 invalid_request_error, 401 authentication_error, 404 not_found_error,
//   429 rate_limit_error, 500 server_error, 503 unavailable_error.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace sala::server {

const char* error_type_for(int status);

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {})
      : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string param, code;  // empty: null
};

// 400 naming the offending request field.
template <typename... Args>
[[noreturn]] void bad_field(const std::string& param, fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, fmt::format(format, std::forward<Args>(args)...), param);
}

}  // namespace sala::server
