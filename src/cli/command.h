// Subcommand registry of the `sala` tool: each cli/cmd_*.cpp registers one command with
// SALA_COMMAND(name, help, setup). setup adds the command's options to its CLI11 sub-app and
// returns the function that runs it (exit code). Errors thrown as sala::Error are printed as
// "error: ..." with exit code 1.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace sala::cli {

using Runner = std::function<int()>;
using Setup = std::function<Runner(CLI::App&)>;

struct CommandInfo {
  std::string name, help;
  Setup setup;
};

std::vector<CommandInfo>& registry();

struct Registrar {
  Registrar(std::string name, std::string help, Setup setup) {
    registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

#define SALA_COMMAND(name, help, setup) static ::sala::cli::Registrar sala_cmd_registrar_##name(#name, help, setup)

}  // namespace sala::cli
