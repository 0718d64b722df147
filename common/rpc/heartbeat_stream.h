// One node's heartbeats to the scheduler as the messages of one long call
// (Scheduler.HeartbeatStream): the call, its HTTP/2 stream and its deadline timer are
// paid once, not once a beat.
#ifndef PARAMSERVER_COMMON_RPC_HEARTBEAT_STREAM_H_
#define PARAMSERVER_COMMON_RPC_HEARTBEAT_STREAM_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/scheduler.grpc.pb.h"

namespace paramserver {

// Thread-compatible: one Beat at a time (a node's heartbeat thread). The stream opens
// at the first Beat and again at the first Beat after it ended (an error, a refusal, a
// beat unanswered in time, or its age past `stream_lifetime`: the call's deadline is
// a little later, so no beat meets it), or within a Beat whose open stream broke.
class HeartbeatStream {
 public:
  // `stub` (not owned) outlives this. `what` names the calls in errors ("heartbeat to
  // ADDRESS").
  HeartbeatStream(Scheduler::Stub* stub, absl::Duration beat_timeout, std::string what,
                  absl::Duration stream_lifetime = kStreamLifetime);
  // Close().
  ~HeartbeatStream();
  HeartbeatStream(const HeartbeatStream&) = delete;
  HeartbeatStream& operator=(const HeartbeatStream&) = delete;

  // Sends `request` and returns the scheduler's answer, or an error within
  // beat_timeout: the scheduler's refusal (which ended the stream) as Heartbeat's
  // would be, UNAVAILABLE for a stream that broke (one that broke while idle is
  // replaced and the beat sent again, in the same time), DEADLINE_EXCEEDED for a beat
  // not answered in time (the stream is cancelled). UNIMPLEMENTED: the scheduler serves no
  // heartbeat streams (a build older than them); the caller uses Heartbeat then.
  absl::StatusOr<HeartbeatResponse> Beat(const HeartbeatRequest& request);

  // Whether a stream is open now (tests).
  bool open() const { return call_ != nullptr; }
  // Cancels the open stream, if any, and waits (at most beat_timeout) for it to end; the
  // next Beat opens another.
  void Close();

  static constexpr absl::Duration kStreamLifetime = absl::Minutes(30);

 private:
  class Call;

  // One try of Beat on the open stream (opened first if none), by `deadline`.
  absl::StatusOr<HeartbeatResponse> BeatOnStream(const HeartbeatRequest& request,
                                                 absl::Time deadline);

  Scheduler::Stub* const stub_;
  const absl::Duration beat_timeout_;
  const std::string what_;
  const absl::Duration stream_lifetime_;
  std::unique_ptr<Call> call_;  // the open stream, if any
  absl::Time opened_at_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_RPC_HEARTBEAT_STREAM_H_
