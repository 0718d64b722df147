// The scheduler's gauges on /metrics, all computed from one ClusterStatus: a scrape
// takes one snapshot of the registry, not one per gauge.
#ifndef PARAMSERVER_SCHEDULER_SCHEDULER_METRICS_H_
#define PARAMSERVER_SCHEDULER_SCHEDULER_METRICS_H_

#include <vector>

#include "common/ops/metrics.h"
#include "proto/admin.pb.h"

namespace paramserver {

// scheduler_heartbeat_age_seconds, scheduler_node_health, scheduler_total_steps,
// scheduler_eta_seconds, scheduler_test_accuracy, scheduler_checkpoint_failed_writes,
// scheduler_map_version and scheduler_worker_step, as `status` gives them.
std::vector<ScrapedFamily> SchedulerMetricFamilies(const ClusterStatus& status);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_SCHEDULER_METRICS_H_
