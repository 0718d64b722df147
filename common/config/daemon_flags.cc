#include "common/config/daemon_flags.h"

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
ABSL_FLAG(std::string, admin_token_file, "",
          "the admin token, when the spec names none in security.admin_token_file");
ABSL_FLAG(std::string, tls_dir, "",
          "a folder holding ca.pem, node.pem and node.key: mutual TLS (server name "
          "\"paramserver\"), when the spec sets no security.tls");

namespace paramserver {

void ApplySecurityFlags(ClusterSpec* spec) {
  SecuritySection& security = spec->security;
  if (security.cluster_token_file.empty()) {
    security.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file);
  }
  if (security.admin_token_file.empty()) {
    security.admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  }
  const std::string tls_dir = absl::GetFlag(FLAGS_tls_dir);
  if (!tls_dir.empty() && security.tls_ca.empty()) {
    security.tls_ca = tls_dir + "/ca.pem";
    security.tls_cert = tls_dir + "/node.pem";
    security.tls_key = tls_dir + "/node.key";
    if (security.tls_server_name.empty()) security.tls_server_name = "paramserver";
  }
}

}  // namespace paramserver
