// The options every node daemon (ps_server, ps_worker) takes: the cluster spec, where to
// listen and what to advertise, where the scheduler is, metrics, EC2 metadata and spot
// interruptions, and how long to wait for the cluster to form. Each daemon's options
// struct extends it with its own.
#ifndef PARAMSERVER_COMMON_CONFIG_NODE_OPTIONS_H_
#define PARAMSERVER_COMMON_CONFIG_NODE_OPTIONS_H_

#include <string>

#include "absl/time/time.h"
#include "common/config/cluster_spec.h"
#include "common/ops/instance_metadata.h"

namespace paramserver {

struct NodeOptions {
  ClusterSpec spec;
  std::string scheduler_address;  // overrides spec.cluster.scheduler_address when set
  std::string listen_address = "127.0.0.1:0";
  std::string advertise_address;           // default: the listen host with the bound port
  std::string metrics_host = "127.0.0.1";  // where the metrics HTTP endpoint listens
  int metrics_port = -1;  // >= 0: serve /metrics on the listen host (0: any free port)
  // advertise_address "imds": the instance's private address from this endpoint.
  std::string imds_endpoint = kDefaultImdsEndpoint;
  // Leave the job cleanly when the metadata service posts a spot interruption notice.
  bool watch_spot_interruptions = false;
  absl::Duration spot_poll_interval = absl::Seconds(5);
  absl::Duration startup_timeout = absl::Minutes(10);  // for the cluster to form
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CONFIG_NODE_OPTIONS_H_
