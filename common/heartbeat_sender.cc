#include "common/heartbeat_sender.h"

#include "spdlog/spdlog.h"

namespace paramserver {

HeartbeatSender::HeartbeatSender(SchedulerClient* scheduler, std::string node_name,
                                 absl::Duration interval, std::function<HeartbeatRequest()> make_request,
                                 std::function<void(const HeartbeatResponse&)> on_response,
                                 std::function<void(const absl::Status&)> on_refused)
    : scheduler_(scheduler),
      node_name_(std::move(node_name)),
      interval_(interval),
      make_request_(std::move(make_request)),
      on_response_(std::move(on_response)),
      on_refused_(std::move(on_refused)),
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
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_)) return;
    }
    HeartbeatRequest request = make_request_();
    request.set_node_name(node_name_);
    absl::StatusOr<HeartbeatResponse> response = scheduler_->Heartbeat(request);
    if (response.ok()) {
      on_response_(*response);
    } else if (on_refused_ && response.status().code() == absl::StatusCode::kFailedPrecondition) {
      on_refused_(response.status());
    } else if (absl::Now() - last_failure_log > quiet_period) {
      spdlog::warn("heartbeat failed (will keep trying): {}", response.status().ToString());
      last_failure_log = absl::Now();
    }
  }
}

}  // namespace paramserver
