// The command-line flags all three daemons (ps_scheduler, ps_server, ps_worker) take,
// defined once: the cluster spec, the cluster token file, and where /metrics is served.
#ifndef PARAMSERVER_COMMON_DAEMON_FLAGS_H_
#define PARAMSERVER_COMMON_DAEMON_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "common/cluster_spec.h"

ABSL_DECLARE_FLAG(std::string, config);
ABSL_DECLARE_FLAG(std::string, cluster_token_file);
ABSL_DECLARE_FLAG(std::string, metrics_host);
ABSL_DECLARE_FLAG(int, metrics_port);

namespace paramserver {

// --cluster_token_file into `spec` when the spec names no token file itself.
inline void ApplyClusterTokenFlag(ClusterSpec* spec) {
  if (spec->security.cluster_token_file.empty()) {
    spec->security.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file);
  }
}

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_DAEMON_FLAGS_H_
