// The command-line flags all three daemons (ps_scheduler, ps_server, ps_worker) take,
// defined once: the cluster spec, the credential files, and where /metrics is served.
#ifndef PARAMSERVER_COMMON_CONFIG_DAEMON_FLAGS_H_
#define PARAMSERVER_COMMON_CONFIG_DAEMON_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "common/config/cluster_spec.h"

ABSL_DECLARE_FLAG(std::string, config);
ABSL_DECLARE_FLAG(std::string, cluster_token_file);
ABSL_DECLARE_FLAG(std::string, metrics_host);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, admin_token_file);
ABSL_DECLARE_FLAG(std::string, tls_dir);

namespace paramserver {

// The credential flags into `spec`, each only where the spec names nothing itself (a
// deployment delivers the files; the user's spec need not know where):
//   --cluster_token_file F  security.cluster_token_file
//   --admin_token_file F    security.admin_token_file
//   --tls_dir D             security.tls: D/ca.pem, D/node.pem, D/node.key, and
//                           server_name "paramserver" (the name in the certificate
//                           deploy/ec2/launch.py --tls makes)
// RunDaemonMain applies them right after loading the spec.
void ApplySecurityFlags(ClusterSpec* spec);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CONFIG_DAEMON_FLAGS_H_
