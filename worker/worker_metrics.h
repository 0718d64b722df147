// A worker's gauges on /metrics, all computed from one look at its training progress:
// a scrape reads the progress once.
#ifndef PARAMSERVER_WORKER_WORKER_METRICS_H_
#define PARAMSERVER_WORKER_WORKER_METRICS_H_

#include <vector>

#include "common/ops/metrics.h"
#include "proto/scheduler.pb.h"
#include "worker/model_job.h"

namespace paramserver {

// worker_step, worker_total_steps, worker_epoch, worker_loss and
// worker_samples_per_second; once rank 0 has evaluated an epoch, worker_test_accuracy
// (`figure` kAccuracy) or worker_test_auc (kAuc) has its sample (no sample before, nor
// for kNone). One metric per unit (docs/OPERATIONS.md lists the names each replaced).
std::vector<ScrapedFamily> WorkerMetricFamilies(const NodeProgress& progress,
                                                EvaluationFigure figure);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_WORKER_METRICS_H_
