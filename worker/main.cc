// ps_worker: one training worker. See README.md, "What each binary does". With
// model.type torch it runs the job's script (worker.command) in its place.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/config/command_line.h"
#include "common/ops/daemon_main.h"
#include "common/ops/logging.h"
#include "spdlog/spdlog.h"
#include "worker/blas_kernels.h"
#include "worker/script_launch.h"
#include "worker/worker_daemon.h"
#include "worker/worker_flags.h"

constexpr char kUsage[] =
    "one training worker: registers with the scheduler, trains its share of the "
    "data against the servers and reports (with model.type torch it runs worker.command "
    "instead).\nusage: ps_worker --config FILE [--device auto|cpu|gpu|gpu:N] [flags]";

int main(int argc, char** argv) {
  // Before anything reads the command's input: a restart runs the same command again.
  const absl::Status restarted =
      paramserver::MaybeRestartWithBetterBlasKernels(argc, argv, paramserver::OpenBlasCore());
  paramserver::TakeBlasKernelsRestartNote();  // BlasKernelsDescription, in the log
  paramserver::ParseCommandLineWithHelp(argc, argv, kUsage);
  paramserver::SetLogNodeName(paramserver::ProvisionalNodeName("worker"));
  const std::string config = absl::GetFlag(FLAGS_config);
  if (absl::StatusOr<paramserver::ClusterSpec> spec = paramserver::LoadClusterSpec(config);
      spec.ok() && spec->model.type == paramserver::ModelType::kTorch) {
    const absl::Status launched = paramserver::ExecWorkerCommand(
        *spec, config, std::vector<std::string>(argv + 1, argv + argc),
        paramserver::PackageDirBesideExecutable());
    std::fprintf(stderr, "ps_worker: %s\n", std::string(launched.message()).c_str());
    return 1;
  }
  if (!restarted.ok()) spdlog::warn("{}", std::string(restarted.message()));
  return paramserver::RunDaemonMain<paramserver::WorkerDaemon>("ps_worker", config,
                                                               paramserver::WorkerOptionsFromFlags);
}
