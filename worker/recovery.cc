#include "worker/recovery.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/retry_policy.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// Between attempts to recover from a failed pull or push: a fixed interval (each attempt
// refreshes the shard map; the recovery timeout bounds them).
constexpr BackoffPolicy kRecoveryRetryInterval{absl::Milliseconds(50), absl::Milliseconds(50)};

// After an unreachable server (UNAVAILABLE) or a refusal of this worker
// (PERMISSION_DENIED), how long one attempt waits for the scheduler to publish another
// map (a long poll, answered as the map is published) before the call is tried again:
// long enough that a worker spends most of a server's failure timeout waiting there,
// where it hears of the new map at once, short enough that a server that was only busy
// (installing a map) is tried again soon.
constexpr absl::Duration kMapChangeWait = absl::Milliseconds(200);

// Whether `failure` is one that only a new map is likely to cure: a server that does not
// answer, or a refusal of this worker (declared dead).
bool AwaitsNewMap(const absl::Status& failure) {
  return failure.code() == absl::StatusCode::kUnavailable ||
         failure.code() == absl::StatusCode::kPermissionDenied;
}

}  // namespace

bool MapChangeMayCure(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<ShardMapUpdate> WaitForRecovery(PsClient* ps, const absl::Status& failure,
                                               int64_t step, absl::Duration recovery_timeout,
                                               std::optional<absl::Time>* give_up_at) {
  const bool curable = MapChangeMayCure(failure);
  if (!curable && failure.code() != absl::StatusCode::kPermissionDenied) return failure;
  const absl::Time now = absl::Now();
  const bool first_failure = !give_up_at->has_value();
  if (first_failure) {
    *give_up_at = now + recovery_timeout;
    // A pull that timed out is usually just waiting for slower workers.
    if (failure.code() != absl::StatusCode::kDeadlineExceeded) {
      spdlog::warn("step {}: {}; waiting for the cluster to recover", step, failure.ToString());
    }
  } else if (now > **give_up_at) {
    return absl::Status(failure.code(),
                        absl::StrCat("gave up after ", absl::FormatDuration(recovery_timeout),
                                     " of recovery at step ", step, ": ", failure.message()));
  }
  // The first refresh goes at once: a server that refused a stale map already serves the
  // new one, which the scheduler has (a planned move's pause is this round trip). Later
  // ones wait on the scheduler for a new map where only one can help, else poll.
  absl::StatusOr<ShardMapUpdate> update;
  if (first_failure) {
    update = ps->RefreshShardMap();
  } else if (AwaitsNewMap(failure)) {
    update = ps->AwaitShardMapChange(std::min(kMapChangeWait, **give_up_at - now));
    // A scheduler that cannot be reached, or a wait cut short without a new map, must
    // not make the worker call the servers again at once: at least the poll's interval
    // passes between attempts.
    if (!update.ok() || !update->epoch_changed) {
      absl::SleepFor(now + kRecoveryRetryInterval.initial - absl::Now());
    }
  } else {
    ExponentialBackoff(kRecoveryRetryInterval).Wait();
    update = ps->RefreshShardMap();
  }
  // The scheduler may be restarting: try again until give_up_at.
  // (A re-admitted worker's refresh also fails while the servers install the map that
  // takes it back: they do not know its new credential yet.)
  if (!update.ok()) return ShardMapUpdate{};
  if (!update->self_active) {
    // Declared dead (it was stopped or cut off past the failure timeout): the heartbeats
    // register it again, and a later map takes it back.
    if (first_failure) {
      spdlog::warn(
          "step {}: the scheduler declared this worker dead (silent too long); "
          "waiting to be admitted again",
          step);
    }
    return ShardMapUpdate{};
  }
  if (!curable && !update->epoch_changed && !update->rejoined) return failure;
  if (update->rejoined) {
    spdlog::info(
        "epoch {}: admitted again after being declared dead; continuing at step {} "
        "(from step {})",
        update->epoch, *update->rewind_to, step);
  } else if (update->epoch_changed && update->rewind_to.has_value()) {
    spdlog::warn("epoch {}: the servers rolled back to step {}; rewinding from step {}",
                 update->epoch, *update->rewind_to, step);
  } else if (update->epoch_changed) {
    spdlog::info("epoch {}: the shard map changed; continuing at step {}", update->epoch, step);
  }
  return update;
}

}  // namespace paramserver
