#include "worker/worker_flags.h"

#include "absl/flags/flag.h"
#include "common/config/node_flags.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port to serve health checks on (port 0: any free port)");
ABSL_FLAG(
    std::string, device, "",
    "auto, cpu, gpu or gpu:N: where to compute (default: worker.device in the config, else auto)");
ABSL_FLAG(std::string, test_only_rpc_faults, "",
          "TEST ONLY: inject faults into pulls and pushes, e.g. "
          "drop_request=0.05,drop_response=0.05,seed=1");
ABSL_FLAG(int64_t, test_only_start_delay_ms, 0,
          "TEST ONLY: wait this long after the cluster forms, before the first step, as a slow "
          "start-up would (a large test set to load)");

namespace paramserver {

WorkerDaemonOptions WorkerOptionsFromFlags(ClusterSpec spec) {
  WorkerDaemonOptions options;
  options.spec = std::move(spec);
  options.listen_address = absl::GetFlag(FLAGS_listen);
  FillNodeOptionsFromFlags(&options);
  options.device = absl::GetFlag(FLAGS_device);
  options.test_only_rpc_faults = absl::GetFlag(FLAGS_test_only_rpc_faults);
  options.test_only_start_delay = absl::Milliseconds(absl::GetFlag(FLAGS_test_only_start_delay_ms));
  return options;
}

}  // namespace paramserver
