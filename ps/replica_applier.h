// A backup server's appliers: the threads that apply the log entries its backup shards
// received (ParameterShard::ReceiveLogEntries), so that a Replicate call is answered on
// receipt and the apply runs off the acknowledgement's path.
#ifndef PARAMSERVER_PS_REPLICA_APPLIER_H_
#define PARAMSERVER_PS_REPLICA_APPLIER_H_

#include <deque>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/parameter_shard.h"

namespace paramserver {

// Thread-safe. Applies each scheduled shard's received entries on one of its threads;
// a shard is queued at most once at a time, and one apply covers every entry it holds
// then (ParameterShard::ApplyReceived applies them in order, under the shard's lock).
class ReplicaApplier {
 public:
  // `threads` >= 1 appliers. `hold` (tests: a window in which a backup holds entries
  // received and not applied) makes each entry wait at least that long after its
  // receipt; zero in production.
  explicit ReplicaApplier(int threads, absl::Duration hold = absl::ZeroDuration());
  // Stops the threads once the apply in progress (if any) ends (a hold's wait is cut
  // short). Entries still queued are
  // not applied: their shards apply them when they change role (SetLogSink).
  ~ReplicaApplier();
  ReplicaApplier(const ReplicaApplier&) = delete;
  ReplicaApplier& operator=(const ReplicaApplier&) = delete;

  // Applies `shard`'s received entries soon. Holds only a weak reference: a shard
  // dropped meanwhile is skipped.
  void Schedule(const std::shared_ptr<ParameterShard>& shard) ABSL_LOCKS_EXCLUDED(mu_);

  // The number of threads for a server: one per two cores, 1 to 4.
  static int DefaultThreads();

 private:
  struct Scheduled {
    std::weak_ptr<ParameterShard> shard;
    absl::Time due;
  };
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration hold_;
  absl::Mutex mu_;
  std::deque<Scheduled> queue_ ABSL_GUARDED_BY(mu_);
  // By owner, not address: a shard freed while queued and another made at its address
  // are two.
  std::set<std::weak_ptr<ParameterShard>, std::owner_less<std::weak_ptr<ParameterShard>>> queued_
      ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_REPLICA_APPLIER_H_
