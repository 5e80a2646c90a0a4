#include "core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sala {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

}  // namespace sala
