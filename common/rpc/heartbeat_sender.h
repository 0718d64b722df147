// A background thread that heartbeats to the scheduler at a fixed interval.
#ifndef PARAMSERVER_COMMON_RPC_HEARTBEAT_SENDER_H_
#define PARAMSERVER_COMMON_RPC_HEARTBEAT_SENDER_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/scheduler_client.h"

namespace paramserver {

// What a node does when the scheduler stops answering: after `limit` without an answer
// (an outage of any length up to it is ridden out), `on_exceeded` is called once, on
// the sender's thread, with an UNAVAILABLE status that says for how long and why.
struct SchedulerOutagePolicy {
  absl::Duration limit = absl::InfiniteDuration();
  std::function<void(const absl::Status&)> on_exceeded;
};

// Thread-safe. Sends make_request() (with node_name set) every `interval` and hands
// each answer to `on_response` (called on the sender's thread, no lock held). A
// FAILED_PRECONDITION answer (this node was declared dead) goes to `on_refused` if set;
// other failures are logged at most once per 5 s and retried at the next beat, until
// the outage policy's limit.
class HeartbeatSender {
 public:
  HeartbeatSender(SchedulerClient* scheduler, std::string node_name, absl::Duration interval,
                  std::function<HeartbeatRequest()> make_request,
                  std::function<void(const HeartbeatResponse&)> on_response,
                  std::function<void(const absl::Status&)> on_refused = nullptr,
                  SchedulerOutagePolicy outage = {});
  // Stops the thread; blocks for at most one heartbeat RPC timeout.
  ~HeartbeatSender();

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  SchedulerClient* const scheduler_;
  const std::string node_name_;
  const absl::Duration interval_;
  const std::function<HeartbeatRequest()> make_request_;
  const std::function<void(const HeartbeatResponse&)> on_response_;
  const std::function<void(const absl::Status&)> on_refused_;
  const SchedulerOutagePolicy outage_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_RPC_HEARTBEAT_SENDER_H_
