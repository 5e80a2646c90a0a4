#include "io/json_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace sala {

nlohmann::json read_json_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot read '{}'", file.string());
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", file.string(), e.what());
  }
}

}  // namespace sala
