#include "common/rpc/heartbeat_sender.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace paramserver {

HeartbeatSender::HeartbeatSender(SchedulerClient* scheduler, std::string node_name,
                                 absl::Duration interval,
                                 std::function<HeartbeatRequest()> make_request,
                                 std::function<void(const HeartbeatResponse&)> on_response,
                                 std::function<void(const absl::Status&)> on_refused,
                                 SchedulerOutagePolicy outage)
    : scheduler_(scheduler),
      node_name_(std::move(node_name)),
      interval_(interval),
      make_request_(std::move(make_request)),
      on_response_(std::move(on_response)),
      on_refused_(std::move(on_refused)),
      outage_(std::move(outage)),
      thread_([this] { Loop(); }) {}

HeartbeatSender::~HeartbeatSender() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void HeartbeatSender::Loop() {
  absl::Time last_failure_log = absl::InfinitePast();
  const absl::Duration quiet_period = absl::Seconds(5);
  absl::Time last_answer = absl::Now();
  bool outage_reported = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_)) return;
    }
    HeartbeatRequest request = make_request_();
    request.set_node_name(node_name_);
    absl::StatusOr<HeartbeatResponse> response = scheduler_->Heartbeat(request);
    const bool answered =
        response.ok() || response.status().code() == absl::StatusCode::kFailedPrecondition;
    if (answered) {
      const absl::Duration unanswered = absl::Now() - last_answer;
      if (unanswered > 2 * quiet_period) {
        spdlog::info("the scheduler at {} answers again, after {} s",
                     scheduler_->scheduler_address(), absl::ToInt64Seconds(unanswered));
      }
      last_answer = absl::Now();
    }
    if (response.ok()) {
      on_response_(*response);
    } else if (on_refused_ && response.status().code() == absl::StatusCode::kFailedPrecondition) {
      on_refused_(response.status());
    } else if (!answered && !outage_reported && outage_.on_exceeded &&
               absl::Now() - last_answer >= outage_.limit) {
      outage_reported = true;
      outage_.on_exceeded(absl::UnavailableError(
          absl::StrCat("the scheduler at ", scheduler_->scheduler_address(),
                       " has not answered for ", absl::ToInt64Seconds(absl::Now() - last_answer),
                       " s (this node's limit: ", absl::ToInt64Seconds(outage_.limit),
                       " s, from cluster.recovery_timeout_ms); the last error: ",
                       response.status().ToString())));
    } else if (absl::Now() - last_failure_log > quiet_period) {
      spdlog::warn(
          "heartbeat failed (will keep trying{}): {}",
          outage_.limit == absl::InfiniteDuration()
              ? ""
              : absl::StrCat(" for up to ", absl::ToInt64Seconds(outage_.limit), " s in all"),
          response.status().ToString());
      last_failure_log = absl::Now();
    }
  }
}

}  // namespace paramserver
