// The command-line flags ps_server and ps_worker share (finding the cluster, EC2), defined
// once beside those every daemon takes (common/config/daemon_flags.h), and how they fill a
// node's options.
#ifndef PARAMSERVER_COMMON_CONFIG_NODE_FLAGS_H_
#define PARAMSERVER_COMMON_CONFIG_NODE_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "common/config/daemon_flags.h"
#include "common/config/node_options.h"

ABSL_DECLARE_FLAG(std::string, advertise);
ABSL_DECLARE_FLAG(std::string, scheduler);
ABSL_DECLARE_FLAG(std::string, imds_endpoint);
ABSL_DECLARE_FLAG(bool, watch_spot_interruptions);
ABSL_DECLARE_FLAG(int, spot_poll_ms);
ABSL_DECLARE_FLAG(int, startup_timeout_s);

namespace paramserver {

// Sets the options every node daemon takes from the shared flags: advertise and
// scheduler addresses, metrics, the metadata endpoint, spot watching, the startup
// timeout. (The credential flags are applied by RunDaemonMain: ApplySecurityFlags.)
inline void FillNodeOptionsFromFlags(NodeOptions* options) {
  options->advertise_address = absl::GetFlag(FLAGS_advertise);
  options->scheduler_address = absl::GetFlag(FLAGS_scheduler);
  options->metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options->imds_endpoint = absl::GetFlag(FLAGS_imds_endpoint);
  options->watch_spot_interruptions = absl::GetFlag(FLAGS_watch_spot_interruptions);
  options->spot_poll_interval = absl::Milliseconds(absl::GetFlag(FLAGS_spot_poll_ms));
  options->startup_timeout = absl::Seconds(absl::GetFlag(FLAGS_startup_timeout_s));
  options->metrics_host = absl::GetFlag(FLAGS_metrics_host);
}

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CONFIG_NODE_FLAGS_H_
