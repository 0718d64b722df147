// Which examples a worker trains on, in which order: a function of the seed, the epoch
// and the worker's range only, so a run (or a rewind to a step) is reproducible.
#ifndef PARAMSERVER_WORKER_BATCH_ORDER_H_
#define PARAMSERVER_WORKER_BATCH_ORDER_H_

#include <cstdint>
#include <vector>

#include "common/wire/shard_layout.h"

namespace paramserver {

// The example indices of `range` in the order epoch `epoch` visits them: file order
// without shuffle, otherwise a permutation drawn from (seed, epoch, range).
std::vector<int64_t> EpochExampleOrder(ParameterRange range, int epoch, uint64_t seed,
                                       bool shuffle);

// Steps per epoch shared by every worker: the fewest full batches any worker's range
// holds, so that in sync mode every worker runs the same number of steps. Each worker
// drops the examples past its last full batch.
int64_t StepsPerEpoch(int64_t example_count, int num_workers, int batch_size);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_BATCH_ORDER_H_
