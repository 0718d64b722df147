#include "common/rpc/cluster_membership.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/ops/logging.h"
#include "spdlog/spdlog.h"

namespace paramserver {

absl::StatusOr<std::unique_ptr<ClusterMembership>> ClusterMembership::Join(
    MembershipOptions options, absl::Time deadline) {
  auto scheduler = std::make_unique<SchedulerClient>(options.scheduler_address, options.rpc_timeout,
                                                     options.credentials);
  PS_ASSIGN_OR_RETURN(RegisterResponse registered,
                      scheduler->Register(options.role, options.advertised_address, deadline));
  spdlog::info(
      "registered with the scheduler at {}; serving on {}{}; this node's lines are tagged [{}] "
      "from here on",
      options.scheduler_address, options.advertised_address,
      options.role == NODE_ROLE_WORKER ? absl::StrCat(" as rank ", registered.rank()) : "",
      registered.node_name());
  SetLogNodeName(registered.node_name());
  return std::unique_ptr<ClusterMembership>(
      new ClusterMembership(std::move(options), std::move(scheduler), std::move(registered)));
}

ClusterMembership::ClusterMembership(MembershipOptions options,
                                     std::unique_ptr<SchedulerClient> scheduler,
                                     RegisterResponse registration)
    : options_(std::move(options)),
      scheduler_(std::move(scheduler)),
      registration_(std::move(registration)) {}

ClusterMembership::~ClusterMembership() {
  spot_watcher_.reset();
  heartbeats_.reset();
}

absl::StatusOr<RegisterResponse> ClusterMembership::Rejoin(absl::Time deadline,
                                                           std::string* other_name) {
  PS_ASSIGN_OR_RETURN(RegisterResponse registered,
                      scheduler_->Register(options_.role, options_.advertised_address, deadline));
  if (registered.node_name() != node_name()) {
    if (other_name != nullptr) *other_name = registered.node_name();
    return absl::FailedPreconditionError(absl::StrCat("the scheduler gave this node another name, ",
                                                      registered.node_name(), ", in place of ",
                                                      node_name()));
  }
  return registered;
}

void ClusterMembership::StartHeartbeats(HeartbeatHandlers handlers) {
  heartbeats_ = std::make_unique<HeartbeatSender>(
      scheduler_.get(), node_name(), options_.heartbeat_interval, std::move(handlers.make_request),
      std::move(handlers.on_response), std::move(handlers.on_refused), std::move(handlers.outage));
}

void ClusterMembership::StopHeartbeats() {
  heartbeats_.reset();
  scheduler_->CloseHeartbeatStream();
}

void ClusterMembership::WatchSpotInterruptions(
    const std::string& imds_endpoint, absl::Duration poll_interval,
    std::function<void(const absl::Status& left)> on_left) {
  spot_watcher_ = std::make_unique<SpotInterruptionWatcher>(
      InstanceMetadataClient(imds_endpoint), poll_interval,
      [this, on_left = std::move(on_left)](const std::string& notice) {
        const absl::StatusOr<LeaveResponse> left =
            scheduler_->Leave(node_name(), "spot interruption: " + notice);
        on_left(left.status());
      });
}

}  // namespace paramserver
