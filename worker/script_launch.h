// model.type torch: ps_worker runs the job's script (worker.command) in its own place,
// so that every launcher (deploy/local/run.sh, the EC2 worker unit) starts a script
// worker exactly as it starts a built-in one. See docs/PYTHON.md.
#ifndef PARAMSERVER_WORKER_SCRIPT_LAUNCH_H_
#define PARAMSERVER_WORKER_SCRIPT_LAUNCH_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config/cluster_spec.h"

namespace paramserver {

// The environment paramserver.init() reads.
inline constexpr char kConfigEnv[] = "PARAMSERVER_CONFIG";           // the spec's path
inline constexpr char kWorkerArgsEnv[] = "PARAMSERVER_WORKER_ARGS";  // ps_worker's flags
// Separates the flags in kWorkerArgsEnv (ASCII unit separator: no flag holds one).
inline constexpr char kWorkerArgsSeparator = '\x1f';

// Replaces this process (exec, so a launcher's process id and signals reach the script)
// with spec.worker.command, run in spec.worker.command_dir, with kConfigEnv set to the
// absolute path of `config_path`, kWorkerArgsEnv to `flags` (ps_worker's command line
// but its name) and PYTHONPATH led by `package_dir` when it holds the package.
// Returns only if the command cannot be run, saying why.
absl::Status ExecWorkerCommand(const ClusterSpec& spec, const std::string& config_path,
                               const std::vector<std::string>& flags,
                               const std::string& package_dir);

// Where the Python package lies beside this executable: <its folder>/../python, as
// both Bazel (bazel-bin/worker/ps_worker, bazel-bin/python) and the release tarball
// (bin/ps_worker, python) lay them out.
std::string PackageDirBesideExecutable();

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_SCRIPT_LAUNCH_H_
