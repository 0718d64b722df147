#include "common/rpc/heartbeat_stream.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/rpc_endpoints.h"  // kCancelledCallEnd
#include "common/rpc/rpc_status.h"

namespace paramserver {

// The stream's reactor. Its owner (HeartbeatStream, one thread) starts the reads and
// writes, so the call holds one hold from its start until End: gRPC calls OnDone only
// after it, once every read and write has completed. The owner frees the call, on its
// own thread, once OnDone has run: the call's last references to gRPC (its context,
// and through it the call and the channel) go there, before the owner goes on, and not
// on a gRPC thread after it (a channel, a completion queue or gRPC itself ended on
// gRPC's thread while the owner's thread goes on to start or stop others). Only a call
// still not done a while after End cancelled it is left to free itself at OnDone.
class HeartbeatStream::Call final
    : public grpc::ClientBidiReactor<HeartbeatRequest, HeartbeatResponse> {
 public:
  enum class Outcome { kAnswered, kEnded, kLate };

  static std::unique_ptr<Call> Start(Scheduler::Stub* stub, absl::Time deadline) {
    std::unique_ptr<Call> call(new Call());
    call->context_.set_deadline(absl::ToChronoTime(deadline));
    stub->async()->HeartbeatStream(&call->context_, call.get());
    call->AddHold();
    call->StartCall();
    return call;
  }

  // One beat: writes `request` and reads its answer into *answer. kEnded: the stream
  // ended (its status is End's); kLate: no answer by `deadline`.
  Outcome Exchange(const HeartbeatRequest& request, absl::Time deadline, HeartbeatResponse* answer)
      ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      // The last beat's write may complete after its answer was read.
      auto writable = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return read_failed_ || !write_pending_;
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&writable), deadline)) return Outcome::kLate;
      if (read_failed_) return Outcome::kEnded;
      request_ = request;
      write_pending_ = true;
      answered_ = false;
    }
    StartWrite(&request_);
    StartRead(&response_);
    absl::MutexLock lock(&mu_);
    auto settled = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return answered_ || read_failed_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) return Outcome::kLate;
    if (!answered_) return Outcome::kEnded;
    *answer = std::move(response_);
    return Outcome::kAnswered;
  }

  // Ends `call`: cancelled first with `cancel` (a beat not answered in time, a stream
  // closed by this side), else it ended by itself; no read or write after. Returns its
  // status, and frees it, once gRPC is done with it. Not done by `deadline`: it is
  // cancelled, UNAVAILABLE is returned, and the call is freed once it ends (here, if
  // within kCancelledCallEnd; else at its OnDone, on gRPC's thread).
  static grpc::Status End(std::unique_ptr<Call> call, bool cancel, absl::Time deadline) {
    if (cancel) call->context_.TryCancel();
    call->RemoveHold();
    {
      absl::MutexLock lock(&call->mu_);
      if (call->mu_.AwaitWithDeadline(absl::Condition(&call->done_), deadline)) {
        return call->status_;
      }
    }
    // A read failed on a call still open (an answer that did not parse): no status is
    // coming soon, and the call would stay open until its deadline.
    call->context_.TryCancel();
    absl::MutexLock lock(&call->mu_);
    if (!call->mu_.AwaitWithTimeout(absl::Condition(&call->done_), kCancelledCallEnd)) {
      call->orphaned_ = true;
      call.release();  // OnDone frees it
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the heartbeat stream did not end in time");
  }

  void OnWriteDone(bool /*ok: a failed write fails the read too*/) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    write_pending_ = false;
  }
  void OnReadDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    (ok ? answered_ : read_failed_) = true;
  }
  void OnDone(const grpc::Status& status) override ABSL_LOCKS_EXCLUDED(mu_) {
    bool orphaned;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      status_ = status;
      orphaned = orphaned_;
    }
    // Not orphaned: the owner may free the call from here on; nothing here touches it.
    if (orphaned) delete this;
  }

 private:
  Call() = default;

  grpc::ClientContext context_;
  HeartbeatRequest request_;
  HeartbeatResponse response_;
  absl::Mutex mu_;
  bool write_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  bool read_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool orphaned_ ABSL_GUARDED_BY(mu_) = false;  // its owner let it go before OnDone
};

HeartbeatStream::HeartbeatStream(Scheduler::Stub* stub, absl::Duration beat_timeout,
                                 std::string what, absl::Duration stream_lifetime)
    : stub_(stub),
      beat_timeout_(beat_timeout),
      what_(std::move(what)),
      stream_lifetime_(stream_lifetime) {}

HeartbeatStream::~HeartbeatStream() { Close(); }

void HeartbeatStream::Close() {
  if (call_ == nullptr) return;
  Call::End(std::move(call_), /*cancel=*/true, absl::Now() + beat_timeout_);
}

absl::StatusOr<HeartbeatResponse> HeartbeatStream::Beat(const HeartbeatRequest& request) {
  if (call_ != nullptr && absl::Now() - opened_at_ >= stream_lifetime_) Close();
  const absl::Time deadline = absl::Now() + beat_timeout_;
  const bool stream_was_open = call_ != nullptr;
  absl::StatusOr<HeartbeatResponse> answer = BeatOnStream(request, deadline);
  // A stream that broke while it was idle (the scheduler restarted, the connection was
  // lost) fails the first beat sent on it, though the scheduler may be there again: the
  // beat goes once more, on a new stream, in what is left of its time (as a call a beat
  // would have connected anew). Not a refusal, nor a beat not answered in time. A beat
  // whose stream broke after the scheduler took it is taken twice: harmless, as a
  // heartbeat's figures are absolute (the registry keeps the newest).
  const bool broken = absl::IsUnavailable(answer.status()) ||
                      absl::IsCancelled(answer.status());  // reset by the peer, not here
  if (stream_was_open && broken && absl::Now() < deadline) {
    answer = BeatOnStream(request, deadline);
  }
  return answer;
}

absl::StatusOr<HeartbeatResponse> HeartbeatStream::BeatOnStream(const HeartbeatRequest& request,
                                                                absl::Time deadline) {
  if (call_ == nullptr) {
    opened_at_ = absl::Now();
    // Past the last beat it may carry (one starting just before stream_lifetime).
    call_ = Call::Start(stub_, opened_at_ + stream_lifetime_ + 2 * beat_timeout_);
  }
  HeartbeatResponse answer;
  const Call::Outcome outcome = call_->Exchange(request, deadline, &answer);
  if (outcome == Call::Outcome::kAnswered) return answer;
  const bool late = outcome == Call::Outcome::kLate;
  // The stream's end and its status within the beat's time (what is left of it, and
  // a little for a refusal already on its way).
  const grpc::Status ended = Call::End(std::move(call_), /*cancel=*/late,
                                       std::max(deadline, absl::Now() + absl::Milliseconds(100)));
  if (late) {
    return absl::DeadlineExceededError(
        absl::StrCat(what_, ": no answer within ", absl::FormatDuration(beat_timeout_)));
  }
  // A stream the scheduler ended without a refusal (it cannot, but a peer could) is
  // no answer either.
  if (ended.ok()) return absl::UnavailableError(absl::StrCat(what_, ": the stream ended"));
  return RpcError(ended, what_);
}

}  // namespace paramserver
