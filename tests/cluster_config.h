// Cluster specs for the cluster tests: the reference job with the knobs tests turn.
#ifndef PARAMSERVER_TESTS_CLUSTER_CONFIG_H_
#define PARAMSERVER_TESTS_CLUSTER_CONFIG_H_

#include <cstdint>
#include <string>

namespace paramserver {

struct TestJob {
  std::string mode = "sync";
  // training.optimizer, a YAML flow map on one line.
  std::string optimizer =
      "{type: adam, learning_rate: 0.001, beta1: 0.9, beta2: 0.999, epsilon: 1.0e-7}";
  int staleness = 0;
  int backup_workers = 0;  // training.sync.backup_workers
  int servers = 2;
  int max_servers = 0;  // above servers: cluster.servers is {min: servers, max: max_servers}
  int workers = 2;
  int max_workers = 0;  // above workers: cluster.workers is {min: workers, max: max_workers}
  int shards = 8;
  int replication = 0;  // 0: the default (2 copies with 2 or more servers)
  int max_steps = 300;
  bool shuffle = true;
  int epochs = 1;
  bool overlap = false;
  int push_bucket_kb = 1024;
  int heartbeat_interval_ms = 200;
  int failure_timeout_ms = 2000;
  int64_t no_worker_timeout_ms = 0;  // cluster.no_worker_timeout_ms; 0: the default (unwritten)
  std::string weights;               // output.weights, or empty
  std::string tensorboard_dir;       // output.tensorboard_dir, or empty
  std::string report;
  std::string checkpoint_dir;  // checkpoint.dir, or empty
  int checkpoint_every_steps = 0;
  // data.sharding ("fixed" or "dynamic"; empty: no data section, the defaults) and
  // data.chunk_batches.
  std::string data_sharding;
  int chunk_batches = 16;
  bool resume = false;
  std::string admin_token_file;    // security.admin_token_file, or empty
  std::string cluster_token_file;  // security.cluster_token_file, or empty
  // security.tls: all three PEM files, or none; and the name in every certificate.
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
};

// A 24-character admin token for tests.
inline constexpr char kTestAdminToken[] = "test-admin-token-0123456";
// A cluster token for tests.
inline constexpr char kTestClusterToken[] = "test-cluster-token-98765432";

// The YAML text of `job` on the real Fashion-MNIST files.
std::string TestJobYaml(const TestJob& job);

}  // namespace paramserver

#endif  // PARAMSERVER_TESTS_CLUSTER_CONFIG_H_
