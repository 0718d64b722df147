#include "worker/script_launch.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace paramserver {

std::string PackageDirBesideExecutable() {
  char self[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return "";
  std::string path(self, length);
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  return path.substr(0, slash) + "/../python";
}

absl::Status ExecWorkerCommand(const ClusterSpec& spec, const std::string& config_path,
                               const std::vector<std::string>& flags,
                               const std::string& package_dir) {
  const std::vector<std::string>& command = spec.worker.command;
  if (command.empty()) return absl::InvalidArgumentError("worker.command is empty");
  char resolved[PATH_MAX];
  if (realpath(config_path.c_str(), resolved) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(config_path, ": cannot resolve the spec's path: ", std::strerror(errno)));
  }
  setenv(kConfigEnv, resolved, 1);
  setenv(kWorkerArgsEnv, absl::StrJoin(flags, std::string(1, kWorkerArgsSeparator)).c_str(), 1);
  // The script's prints interleave with the package's log lines as they happen.
  setenv("PYTHONUNBUFFERED", "1", 0);
  char package[PATH_MAX];
  if (!package_dir.empty() && realpath(package_dir.c_str(), package) != nullptr &&
      access((std::string(package) + "/paramserver/__init__.py").c_str(), R_OK) == 0) {
    const char* existing = getenv("PYTHONPATH");
    setenv("PYTHONPATH",
           (existing != nullptr && *existing != '\0') ? absl::StrCat(package, ":", existing).c_str()
                                                      : package,
           1);
  }
  if (chdir(spec.worker.command_dir.c_str()) != 0) {
    return absl::NotFoundError(absl::StrCat("worker.command: cannot enter the spec's folder ",
                                            spec.worker.command_dir, ": ", std::strerror(errno)));
  }
  std::vector<char*> argv;
  for (const std::string& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  return absl::NotFoundError(absl::StrCat("worker.command: cannot run '", command.front(), "' (in ",
                                          spec.worker.command_dir, "): ", std::strerror(errno)));
}

}  // namespace paramserver
