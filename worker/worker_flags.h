// ps_worker's own command-line flags, and how they and the shared node flags fill a
// worker's options: used by ps_worker and by the Python package, which parses the flags
// ps_worker was given when it runs a model.type torch script in its place.
#ifndef PARAMSERVER_WORKER_WORKER_FLAGS_H_
#define PARAMSERVER_WORKER_WORKER_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "common/config/cluster_spec.h"
#include "worker/worker_daemon.h"

ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, test_only_rpc_faults);

namespace paramserver {

// A worker's options: `spec`, and the flags as parsed.
WorkerDaemonOptions WorkerOptionsFromFlags(ClusterSpec spec);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_WORKER_FLAGS_H_
