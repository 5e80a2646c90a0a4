// Named model shapes for `sala init` and `sala bench --random`: tiny (tests), small (demos), and
// 9b (exactly the published MiniCPM-SALA config).
#pragma once
#include <string>
#include <vector>

#include "model/config.h"

namespace sala {

ModelConfig preset_config(const std::string& name);  // throws on an unknown name
std::vector<std::string> preset_names();

}  // namespace sala
