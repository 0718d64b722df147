// The test itself as the job's last worker: a member holding the cluster token that
// registers once the launched workers have, heartbeats as itself like any worker, and
// waits for the cluster to form. The security tests attack the job from here.
#ifndef PARAMSERVER_TESTS_JOINED_MEMBER_H_
#define PARAMSERVER_TESTS_JOINED_MEMBER_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/rpc/heartbeat_sender.h"
#include "common/rpc/scheduler_client.h"
#include "common/security/peer_credentials.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

struct JoinedMember {
  std::shared_ptr<CallCredentials> credentials;  // the cluster token and, once in, its own
  std::unique_ptr<SchedulerClient> scheduler;
  RegisterResponse registration;  // its name and rank
  std::unique_ptr<HeartbeatSender> heartbeats;
  ClusterView view;  // the formed cluster's
};

// Waits (60 s at most) until `workers_before` workers registered at the scheduler at
// `scheduler_address`, then registers as a worker with `cluster_token` (as rank
// `workers_before`), heartbeats every `heartbeat_interval` and waits for the cluster
// to form. Fails the test (Catch2 REQUIRE) when any of it does not happen in time.
std::unique_ptr<JoinedMember> JoinAsLastWorker(const std::string& scheduler_address,
                                               const std::string& cluster_token, int workers_before,
                                               absl::Duration heartbeat_interval);

}  // namespace paramserver

#endif  // PARAMSERVER_TESTS_JOINED_MEMBER_H_
