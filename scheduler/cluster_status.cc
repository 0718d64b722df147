#include "scheduler/cluster_status.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace paramserver {
namespace {

using Node = ClusterRegistry::Node;

template <typename Predicate>
int Count(const std::vector<Node>& nodes, Predicate predicate) {
  return static_cast<int>(std::count_if(nodes.begin(), nodes.end(), predicate));
}

NodeHealth HealthOf(const Node& node, absl::Duration silent, absl::Duration suspect_after) {
  if (node.drained) return NODE_HEALTH_DRAINED;
  if (!node.alive) return NODE_HEALTH_DEAD;
  if (node.finished) return NODE_HEALTH_FINISHED;
  if (silent > suspect_after) return NODE_HEALTH_SUSPECT;
  return NODE_HEALTH_ALIVE;
}

// Every node's view into `status`, with the live workers' sums: throughput, the fastest
// and slowest step, the total steps and the time left.
void DescribeNodes(const ClusterRegistry::Snapshot& snapshot, absl::Time now,
                   ClusterStatus* status) {
  const absl::Duration suspect_after =
      2 * absl::Milliseconds(snapshot.cluster.heartbeat_interval_ms);
  const NodeStatus* slowest = nullptr;
  int64_t fastest = -1;
  // The job ends when its slowest worker does: the longest of the live workers' times
  // left, each at its own present rate.
  double eta_seconds = 0;
  bool eta_known = true;
  for (const Node& node : snapshot.nodes) {
    NodeStatus* view = status->add_nodes();
    view->set_name(node.name);
    view->set_role(node.role);
    view->set_address(node.address);
    const absl::Duration silent = now - node.last_heartbeat;
    view->set_seconds_since_heartbeat(absl::ToDoubleSeconds(silent));
    *view->mutable_progress() = node.progress;
    view->set_health(HealthOf(node, silent, suspect_after));
    if (node.role == NODE_ROLE_SERVER) view->set_refused_gradients(node.refused_gradients);
    if (node.alive && node.checkpoint_trouble.failed_writes() > 0) {
      *view->mutable_checkpoint_trouble() = node.checkpoint_trouble;
    }
    if (node.role != NODE_ROLE_WORKER || !node.alive) continue;
    const NodeProgress& progress = node.progress;
    status->set_samples_per_sec(status->samples_per_sec() +
                                (node.finished ? 0 : progress.samples_per_sec()));
    fastest = std::max(fastest, progress.step());
    status->set_total_steps(std::max(status->total_steps(), progress.total_steps()));
    const int64_t steps_left = progress.total_steps() - progress.step();
    if (!node.finished && (progress.total_steps() == 0 || steps_left > 0)) {
      if (progress.total_steps() == 0 || progress.steps_per_sec() <= 0) {
        eta_known = false;
      } else {
        eta_seconds = std::max(eta_seconds, steps_left / progress.steps_per_sec());
      }
    }
    if (slowest == nullptr || progress.step() < slowest->progress().step()) slowest = view;
  }
  // Nothing to go on before any worker reports; nothing left once the result is in.
  status->set_eta_seconds(snapshot.result.has_value()                ? 0
                          : !eta_known || status->total_steps() == 0 ? -1
                                                                     : eta_seconds);
  if (slowest != nullptr) {
    status->set_fastest_step(fastest);
    status->set_slowest_step(slowest->progress().step());
    status->set_slowest_worker(slowest->name());
  }
}

// Every shard of the map, with what its primary last reported.
void DescribeShards(const ClusterRegistry::Snapshot& snapshot, ClusterStatus* status) {
  if (!snapshot.shard_map.has_value()) return;
  for (const ShardAssignment& assignment : snapshot.shard_map->shards()) {
    ShardStatusView* shard = status->add_shards();
    shard->set_shard_id(assignment.shard_id());
    shard->set_primary(assignment.server_name());
    for (const ShardReplica& backup : assignment.backups())
      shard->add_backups(backup.server_name());
    shard->set_parameters(assignment.end() - assignment.begin());
    auto record = snapshot.shard_records.find(assignment.shard_id());
    const bool reported = record != snapshot.shard_records.end();
    shard->set_applied_updates(reported ? record->second.applied_updates : 0);
    shard->set_checkpoint_step(reported ? record->second.checkpoint_step : -1);
    shard->set_skipped_steps(reported ? record->second.skipped_steps : 0);
    shard->set_late_pushes(reported ? record->second.late_pushes : 0);
    if (assignment.kind() == SHARD_KIND_EMBEDDING_ROWS) {
      shard->set_embedding_rows(true);
      shard->set_embedding_bucket(assignment.embedding_bucket());
      shard->set_embedding_buckets(assignment.embedding_buckets());
      if (reported) *shard->mutable_embedding() = record->second.embedding;
    }
  }
}

// "waiting for 1 server and 2 workers", for a cluster that has not formed.
std::string WaitingFor(const ClusterRegistry::Snapshot& snapshot) {
  const ClusterSection& cluster = snapshot.cluster;
  const int servers = std::max(0, cluster.servers - Count(snapshot.nodes, [](const Node& n) {
                                    return n.role == NODE_ROLE_SERVER;
                                  }));
  const int workers = std::max(0, cluster.workers - Count(snapshot.nodes, [](const Node& n) {
                                    return n.role == NODE_ROLE_WORKER;
                                  }));
  std::vector<std::string> missing;
  if (servers > 0) missing.push_back(absl::StrCat(servers, servers == 1 ? " server" : " servers"));
  if (workers > 0) missing.push_back(absl::StrCat(workers, workers == 1 ? " worker" : " workers"));
  return absl::StrCat("waiting for ", absl::StrJoin(missing, " and "));
}

// The verdict: finished (with the result), shutting down, waiting, stalled or training.
void SetVerdict(const ClusterRegistry::Snapshot& snapshot, absl::Time now, ClusterStatus* status) {
  const absl::Duration failure_timeout = absl::Milliseconds(snapshot.cluster.failure_timeout_ms);
  if (snapshot.result.has_value()) {
    status->set_has_result(true);
    status->set_test_accuracy(snapshot.result->ctr ? snapshot.result->test_auc
                                                   : snapshot.result->test_accuracy);
    status->set_test_logloss(snapshot.result->test_logloss);
    status->set_result_without_score(snapshot.result->without_score);
    status->set_samples_per_sec(snapshot.result->samples_per_sec);  // over the whole job
    status->set_verdict("finished");
  } else if (snapshot.shutdown_requested) {
    status->set_verdict("shutting down");
  } else if (!snapshot.shard_map.has_value()) {
    status->set_verdict(WaitingFor(snapshot));
  } else if (Count(snapshot.nodes, [](const Node& n) { return n.alive && n.finished; }) <
                 Count(snapshot.nodes,
                       [](const Node& n) { return n.alive && n.role == NODE_ROLE_WORKER; }) &&
             snapshot.last_advance != absl::InfinitePast() &&
             now - snapshot.last_advance > failure_timeout) {
    status->set_verdict(absl::StrCat(
        "stalled since ",
        absl::FormatTime("%H:%M:%S", snapshot.last_advance, absl::LocalTimeZone()),
        " (no worker advanced for ", absl::ToInt64Seconds(now - snapshot.last_advance),
        " s; slowest ", status->slowest_worker(), " at step ", status->slowest_step(), ")"));
  } else {
    status->set_verdict("training");
  }
}

}  // namespace

ClusterStatus DescribeCluster(const ClusterRegistry::Snapshot& snapshot, absl::Time now) {
  ClusterStatus status;
  status.set_mode(absl::StrCat(TrainingModeName(snapshot.mode),
                               snapshot.async_tables ? " (embedding tables async)" : ""));
  status.set_replication(snapshot.replication);
  status.set_map_version(snapshot.shard_map.has_value() ? snapshot.shard_map->epoch() : 0);
  status.set_elapsed_seconds(
      absl::ToDoubleSeconds(std::min(now, snapshot.finished) - snapshot.started));
  DescribeNodes(snapshot, now, &status);
  DescribeShards(snapshot, &status);
  for (const auto& [worker, points] : snapshot.history) {
    WorkerHistory* history = status.add_history();
    history->set_worker(worker);
    for (const ProgressPoint& point : points) *history->add_points() = point;
  }
  status.set_test_metric(snapshot.ctr ? "AUC" : "accuracy");
  const int live_workers = static_cast<int>(std::count_if(
      snapshot.nodes.begin(), snapshot.nodes.end(),
      [](const ClusterRegistry::Node& n) { return n.role == NODE_ROLE_WORKER && n.alive; }));
  status.set_live_workers(live_workers);
  status.set_min_workers(snapshot.cluster.workers);
  status.set_max_workers(WorkerSlots(snapshot.cluster));
  if (snapshot.mode == TrainingMode::kSync)
    status.set_effective_batch(int64_t{live_workers} * snapshot.batch_size);
  if (snapshot.data_leases.example_count() > 0)
    *status.mutable_data_leases() = snapshot.data_leases;
  SetVerdict(snapshot, now, &status);
  return status;
}

}  // namespace paramserver
