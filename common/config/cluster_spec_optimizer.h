// training.optimizer of the cluster spec: its keys for each type, their defaults
// (torch.optim's) and their checks. Part of cluster_spec; its callers use that.
#ifndef PARAMSERVER_COMMON_CONFIG_CLUSTER_SPEC_OPTIMIZER_H_
#define PARAMSERVER_COMMON_CONFIG_CLUSTER_SPEC_OPTIMIZER_H_

#include "absl/status/status.h"
#include "common/config/cluster_spec.h"
#include "common/config/yaml_map_reader.h"

namespace paramserver {

// Reads the section into `optimizer`: its type (unset: `optimizer`'s), then that type's
// keys over torch's defaults, then its lr_schedule. INVALID_ARGUMENT naming the key (and
// its line) for an unknown type, a key of another type, an unknown key, a value torch
// would refuse, or a warm-up longer than `max_steps` (0: no limit).
absl::Status ParseOptimizer(YamlMapReader& r, DenseOptimizerOptions* optimizer, int64_t max_steps);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CONFIG_CLUSTER_SPEC_OPTIMIZER_H_
