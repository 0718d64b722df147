// The admin view of a job (psctl status, the status page, /api/status), made from a
// snapshot of the registry: a pure function, so the view's rules are tested without a
// registry's history of calls, and the registry holds no presentation code.
#ifndef PARAMSERVER_SCHEDULER_CLUSTER_STATUS_H_
#define PARAMSERVER_SCHEDULER_CLUSTER_STATUS_H_

#include "absl/time/time.h"
#include "proto/admin.pb.h"
#include "scheduler/cluster_registry.h"

namespace paramserver {

// Every node's health and progress, every shard's copies and counts, each worker's curve
// (when the snapshot has it), and a verdict: "waiting for N servers and M workers",
// "training", "stalled since HH:MM:SS (...)" when no worker advanced for failure_timeout
// while others wait, "shutting down" or "finished". A live node silent for more than two
// heartbeat intervals at `now` is SUSPECT.
ClusterStatus DescribeCluster(const ClusterRegistry::Snapshot& snapshot, absl::Time now);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_CLUSTER_STATUS_H_
