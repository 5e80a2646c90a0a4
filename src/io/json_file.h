// Reading a whole JSON file (config.json, tokenizer.json) with errors that name the file.
#pragma once
#include <filesystem>

#include <nlohmann/json.hpp>

namespace sala {

// The parsed file; throws sala::Error naming the file when it cannot be read or is not valid JSON.
nlohmann::json read_json_file(const std::filesystem::path& file);

}  // namespace sala
