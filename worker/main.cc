// ps_worker: one training worker. See README.md, "What each binary does".
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/daemon_main.h"
#include "common/logging.h"
#include "worker/worker_daemon.h"

ABSL_FLAG(std::string, config, "", "the cluster spec (YAML)");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve health checks on (port 0: any free port)");
ABSL_FLAG(std::string, advertise, "",
          "host:port other nodes reach this one at (default: --listen with the bound port); \"imds\": this EC2 instance's private address, with the bound port");
ABSL_FLAG(std::string, scheduler, "", "host:port of the scheduler (default: cluster.scheduler)");
ABSL_FLAG(std::string, device, "",
          "auto, cpu, gpu or gpu:N: where to compute (default: worker.device in the config, else auto)");
ABSL_FLAG(std::string, test_only_rpc_faults, "",
          "TEST ONLY: inject faults into pulls and pushes, e.g. drop_request=0.05,drop_response=0.05,seed=1");
ABSL_FLAG(int, metrics_port, -1,
          "serve Prometheus metrics at http://<listen host>:PORT/metrics (0: any free port, logged; -1: off)");
ABSL_FLAG(std::string, imds_endpoint, "http://169.254.169.254",
          "the EC2 instance metadata service (for --advertise imds and --watch_spot_interruptions)");
ABSL_FLAG(bool, watch_spot_interruptions, false,
          "poll the metadata service for a spot interruption notice, and leave the job cleanly on one");
ABSL_FLAG(int, spot_poll_ms, 5000, "how often --watch_spot_interruptions polls");
ABSL_FLAG(int, startup_timeout_s, 600, "seconds to wait for the scheduler and the whole cluster");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  paramserver::SetLogNodeName("worker-?");
  return paramserver::RunDaemonMain<paramserver::WorkerDaemon>(
      "ps_worker", absl::GetFlag(FLAGS_config), [](paramserver::ClusterSpec spec) {
        paramserver::WorkerDaemonOptions options;
        options.spec = std::move(spec);
        options.listen_address = absl::GetFlag(FLAGS_listen);
        options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
        options.imds_endpoint = absl::GetFlag(FLAGS_imds_endpoint);
        options.watch_spot_interruptions = absl::GetFlag(FLAGS_watch_spot_interruptions);
        options.spot_poll_interval = absl::Milliseconds(absl::GetFlag(FLAGS_spot_poll_ms));
        options.advertise_address = absl::GetFlag(FLAGS_advertise);
        options.scheduler_address = absl::GetFlag(FLAGS_scheduler);
        options.device = absl::GetFlag(FLAGS_device);
        options.test_only_rpc_faults = absl::GetFlag(FLAGS_test_only_rpc_faults);
        options.startup_timeout = absl::Seconds(absl::GetFlag(FLAGS_startup_timeout_s));
        return options;
      });
}
