#include "scheduler/scheduler_metrics.h"

#include "common/ops/plain_json.h"

namespace paramserver {
namespace {

using Samples = std::vector<std::pair<MetricLabels, double>>;

Samples HeartbeatAges(const ClusterStatus& status) {
  Samples samples;
  for (const NodeStatus& node : status.nodes())
    samples.push_back({{{"node", node.name()}}, node.seconds_since_heartbeat()});
  return samples;
}

// A state set: one series per (node, health), 1 for the node's present health, so a
// change of health moves a 1 between series that all exist.
Samples NodeHealths(const ClusterStatus& status) {
  Samples samples;
  for (const NodeStatus& node : status.nodes()) {
    for (NodeHealth health : {NODE_HEALTH_ALIVE, NODE_HEALTH_SUSPECT, NODE_HEALTH_DEAD,
                              NODE_HEALTH_FINISHED, NODE_HEALTH_DRAINED}) {
      samples.push_back(
          {{{"node", node.name()},
            {"health", EnumWord(*NodeHealth_descriptor()->FindValueByNumber(health))}},
           node.health() == health ? 1.0 : 0.0});
    }
  }
  return samples;
}

Samples TestAccuracy(const ClusterStatus& status) {
  if (status.has_result()) return {{{{"evaluation", "final"}}, status.test_accuracy()}};
  Samples samples;
  for (const NodeStatus& node : status.nodes()) {
    if (node.progress().accuracy_step() > 0)
      samples.push_back({{{"evaluation", "latest"}}, node.progress().test_accuracy()});
  }
  return samples;
}

Samples CheckpointFailedWrites(const ClusterStatus& status) {
  Samples samples;
  for (const NodeStatus& node : status.nodes()) {
    if (node.role() != NODE_ROLE_SERVER || node.health() == NODE_HEALTH_DEAD) continue;
    samples.push_back(
        {{{"node", node.name()}}, static_cast<double>(node.checkpoint_trouble().failed_writes())});
  }
  return samples;
}

Samples WorkerSteps(const ClusterStatus& status) {
  Samples samples;
  for (const NodeStatus& node : status.nodes()) {
    if (node.role() == NODE_ROLE_WORKER)
      samples.push_back({{{"node", node.name()}}, static_cast<double>(node.progress().step())});
  }
  return samples;
}

}  // namespace

std::vector<ScrapedFamily> SchedulerMetricFamilies(const ClusterStatus& status) {
  Samples eta;
  if (status.eta_seconds() >= 0) eta.push_back({{}, status.eta_seconds()});
  return {
      {"scheduler_heartbeat_age_seconds", "Seconds since each node's last heartbeat.", false,
       HeartbeatAges(status)},
      {"scheduler_node_health",
       "1 for each node's present health (alive, suspect, dead, finished, drained), else 0.", false,
       NodeHealths(status)},
      {"scheduler_total_steps",
       "Steps the job trains in all (0: not known yet).",
       false,
       {{{}, static_cast<double>(status.total_steps())}}},
      {"scheduler_eta_seconds",
       "Seconds until the slowest live worker trains its last step, at its present rate; absent "
       "while not known.",
       false, std::move(eta)},
      {"scheduler_test_accuracy",
       "The job's test accuracy: the final result once in, else the latest evaluation; absent "
       "before the first.",
       false, TestAccuracy(status)},
      {"scheduler_checkpoint_failed_writes",
       "Each live server's checkpoint writes failing since its last success (0: writing).", false,
       CheckpointFailedWrites(status)},
      {"scheduler_map_version",
       "The shard map's version.",
       false,
       {{{}, static_cast<double>(status.map_version())}}},
      {"scheduler_worker_step", "Each live worker's last reported step.", false,
       WorkerSteps(status)},
  };
}

}  // namespace paramserver
