// The learning rate of each update under training.optimizer.lr_schedule: a pure function
// of the update number, so every replica, a rollback and a restore compute the same rate
// for the same update, and a resumed job continues its schedule where it was saved.
#ifndef PARAMSERVER_PS_LEARNING_RATE_SCHEDULE_H_
#define PARAMSERVER_PS_LEARNING_RATE_SCHEDULE_H_

#include <cstdint>

#include "common/config/cluster_spec.h"

namespace paramserver {

// The rate of update number `step` (1 for the first) with base rate
// options.learning_rate: the closed form (`_get_closed_form_lr`) of the torch scheduler
// a script would step once after each optimizer.step(), at last_epoch = step - 1. With a
// warm-up of W updates, that of SequentialLR([LinearLR(warmup_start_factor, 1, W),
// DECAY], milestones=[W]): the decay's own count starts at 0 when the warm-up ends, so
// multistep's milestones and step's periods count from there. cosine, linear and
// polynomial stay at their final rate past total_steps (torch's cosine would rise again).
double ScheduledLearningRate(const DenseOptimizerOptions& options, int64_t step);

}  // namespace paramserver

#endif  // PARAMSERVER_PS_LEARNING_RATE_SCHEDULE_H_
