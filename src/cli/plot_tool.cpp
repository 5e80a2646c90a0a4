#include "cli/plot_tool.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace sala::cli {

namespace fs = std::filesystem;

std::string plot_python() {
  if (const char* p = std::getenv("SALA_PYTHON"); p && *p) return p;
  return "/usr/bin/python3";
}

fs::path tools_dir() {
  if (const char* d = std::getenv("SALA_TOOLS_DIR"); d && *d) return d;
  return fs::path(SALA_SOURCE_DIR) / "tools";
}

namespace {

// fork + execv; returns the exit status (127 when the program could not be started).
int run(const std::vector<std::string>& argv, bool quiet) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(nullptr);  // our buffered output first
  const pid_t pid = ::fork();
  SALA_CHECK(pid >= 0, "fork failed while starting {}", argv[0]);
  if (pid == 0) {
    if (quiet) {
      const int null = ::open("/dev/null", O_WRONLY);
      if (null >= 0) ::dup2(null, STDOUT_FILENO), ::dup2(null, STDERR_FILENO);
    }
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

constexpr const char* kInstall =
    "install Debian's python3-matplotlib (`sudo apt-get install -y python3-matplotlib`, or scripts/setup.sh), "
    "or set SALA_PYTHON to a python that has matplotlib";

}  // namespace

void check_plot_tool(const std::string& script, const std::string& who) {
  const std::string py = plot_python();
  SALA_CHECK(::access(py.c_str(), X_OK) == 0, "{}: python interpreter '{}' not found or not executable; {}", who, py,
             kInstall);
  SALA_CHECK(run({py, "-c", "import matplotlib"}, true) == 0, "{}: '{}' cannot import matplotlib; {}", who, py,
             kInstall);
  const fs::path path = tools_dir() / script;
  SALA_CHECK(fs::exists(path), "{}: plotting script '{}' not found (set SALA_TOOLS_DIR to the repository's tools/)",
             who, path.string());
}

void run_plot_tool(const std::string& script, const std::vector<std::string>& args, const std::string& who) {
  check_plot_tool(script, who);
  std::vector<std::string> argv = {plot_python(), (tools_dir() / script).string()};
  argv.insert(argv.end(), args.begin(), args.end());
  const int rc = run(argv, false);
  SALA_CHECK(rc == 0, "{}: {} failed (exit status {})", who, (tools_dir() / script).string(), rc);
}

}  // namespace sala::cli
