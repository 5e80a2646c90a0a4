// `sala`: the command-line front end. Each subcommand lives in its own cli/cmd_*.cpp.
#include <algorithm>
#include <cstdio>
#include <map>

#include "cli/command.h"
#include "core/error.h"

namespace sala::cli {
std::vector<CommandInfo>& registry() {
  static std::vector<CommandInfo> commands;
  return commands;
}
}  // namespace sala::cli

int main(int argc, char** argv) {
  using namespace sala::cli;
  CLI::App app{"sala: inference engine for MiniCPM-SALA"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "sala 0.1.0");
  auto& commands = registry();
  std::sort(commands.begin(), commands.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::map<CLI::App*, Runner> runners;
  for (auto& c : commands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const sala::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
