// How a training loop rides out a failed pull or push: wait a little, refresh the shard
// map, and carry on where the new map says, until the recovery timeout.
#ifndef PARAMSERVER_WORKER_RECOVERY_H_
#define PARAMSERVER_WORKER_RECOVERY_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/ps_client.h"

namespace paramserver {

// Whether a map change may cure `status` (a dead, replaced or moving server).
bool MapChangeMayCure(const absl::Status& status);

// After `failure` at `step`: returns `failure` itself when no map change can cure it (a
// PERMISSION_DENIED is retried only while the map says this worker was declared dead,
// or has changed since: the servers refuse a dead worker's calls until it is
// re-admitted), and the error to give up with once `recovery_timeout` has passed since
// the first failure (*give_up_at is set then, and reset by the caller once a step
// completes). Otherwise refreshes the map, blocking: at once after the first failure;
// after a later UNAVAILABLE or PERMISSION_DENIED, waiting on the scheduler for a newer
// map for up to 200 ms (PsClient::AwaitShardMapChange: answered as one is published);
// after others, after 50 ms; and never less than 50 ms after the previous attempt's
// call. The update says whether it changed (and the step to continue from after a rollback, or
// after this worker was re-admitted); an unchanged or unreachable map, or one that counts this
// worker dead (its heartbeats register it again), means "try again".
absl::StatusOr<ShardMapUpdate> WaitForRecovery(PsClient* ps, const absl::Status& failure,
                                               int64_t step, absl::Duration recovery_timeout,
                                               std::optional<absl::Time>* give_up_at);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_RECOVERY_H_
