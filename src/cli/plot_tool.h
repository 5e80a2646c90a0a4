// Running the plotting scripts in tools/ (matplotlib) from a subcommand. The interpreter is
// $SALA_PYTHON, else /usr/bin/python3 (Debian's, with python3-matplotlib from scripts/setup.sh);
// the scripts are found in $SALA_TOOLS_DIR, else the source tree's tools/.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace sala::cli {

std::string plot_python();
std::filesystem::path tools_dir();

// Throws sala::Error, naming the interpreter and what to install, when the interpreter is missing,
// cannot import matplotlib, or the script is absent. `who` prefixes the message ("bench --plot").
void check_plot_tool(const std::string& script, const std::string& who);

// Runs `python tools/<script> args...` (output passes through); throws when it fails.
void run_plot_tool(const std::string& script, const std::vector<std::string>& args, const std::string& who);

}  // namespace sala::cli
