// ps_scheduler: the job's scheduler. See README.md, "What each binary does".
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/daemon_main.h"
#include "common/logging.h"
#include "scheduler/scheduler_daemon.h"

ABSL_FLAG(std::string, config, "", "the cluster spec (YAML)");
ABSL_FLAG(std::string, listen, "", "host:port to serve on (default: cluster.scheduler; port 0: any free port)");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file once serving");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  paramserver::SetLogNodeName("scheduler");
  return paramserver::RunDaemonMain<paramserver::SchedulerDaemon>(
      "ps_scheduler", absl::GetFlag(FLAGS_config), [](paramserver::ClusterSpec spec) {
        paramserver::SchedulerDaemonOptions options;
        options.spec = std::move(spec);
        options.listen_address = absl::GetFlag(FLAGS_listen);
        options.port_file = absl::GetFlag(FLAGS_port_file);
        return options;
      });
}
