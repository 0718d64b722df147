#include "common/config/node_flags.h"

ABSL_FLAG(std::string, advertise, "",
          "host:port other nodes reach this one at (default: --listen with the bound port); "
          "\"imds\": this EC2 "
          "instance's private address, with the bound port");
ABSL_FLAG(std::string, scheduler, "", "host:port of the scheduler (default: cluster.scheduler)");
ABSL_FLAG(
    std::string, imds_endpoint, "http://169.254.169.254",
    "the EC2 instance metadata service (for --advertise imds and --watch_spot_interruptions)");
ABSL_FLAG(
    bool, watch_spot_interruptions, false,
    "poll the metadata service for a spot interruption notice, and leave the job cleanly on one");
ABSL_FLAG(int, spot_poll_ms, 5000, "how often --watch_spot_interruptions polls");
ABSL_FLAG(int, startup_timeout_s, 600, "seconds to wait for the scheduler and the whole cluster");
