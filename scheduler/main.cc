// ps_scheduler: the job's scheduler. See README.md, "What each binary does".
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/config/command_line.h"
#include "common/config/daemon_flags.h"
#include "common/config/storage_checks.h"
#include "common/ops/daemon_main.h"
#include "common/ops/logging.h"
#include "scheduler/scheduler_daemon.h"

ABSL_FLAG(std::string, listen, "",
          "host:port to serve on (default: cluster.scheduler; port 0: any free port)");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file once serving");
ABSL_FLAG(std::string, state_file, "",
          "save the scheduler's state here; a scheduler started with an existing file takes the "
          "job over");
ABSL_FLAG(std::string, report_file, "",
          "write the final report (the status page with the final status built in) here when the "
          "job ends, unless the spec's output.report names a place");
ABSL_FLAG(bool, describe, false,
          "validate the config and check its files (data and init_from readable; checkpoint.dir, "
          "output.weights and output.report writable), print 'scheduler=ADDR servers=N workers=N "
          "failure_timeout_ms=N' and exit (for launchers); exit 2 naming the first bad key");

constexpr char kUsage[] =
    "the job's scheduler: names the servers and workers as they register, places "
    "the shards, watches heartbeats and recovers from lost nodes.\nusage: ps_scheduler "
    "--config FILE [--listen HOST:PORT] [--state_file F] [--describe] [flags]";

int main(int argc, char** argv) {
  paramserver::ParseCommandLineWithHelp(argc, argv, kUsage);
  paramserver::SetLogNodeName("scheduler");
  if (absl::GetFlag(FLAGS_describe)) {
    absl::StatusOr<paramserver::ClusterSpec> spec =
        paramserver::LoadClusterSpec(absl::GetFlag(FLAGS_config));
    if (!spec.ok()) {
      std::fprintf(stderr, "ps_scheduler: %s\n", std::string(spec.status().message()).c_str());
      return 2;
    }
    paramserver::ApplySecurityFlags(&*spec);
    // Every file the job reads or writes, before a launcher starts any daemon.
    std::vector<std::string> warnings;
    const absl::Status files =
        paramserver::CheckSpecStorage(*spec, paramserver::StorageUser::kEverything, &warnings);
    for (const std::string& warning : warnings)
      std::fprintf(stderr, "ps_scheduler: warning: %s\n", warning.c_str());
    if (!files.ok()) {
      std::fprintf(stderr, "ps_scheduler: %s\n", std::string(files.message()).c_str());
      return 2;
    }
    // What only the model shows: too many shards, parameter groups naming no tensor.
    if (const absl::Status model = paramserver::CheckSpecModel(*spec); !model.ok()) {
      std::fprintf(stderr, "ps_scheduler: %s\n", std::string(model.message()).c_str());
      return 2;
    }
    std::printf("scheduler=%s servers=%d workers=%d failure_timeout_ms=%d\n",
                spec->cluster.scheduler_address.c_str(), spec->cluster.servers,
                spec->cluster.workers, spec->cluster.failure_timeout_ms);
    return 0;
  }
  return paramserver::RunDaemonMain<paramserver::SchedulerDaemon>(
      "ps_scheduler", absl::GetFlag(FLAGS_config), [](paramserver::ClusterSpec spec) {
        paramserver::SchedulerDaemonOptions options;
        options.spec = std::move(spec);
        options.listen_address = absl::GetFlag(FLAGS_listen);
        options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
        options.port_file = absl::GetFlag(FLAGS_port_file);
        options.state_file = absl::GetFlag(FLAGS_state_file);
        options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
        if (options.spec.output.report.empty())
          options.spec.output.report = absl::GetFlag(FLAGS_report_file);
        return options;
      });
}
