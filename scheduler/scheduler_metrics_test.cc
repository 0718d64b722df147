// The scheduler's gauges from a ClusterStatus made by hand.
#include "scheduler/scheduler_metrics.h"

#include <map>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

std::string Label(const MetricLabels& labels, const std::string& key) {
  for (const auto& [name, value] : labels) {
    if (name == key) return value;
  }
  return "";
}

std::map<std::string, ScrapedFamily> ByName(const ClusterStatus& status) {
  std::map<std::string, ScrapedFamily> families;
  for (ScrapedFamily& family : SchedulerMetricFamilies(status))
    families[family.name] = std::move(family);
  return families;
}

ClusterStatus TwoNodes() {
  ClusterStatus status;
  status.set_map_version(7);
  status.set_total_steps(1000);
  status.set_eta_seconds(-1);  // not known
  NodeStatus* server = status.add_nodes();
  server->set_name("ps-0");
  server->set_role(NODE_ROLE_SERVER);
  server->set_health(NODE_HEALTH_SUSPECT);
  server->set_seconds_since_heartbeat(2.5);
  server->mutable_checkpoint_trouble()->set_failed_writes(3);
  NodeStatus* worker = status.add_nodes();
  worker->set_name("worker-0");
  worker->set_role(NODE_ROLE_WORKER);
  worker->set_health(NODE_HEALTH_ALIVE);
  worker->mutable_progress()->set_step(42);
  worker->mutable_progress()->set_accuracy_step(40);
  worker->mutable_progress()->set_test_accuracy(0.5);
  return status;
}

TEST_CASE("every scheduler gauge comes from the one status it is given") {
  std::map<std::string, ScrapedFamily> families = ByName(TwoNodes());
  CHECK(families.size() == 8);
  CHECK(families["scheduler_map_version"].samples ==
        std::vector<std::pair<MetricLabels, double>>{{{}, 7.0}});
  CHECK(families["scheduler_total_steps"].samples.at(0).second == 1000);
  CHECK(families["scheduler_eta_seconds"].samples.empty());  // absent while not known
  CHECK(families["scheduler_heartbeat_age_seconds"].samples.at(0).second == 2.5);
  CHECK(families["scheduler_checkpoint_failed_writes"].samples ==
        std::vector<std::pair<MetricLabels, double>>{{{{"node", "ps-0"}}, 3.0}});
  CHECK(families["scheduler_worker_step"].samples ==
        std::vector<std::pair<MetricLabels, double>>{{{{"node", "worker-0"}}, 42.0}});
  CHECK(families["scheduler_test_accuracy"].samples ==
        std::vector<std::pair<MetricLabels, double>>{{{{"evaluation", "latest"}}, 0.5}});
  for (const auto& [name, family] : families) CHECK_FALSE(family.counter);
}

TEST_CASE("node health is a state set: one 1 per node, at its present health") {
  std::map<std::string, ScrapedFamily> families = ByName(TwoNodes());
  const auto& samples = families["scheduler_node_health"].samples;
  CHECK(samples.size() == 2 * 5);
  std::map<std::string, double> ones;
  for (const auto& [labels, value] : samples) {
    if (value == 1) ones[Label(labels, "node")] += 1;
    if (value == 1 && Label(labels, "node") == "ps-0") CHECK(Label(labels, "health") == "suspect");
  }
  CHECK(ones == std::map<std::string, double>{{"ps-0", 1}, {"worker-0", 1}});
}

TEST_CASE("once the result is in, the test accuracy gauge shows it alone") {
  ClusterStatus status = TwoNodes();
  status.set_has_result(true);
  status.set_test_accuracy(0.875);
  status.set_eta_seconds(0);
  std::map<std::string, ScrapedFamily> families = ByName(status);
  CHECK(families["scheduler_test_accuracy"].samples ==
        std::vector<std::pair<MetricLabels, double>>{{{{"evaluation", "final"}}, 0.875}});
  CHECK(families["scheduler_eta_seconds"].samples.size() == 1);
}

}  // namespace
}  // namespace paramserver
