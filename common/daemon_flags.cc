#include "common/daemon_flags.h"

ABSL_FLAG(std::string, config, "", "the cluster spec (YAML)");
ABSL_FLAG(std::string, cluster_token_file, "",
          "the cluster token, when the spec names none in security.cluster_token_file "
          "(deploy/local/run.sh makes one per job)");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "the address --metrics_port listens on (default loopback; 0.0.0.0 to be scraped from "
          "elsewhere)");
ABSL_FLAG(int, metrics_port, -1,
          "serve Prometheus metrics at http://<listen host>:PORT/metrics (0: any free port, "
          "logged; -1: off)");
