// Cluster specs for the cluster tests: the reference job with the knobs tests turn.
#ifndef PARAMSERVER_TESTS_CLUSTER_CONFIG_H_
#define PARAMSERVER_TESTS_CLUSTER_CONFIG_H_

#include <string>

namespace paramserver {

struct TestJob {
  std::string mode = "sync";
  int staleness = 0;
  int servers = 2;
  int workers = 2;
  int shards = 8;
  int max_steps = 300;
  bool shuffle = true;
  std::string weights;  // output.weights, or empty
};

// The YAML text of `job` on the real Fashion-MNIST files, 1 epoch cap by max_steps.
std::string TestJobYaml(const TestJob& job);

}  // namespace paramserver

#endif  // PARAMSERVER_TESTS_CLUSTER_CONFIG_H_
