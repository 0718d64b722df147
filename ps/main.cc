// ps_server: one parameter-server daemon. See README.md, "What each binary does".
#include <algorithm>
#include <string>

#include "absl/flags/flag.h"
#include "common/config/command_line.h"
#include "common/config/node_flags.h"
#include "common/ops/daemon_main.h"
#include "common/ops/logging.h"
#include "ps/parameter_server_daemon.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve on (port 0: any free port)");
ABSL_FLAG(int, testing_replica_apply_hold_ms, 0,
          "tests only: hold the log entries this server receives as a backup this long before "
          "applying them (0: apply at once)");

constexpr char kUsage[] =
    "one parameter-server daemon: registers with the scheduler, holds its shards "
    "(weights and optimizer state), serves pulls and pushes, checkpoints, and follows the shard "
    "map.\nusage: ps_server --config FILE [--listen HOST:PORT] [--advertise ADDR] [flags]";

int main(int argc, char** argv) {
  paramserver::ParseCommandLineWithHelp(argc, argv, kUsage);
  paramserver::SetLogNodeName(paramserver::ProvisionalNodeName("ps"));
  return paramserver::RunDaemonMain<paramserver::ParameterServerDaemon>(
      "ps_server", absl::GetFlag(FLAGS_config), [](paramserver::ClusterSpec spec) {
        paramserver::ParameterServerDaemonOptions options;
        options.spec = std::move(spec);
        options.listen_address = absl::GetFlag(FLAGS_listen);
        options.replica_apply_hold =
            absl::Milliseconds(std::max(0, absl::GetFlag(FLAGS_testing_replica_apply_hold_ms)));
        paramserver::FillNodeOptionsFromFlags(&options);
        return options;
      });
}
