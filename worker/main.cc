// ps_worker: one training worker. See README.md, "What each binary does".
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/daemon_main.h"
#include "common/logging.h"
#include "common/node_flags.h"
#include "worker/worker_daemon.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port to serve health checks on (port 0: any free port)");
ABSL_FLAG(
    std::string, device, "",
    "auto, cpu, gpu or gpu:N: where to compute (default: worker.device in the config, else auto)");
ABSL_FLAG(std::string, test_only_rpc_faults, "",
          "TEST ONLY: inject faults into pulls and pushes, e.g. "
          "drop_request=0.05,drop_response=0.05,seed=1");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  paramserver::SetLogNodeName(paramserver::ProvisionalNodeName("worker"));
  return paramserver::RunDaemonMain<paramserver::WorkerDaemon>(
      "ps_worker", absl::GetFlag(FLAGS_config), [](paramserver::ClusterSpec spec) {
        paramserver::WorkerDaemonOptions options;
        options.spec = std::move(spec);
        options.listen_address = absl::GetFlag(FLAGS_listen);
        paramserver::FillNodeOptionsFromFlags(&options);
        options.device = absl::GetFlag(FLAGS_device);
        options.test_only_rpc_faults = absl::GetFlag(FLAGS_test_only_rpc_faults);
        return options;
      });
}
